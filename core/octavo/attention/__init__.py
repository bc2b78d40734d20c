"""Attention: the ``AttentionBackend`` interface and its metadata; the portable PyTorch
paged-attention backend lives in ``octavo.attention.torch_backend``."""

from octavo.attention.base import AttentionBackend, AttentionImpl, AttentionMetadata

__all__ = ["AttentionBackend", "AttentionImpl", "AttentionMetadata"]
