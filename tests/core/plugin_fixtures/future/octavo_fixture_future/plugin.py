"""A plugin for a future core: it must be skipped before it is even imported."""

raise AssertionError("the core imported a plugin whose declared version range excludes it")
