"""A plugin for a future core: it must be skipped before it is even imported."""

# The plugin API range this plugin is written for (see octavo.plugin_api).
OCTAVO_PLUGIN_API = ">=1.0,<2"

raise AssertionError("the core imported a plugin whose declared version range excludes it")
