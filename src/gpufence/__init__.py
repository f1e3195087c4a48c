"""gpufence: a GPU cluster scheduler that fences training, serving, interactive and batch work."""

__version__ = "0.1.0"
