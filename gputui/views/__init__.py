"""Rich renderers for the command line: a run's progress lines (`progress`), telemetry tables
(`telemetry`), and the cloud, cost and sweep tables (`cloud`).

They take model objects and print; Textual lives in gputui.ui alone.
"""
