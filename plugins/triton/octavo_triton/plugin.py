"""Entry point of octavo-triton. The kernels register no platform of their own: the CUDA and
ROCm plugins use them. (Attention-backend registration arrives with the kernels.)"""
