"""Where GPU readings come from: one `Source` protocol; NVML, SSH, simulated and replayed sources.

Nothing here draws anything; callers get frozen `HostSnapshot`s (gputui.model.telemetry).
"""
