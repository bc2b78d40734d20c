"""Octavo: an LLM inference and serving engine - minimal core plus plugins."""

from octavo.version import __version__

__all__ = ["__version__"]
