"""Worker processes that cannot start: the engine fails at once with the rank's error.

Rank 0 waits for rank 1 in torch.distributed's rendezvous; when rank 1 fails before it gets
there, the start must end on rank 1's error, not after the rendezvous times out (minutes).
A core list naming a core that does not exist fails rank 1 while it binds its threads.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from octavo import LLM
from octavo.cpu.threads import THREADS_BIND_ENV
from octavo.executor.base import WorkerDiedError

from ..core.tiny_models import save_tiny_model


def test_one_rank_failing_before_the_rendezvous_fails_the_engine_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_tiny_model("llama", tmp_path, seed=1)
    monkeypatch.setenv(THREADS_BIND_ENV, "0|4095")
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=f"worker rank 1 failed to start: ValueError: "
                                              f"{THREADS_BIND_ENV}: worker 1 cannot run on "
                                              r"cores \[4095\]"):
        LLM(str(tmp_path), dtype="float32", kv_cache_memory=1 << 24, tensor_parallel_size=2)
    assert time.monotonic() - start < 60
