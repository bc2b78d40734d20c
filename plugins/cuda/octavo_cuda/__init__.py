"""The NVIDIA CUDA platform for Octavo."""
