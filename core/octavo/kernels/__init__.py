"""Native kernels of the portable CPU backend."""
