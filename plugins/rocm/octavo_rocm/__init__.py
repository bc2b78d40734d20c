"""The AMD ROCm platform for Octavo."""
