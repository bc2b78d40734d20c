"""A plugin whose hook registers one platform and then raises: nothing of it may stay."""

from octavo.cpu.platform import CpuPlatform
from octavo.plugins import hookimpl

# The plugin API range this plugin is written for (see octavo.plugin_api).
OCTAVO_PLUGIN_API = ">=1.0,<2"


class HalfPlatform(CpuPlatform):
    name = "half"


@hookimpl
def octavo_register_platforms(registry):
    registry.register("half", HalfPlatform)
    raise ValueError("badhook fails half-way through registration")
