"""The Google TPU platform for Octavo (JAX model runner, Pallas kernels)."""
