"""Named registries that the registration hooks fill.

Each registry maps a user-facing name (``"cpu"``, ``"fcfs"``, ``"LlamaForCausalLM"``) to
the object a plugin provides, and remembers which plugin provided it so that conflicts,
``octavo plugins`` and ``OCTAVO_TRACE_PLUGINS=1`` can name the owner, and so that a plugin
whose hook fails can be taken out again (:meth:`Registry.drop_plugin`).
"""

from __future__ import annotations

import sys
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
    replaced: Entry[T] | None = None  # the entry this one overrode


class Registry(Generic[T]):
    """An ordered name -> object map for one kind of extension (platforms, models, ...)."""

    def __init__(self, kind: str, trace: bool = False) -> None:
        self.kind = kind
        self.trace = trace  # print each registration to stderr (OCTAVO_TRACE_PLUGINS=1)
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
        self._entries[name] = Entry(name, obj, self.current_plugin, old)
        if self.trace:
            print(f"octavo plugins: {self.current_plugin} registered {self.kind} {name!r}"
                  + (f" (overriding {old.plugin})" if old else ""), file=sys.stderr)

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

    def as_dict(self) -> dict[str, T]:
        """A plain ``name -> object`` copy, for code below the plugin system."""
        return {name: entry.obj for name, entry in self._entries.items()}

    def drop_plugin(self, plugin: str) -> None:
        """Take out everything ``plugin`` registered, putting back what it overrode."""
        for name, top in list(self._entries.items()):
            chain: list[Entry[T]] = []
            entry: Entry[T] | None = top
            while entry is not None:
                chain.append(entry)
                entry = entry.replaced
            rebuilt: Entry[T] | None = None
            for kept in reversed([e for e in chain if e.plugin != plugin]):
                rebuilt = Entry(kept.name, kept.obj, kept.plugin, rebuilt)
            if rebuilt is None:
                del self._entries[name]
            else:
                self._entries[name] = rebuilt

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)
