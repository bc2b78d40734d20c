"""A plugin whose import fails: the core must skip it and keep working."""

# The plugin API range this plugin is written for (see octavo.plugin_api).
OCTAVO_PLUGIN_API = ">=1.0,<2"

raise RuntimeError("octavo-fixture-broken is deliberately broken")
