"""Subcommands of `gputui` other than `run`, one module each (see cli.COMMAND_MODULES)."""
