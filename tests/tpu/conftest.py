"""JAX on the CPU for the TPU plugin's tests: the Pallas kernels run there in TPU interpret
mode, and the lowering tests export for TPU without needing one. Set before jax is imported
(JAX reads JAX_PLATFORMS when it initialises its backends); a caller's own choice wins."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
