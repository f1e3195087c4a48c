"""gpufence control plane: turns scheduler decisions into running processes."""
