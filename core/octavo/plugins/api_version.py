"""``PLUGIN_API_VERSION``: the version of ``octavo.plugin_api``, the names plugins import.

It moves on its own, not with the core's version: a minor step (1.0 -> 1.1) only adds
names (a name that goes keeps working, with a ``DeprecationWarning``, for one more minor
release); a major step (1.x -> 2.0) may remove or change them. A plugin's entry-point module
declares the range it is written for, ``OCTAVO_PLUGIN_API = ">=1.0,<2"``, and a plugin whose
range excludes this version is skipped with a message naming both. The declaration is read
from the module's source before it is imported, so an incompatible plugin is named, not
crashed into.
"""

from __future__ import annotations

import ast
import importlib.util

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

PLUGIN_API_VERSION = "1.4"
DECLARATION = "OCTAVO_PLUGIN_API"


def declared_range(module_name: str) -> str | None:
    """The ``OCTAVO_PLUGIN_API = "..."`` string at the top level of ``module_name``'s
    source, without importing the module itself; None when there is none."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "get_source"):
        return None
    source = spec.loader.get_source(module_name)
    if source is None:
        return None
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == DECLARATION
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    return None


def api_version_problem(module_name: str, api_version: str = PLUGIN_API_VERSION) -> str:
    """Why the plugin module ``module_name`` cannot load on this plugin API, or ``""``."""
    try:
        declared = declared_range(module_name)
    except (ImportError, SyntaxError, ValueError) as exc:
        return f"cannot read {module_name}: {type(exc).__name__}: {exc}"
    if declared is None:
        return (f"{module_name} declares no plugin API range; add e.g. "
                f'{DECLARATION} = ">=1.0,<2" (this core provides plugin API {api_version})')
    try:
        supported = SpecifierSet(declared)
    except InvalidSpecifier:
        return f"{module_name}: {DECLARATION} = {declared!r} is not a version range"
    if not supported.contains(Version(api_version), prereleases=True):
        return (f"written for plugin API {declared} but this core provides plugin API "
                f"{api_version}; install a version of the plugin built for it")
    return ""
