"""A model architecture that a plugin registers serves at TP=2: plugins load in every worker
process (vLLM's long-standing #18740, where out-of-tree models were unknown to workers).
The fixture's model negates the Llama's logits, so its greedy tokens differ from the plain
Llama's on the same weights: the test sees which class every rank ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from octavo import plugins
from octavo.testing.seeds import draw_seed

from ..core.tiny_models import save_tiny_model
from .engines import one_thread, run
from .test_tensor_parallel import random_prompts

FIXTURE = Path(__file__).parents[1] / "core" / "plugins" / "plugin_fixtures" / "model"


@pytest.fixture
def plugin_site(tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fixture plugin installed in a folder of its own, found through its entry point
    by this process and, through the environment, by the worker processes; this process's
    plugin host and registries are rebuilt with it, and without it after the test."""
    target = tmp_path_factory.mktemp("model-plugin-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(FIXTURE)], check=True)
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
