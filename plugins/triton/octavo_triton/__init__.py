"""Triton kernels shared by Octavo's GPU backends, and the GPU platform base class that
the CUDA and ROCm platforms build on."""
