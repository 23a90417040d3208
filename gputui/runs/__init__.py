"""Runs: a run's directory (`store`), its history and summaries, one run in detail (`detail`),
its output's last lines (`output`), its curves and their export.

Below every job that starts or reads a run; imports only gputui.model, gputui.config and
(for the cost column) gputui.cloud's ledger.
"""
