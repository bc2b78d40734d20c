"""The benchmark tests' model: the tiny random Llama with SmolLM2's vocabulary size (49152),
so the reference workloads' token ids (up to 49000) are valid prompts for it. Built once."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from octavo.bench.server import ServerProcess
from octavo.testing.seeds import draw_seed

from ..core.tiny_models import tiny_config, tiny_tokenizer

WORKLOAD_VOCAB = 49152
ENGINE_ARGS = ["--dtype", "float32", "--kv-cache-memory", "64MiB"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class BenchModel:
    folder: Path
    seed: int  # of its random weights, for assert messages


@pytest.fixture(scope="session")
def bench_model(tmp_path_factory: pytest.TempPathFactory) -> BenchModel:
    seed = draw_seed()
    folder = tmp_path_factory.mktemp("bench-llama")
    config = tiny_config("llama")
    config.vocab_size = WORKLOAD_VOCAB
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return BenchModel(folder, seed)


@pytest.fixture(scope="module")
def server(bench_model: BenchModel) -> Iterator[ServerProcess]:
    """``octavo serve`` of the tiny model, for a module's tests."""
    with ServerProcess(["--model", str(bench_model.folder), *ENGINE_ARGS]) as server:
        yield server
