"""gputui: train deep networks on GPUs wherever they are, from one terminal app."""

__version__ = "0.1.0"
