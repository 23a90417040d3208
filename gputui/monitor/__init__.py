"""Watching GPUs and runs: telemetry polling, `gputui monitor`'s watches, alerts, the exporter, the process table.

No UI here: the dashboard and the commands draw what these modules return.
"""
