"""Building blocks of the models, written for inference: fused projections that load from
HF's separate weights, tensor-parallel aware shapes, and paged attention through a backend.
A platform may switch them onto its kernels (``switch``); they import attention and torch."""
