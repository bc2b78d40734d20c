"""The ``Platform`` interface (``Platform``, ``Availability``). Implementations live with
their kernels: the built-in CPU platform in ``octavo.cpu``, the others in plugins. Turning
``--backend NAME`` into a platform class is the plugin system's job
(``octavo.plugins.resolve``). Imports nothing of the core, and torch only for annotations."""

from octavo.platforms.base import Availability, Platform

__all__ = ["Availability", "Platform"]
