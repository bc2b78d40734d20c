"""Hardware platforms: the ``Platform`` interface, the built-in CPU platform and backend
resolution for ``--backend``."""

from octavo.platforms.base import Availability, Platform
from octavo.platforms.resolve import BACKEND_CHOICES, BackendError, resolve_platform

__all__ = ["BACKEND_CHOICES", "Availability", "BackendError", "Platform", "resolve_platform"]
