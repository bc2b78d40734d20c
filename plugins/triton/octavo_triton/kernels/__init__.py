"""The Triton kernels and the Python functions that launch them.

Each module holds one kernel family and a launcher that takes torch tensors, checks
them and picks the launch parameters (from :mod:`octavo_triton.tuning`). The launchers
are what the attention backend and the Triton model layers call; the ``*_kernel``
functions are what the ahead-of-time compile test builds for each GPU target.
"""
