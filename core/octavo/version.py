"""The core's version, read from the installed distribution so there is one source of truth."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("octavo")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
