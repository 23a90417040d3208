"""What a command does, without its argument parsing: `run` (gputui run), `bench`, `doctor`."""
