"""Held-back text: while a reply streams, the end of it that could still grow into a marker
(``<tool_call>``, ``</think>``) is not shown yet, so no client sees half a marker as text."""

from __future__ import annotations

from collections.abc import Iterable


def held_back(text: str, markers: Iterable[str]) -> int:
    """How many characters at the end of ``text`` could begin one of ``markers``."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest
