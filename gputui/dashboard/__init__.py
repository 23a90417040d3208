"""What the dashboard drives, without Textual: the training child, the telemetry feed,
the slaves and their cost. gputui.ui draws the frozen frames these produce.
"""
