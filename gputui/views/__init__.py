"""Rich renderers for the command line: the progress lines of a run (`progress`) and telemetry tables (`telemetry`).

They take model objects and print; Textual lives in gputui.ui alone.
"""
