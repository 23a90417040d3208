"""The data model: frozen snapshot dataclasses and pure maths, no I/O and no UI.

One module per domain (telemetry, cloud, ...), so the UI can draw any of them and the
sources that produce them stay independent.
"""
