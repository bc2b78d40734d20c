"""Named registries that the registration hooks fill.

Each registry maps a user-facing name (``"cpu"``, ``"fcfs"``, ``"LlamaForCausalLM"``) to
the object a plugin provides, and remembers which plugin provided it so that conflicts
and ``octavo plugins`` can name the owner.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(LookupError):
    """A name was registered twice, or looked up but never registered."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    plugin: str


class Registry(Generic[T]):
    """An ordered name -> object map for one kind of extension (platforms, models, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}
        # Set by the plugin host while it calls one plugin's hook, so entries know their owner.
        self.current_plugin = "<unknown>"

    def register(self, name: str, obj: T, *, override: bool = False) -> None:
        """Add ``obj`` under ``name``; replacing another plugin's entry needs ``override=True``."""
        old = self._entries.get(name)
        if old is not None and not override:
            raise RegistryError(
                f"{self.kind} {name!r} is already registered by plugin {old.plugin!r}; "
                f"plugin {self.current_plugin!r} must pass override=True to replace it"
            )
        self._entries[name] = Entry(name, obj, self.current_plugin)

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def entry(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "none"
            raise RegistryError(f"unknown {self.kind} {name!r}; registered: {known}") from None

    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        return iter(self._entries.values())

    def snapshot(self) -> dict[str, Entry[T]]:
        """A copy of the entries, to roll back a plugin whose hook failed half-way."""
        return dict(self._entries)

    def restore(self, snapshot: dict[str, Entry[T]]) -> None:
        self._entries = dict(snapshot)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)
