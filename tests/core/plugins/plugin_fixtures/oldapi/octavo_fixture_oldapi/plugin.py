"""Declares a plugin API range that excludes the core's: it must be skipped, with both
versions named, before it is even imported."""

OCTAVO_PLUGIN_API = ">=0.1,<1"

raise AssertionError("the core imported a plugin whose plugin API range excludes it")
