"""``StallWatch``: which engine cores have work but have stopped stepping.

An engine core reports after every step that has news, and at least once a second while it
has work (``core_proc.HEARTBEAT_S``). One that has work and has said nothing for longer
than the stall timeout is stalled: stopped (SIGSTOP), stuck in a step, or starved of CPU.
A core that is merely slow is not: a long honest step (a big prefill chunk on a busy CPU
takes seconds) only trips the watch when it lasts longer than the timeout, which is why
the default timeout is minutes, not seconds.

"Has work" is what the core said last (requests running or waiting), and, with a single
engine, a request sent to it since it last spoke: a core stopped while idle is caught by
the first request it does not acknowledge. With several (data-parallel) engines the front
end does not track which engine has which request here, so an idle engine that stops is
seen stalled only once its stats show work.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.outputs import SchedulerStats


@dataclass
class EngineProgress:
    heard_at: float  # time.monotonic() of its last message
    busy: bool = False  # its last stats showed requests running or waiting
    sent_at: float | None = None  # the first request sent to it since it last spoke


class StallWatch:
    def __init__(self, num_engines: int, timeout_s: float | None, now: float) -> None:
        """``timeout_s`` None: never report a stall."""
        self.timeout_s = timeout_s
        self._engines = [EngineProgress(now) for _ in range(num_engines)]

    def heard(self, engine_index: int, stats: SchedulerStats | None, now: float) -> None:
        progress = self._engines[engine_index]
        progress.heard_at, progress.sent_at = now, None
        if stats is not None:
            progress.busy = stats.num_running_reqs + stats.num_waiting_reqs > 0

    def sent(self, now: float) -> None:
        """A request went to the engine (tracked for a single engine only, see above)."""
        if len(self._engines) == 1 and self._engines[0].sent_at is None:
            self._engines[0].sent_at = now

    def silences(self, now: float) -> dict[int, float]:
        """Stalled engines by index, with how long each has had work and been silent."""
        if self.timeout_s is None:
            return {}
        silent: dict[int, float] = {}
        for index, progress in enumerate(self._engines):
            since = progress.heard_at if progress.busy else progress.sent_at
            if since is not None and now - since > self.timeout_s:
                silent[index] = now - since
        return silent
