"""Attention: the ``AttentionBackend`` interface and its metadata, and the portable PyTorch
paged-attention backend (``torch_backend``), which the CPU backend specialises. Imports the
plain data and config layers and torch only."""

from octavo.attention.base import AttentionBackend, AttentionImpl, AttentionMetadata

__all__ = ["AttentionBackend", "AttentionImpl", "AttentionMetadata"]
