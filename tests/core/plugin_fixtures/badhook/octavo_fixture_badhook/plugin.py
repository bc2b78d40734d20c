"""A plugin whose hook registers one platform and then raises: nothing of it may stay."""

from octavo.platforms.cpu import CpuPlatform
from octavo.plugins import hookimpl


class HalfPlatform(CpuPlatform):
    name = "half"


@hookimpl
def octavo_register_platforms(registry):
    registry.register("half", HalfPlatform)
    raise ValueError("badhook fails half-way through registration")
