"""A model architecture that a plugin registers serves at TP=2: plugins load in every worker
process (vLLM's long-standing #18740, where out-of-tree models were unknown to workers).
The fixture's model negates the Llama's logits, so its greedy tokens differ from the plain
Llama's on the same weights: the test sees which class every rank ran. Its other model
raises on one rank only, mid-step: the engine must end at once, not hang in a collective."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from octavo import plugins
from octavo.executor.base import WorkerDiedError
from octavo.testing.seeds import draw_seed

from ..core.tiny_models import save_tiny_model
from .engines import generate, make_llm, one_thread, run
from .test_tensor_parallel import random_prompts

FIXTURE = Path(__file__).parents[1] / "core" / "plugins" / "plugin_fixtures" / "model"


@pytest.fixture(scope="module")
def plugin_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture plugin installed in a folder of its own, once for the module."""
    target = tmp_path_factory.mktemp("model-plugin-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(FIXTURE)], check=True)
    return target


@pytest.fixture
def plugin_site(plugin_target: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fixture plugin found through its entry point by this process and, through the
    environment, by the worker processes; this process's plugin host and registries are
    rebuilt with it, and without it after the test."""
    target = plugin_target
    monkeypatch.syspath_prepend(str(target))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(target), os.environ.get("PYTHONPATH")])))
    _forget_plugins()
    yield target
    monkeypatch.undo()
    _forget_plugins()


def _forget_plugins() -> None:
    plugins.get_registries.cache_clear()
    plugins.get_plugin_host.cache_clear()


def save_as(architecture: str, folder: Path, seed: int) -> Path:
    """A tiny Llama whose config names ``architecture``."""
    save_tiny_model("llama", folder, seed)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": [architecture]}))
    return folder


def test_plugin_model_serves_at_tp2(plugin_site: Path, tmp_path: Path) -> None:
    seed = draw_seed()
    plain = tmp_path / "plain"
    save_tiny_model("llama", plain, seed)
    negated = save_as("NegatedLlamaForCausalLM", tmp_path / "negated", seed)
    prompts = random_prompts(np.random.default_rng(seed), 4)
    with one_thread():
        reference = run(str(negated), prompts, 12)
        baseline = run(str(plain), prompts, 12)
    parallel = run(str(negated), prompts, 12, tensor_parallel_size=2)
    assert parallel.tokens == reference.tokens, f"seed {seed}"
    assert parallel.tokens != baseline.tokens


POISON_TOKEN_ID = 13  # the fixture's RaisingLlamaForCausalLM: rank 0 raises on it
FAILED_WITHIN_S = 10.0  # the collectives' own timeouts are 60 s (shared memory) and 600 s


@pytest.mark.parametrize("parallel", [{"tensor_parallel_size": 2},
                                      {"pipeline_parallel_size": 2}], ids=["tp2", "pp2"])
def test_a_step_raising_on_one_rank_ends_the_engine_at_once(plugin_site: Path, tmp_path: Path,
                                                            parallel: dict[str, int]) -> None:
    """Rank 0 raises while rank 1 waits for it in an all-reduce (TP) or a receive (PP, with
    micro-batches): the engine fails within seconds naming rank 0's error - before, rank 1
    waited for the collective's timeout, and the ranks' shared-memory call counts parted."""
    folder = save_as("RaisingLlamaForCausalLM", tmp_path / "raising", draw_seed())
    llm = make_llm(str(folder), **parallel)
    try:
        served = generate(llm, [[5, 6, 7, 8]], 4)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as failed:
            generate(llm, [[5, POISON_TOKEN_ID, 7, 8]], 4)
        failed_s = time.monotonic() - start
        workers = list(llm.llm_engine.core.executor.procs)
    finally:
        llm.shutdown()
    print(f"\n{parallel}: failed after {failed_s:.2f} s: {failed.value}")
    assert len(served.tokens[0]) == 4
    assert failed_s < FAILED_WITHIN_S
    assert "worker rank 0" in str(failed.value), failed.value
    assert f"met the poison token {POISON_TOKEN_ID}" in str(failed.value), failed.value
    assert all(worker.poll() is not None for worker in workers)
