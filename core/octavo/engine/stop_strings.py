"""``StopStrings``: a request's stop strings as an Aho–Corasick automaton, so that finding
them in new text costs the same whatever their number.

Why: the text of every new token was searched once per stop string, on the event loop;
600,000 stop strings with ``n=8`` stalled ``/health`` for 6-7 s (issue 54). The automaton
is built once per request, on a processing thread, and shared by the request's ``n``
sequences; each sequence keeps only its state (an int) and feeds it each new piece of text,
one dictionary step per character (amortised, following failure links).

The match reported is the stop string whose occurrence ends first in the text; of those
ending at the same character, the longest. That is the first stop a reader of the text,
character by character, would see, whatever the tokens' boundaries
(tests/core/engine/test_stop_strings.py compares it with a naive search on random text).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

ROOT = 0  # the automaton's start state: nothing of any stop string seen


@dataclass(frozen=True)
class StopHit:
    end: int  # the index just past the stop string's last character, in the text fed
    stop: str


class StopStrings:
    """The automaton over ``stops`` (empty strings ignored). Immutable once built."""

    def __init__(self, stops: Iterable[str]) -> None:
        self._goto: list[dict[str, int]] = [{}]
        self._found: list[str | None] = [None]  # per state: the longest stop it ends with
        self._fail: list[int] = [ROOT]
        self.max_len = 0
        for stop in dict.fromkeys(stop for stop in stops if stop):
            self._insert(stop)
            self.max_len = max(self.max_len, len(stop))
        self._link()

    def __bool__(self) -> bool:
        return self.max_len > 0

    def _insert(self, stop: str) -> None:
        state = ROOT
        for char in stop:
            following = self._goto[state].get(char)
            if following is None:
                following = len(self._goto)
                self._goto[state][char] = following
                self._goto.append({})
                self._found.append(None)
            state = following
        self._found[state] = stop

    def _link(self) -> None:
        """Failure links, breadth first: each state's longest proper suffix that is also a
        state; a state that ends no stop itself inherits its suffix's stop."""
        self._fail = [ROOT] * len(self._goto)
        queue = deque(self._goto[ROOT].values())
        while queue:
            state = queue.popleft()
            for char, following in self._goto[state].items():
                self._fail[following] = self._step(self._fail[state], char)
                if self._found[following] is None:
                    self._found[following] = self._found[self._fail[following]]
                queue.append(following)

    def _step(self, state: int, char: str) -> int:
        while state != ROOT and char not in self._goto[state]:
            state = self._fail[state]
        return self._goto[state].get(char, ROOT)

    def scan(self, state: int, text: str) -> tuple[int, StopHit | None]:
        """Feed ``text`` from ``state``: the state after it, and the first stop that ends
        in it (the state is then the one at that stop's end)."""
        for index, char in enumerate(text):
            state = self._step(state, char)
            stop = self._found[state]
            if stop is not None:
                return state, StopHit(index + 1, stop)
        return state, None
