"""The shared-storage connector between a producer engine and a consumer engine, each in its
own process, against a single engine's greedy outputs; and its fallback when files are
corrupt or missing."""

from __future__ import annotations

import json
from pathlib import Path

from octavo import LLM, SamplingParams

from ..core.tiny_models import save_tiny_model
from .conftest import Prompts, TinyModel, run_engine, run_engines, write_prompts
from .engine_process import MAX_TOKENS


def storage_config(path: Path, role: str) -> dict[str, str]:
    return {"connector": "shared_storage", "role": role, "path": str(path)}


def test_consumer_loads_what_the_producer_saved(tiny_model: TinyModel, prompts: Prompts,
                                                tmp_path: Path) -> None:
    why = f"model seed {tiny_model.seed}, prompt seed {prompts.seed}"
    store = tmp_path / "kv"
    produced = write_prompts(tmp_path, "produced", prompts.produced)
    consumed = write_prompts(tmp_path, "consumed", prompts.consumed)
    reference, producer = run_engines(tiny_model, (consumed, None),
                                      (produced, storage_config(store, "producer")))
    assert producer["tokens"] == reference["tokens"][:3], why
    assert producer["kv_transfer"]["saves"] == 3, why
    assert len(list(store.glob("*/done"))) == 3, why

    consumer = run_engine(tiny_model, consumed, storage_config(store, "consumer"))
    assert consumer["tokens"] == reference["tokens"], why
    expected = prompts.expected_loaded()
    assert consumer["num_cached_tokens"] == expected, why
    assert consumer["kv_transfer"] == {"loads": 4, "loaded_tokens": sum(expected),
                                       "failed_loads": 0, "saves": 0}, why


def test_tensor_parallel_ranks_store_and_load_their_shards(tiny_model: TinyModel,
                                                           prompts: Prompts,
                                                           tmp_path: Path) -> None:
    """Each of two ranks saves and loads its half of the KV heads under names of its own;
    an engine of another layout (one rank) finds no complete entry and computes instead."""
    why = f"model seed {tiny_model.seed}, prompt seed {prompts.seed}"
    store = tmp_path / "kv"
    produced = write_prompts(tmp_path, "produced", prompts.produced)
    consumed = write_prompts(tmp_path, "consumed", prompts.consumed)
    reference = run_engine(tiny_model, consumed)
    producer = run_engine(tiny_model, produced, storage_config(store, "producer"), "--tp=2")
    assert producer["tokens"] == reference["tokens"][:3], why
    for rank in (0, 1):
        assert len(list(store.glob(f"*/done@tp{rank}of2-pp0of1"))) == 3, why
    assert not list(store.glob("*/done")), why

    consumer = run_engine(tiny_model, consumed, storage_config(store, "consumer"), "--tp=2")
    assert consumer["tokens"] == reference["tokens"], why
    assert consumer["kv_transfer"]["loads"] == 4, why
    assert consumer["kv_transfer"]["failed_loads"] == 0, why
    one_rank = run_engine(tiny_model, consumed, storage_config(store, "consumer"))
    assert one_rank["kv_transfer"]["loads"] == 0, why
    assert one_rank["tokens"] == reference["tokens"], why


def test_corrupt_or_missing_files_fall_back_to_computing(tiny_model: TinyModel,
                                                         prompts: Prompts,
                                                         tmp_path: Path) -> None:
    why = f"model seed {tiny_model.seed}, prompt seed {prompts.seed}"
    store = tmp_path / "kv"
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    requests = [{"prompt_token_ids": p} for p in prompts.produced]
    producer = LLM(model=str(tiny_model.folder), dtype="float32", kv_cache_memory=8 * 2**20,
                   kv_transfer_config=json.dumps(storage_config(store, "producer")))
    reference = [o.outputs[0].token_ids for o in producer.generate(requests, params)]
    del producer
    entries = sorted(path.parent for path in store.glob("*/done"))
    assert len(entries) == 3, why
    (entries[0] / "layer_001.safetensors").write_bytes(b"not a safetensors file")
    (entries[1] / "layer_000.safetensors").unlink()

    consumer = LLM(model=str(tiny_model.folder), dtype="float32", kv_cache_memory=8 * 2**20,
                   kv_transfer_config=storage_config(store, "consumer"))
    outputs = consumer.generate(requests, params)
    assert [o.outputs[0].token_ids for o in outputs] == reference, why
    stats = consumer.llm_engine.core.scheduler.make_stats().kv_transfer
    assert (stats.loads, stats.failed_loads) == (1, 2), why


def test_loaded_kv_is_what_the_consumer_computes_with(tiny_model: TinyModel, prompts: Prompts,
                                                      tmp_path: Path) -> None:
    """KV saved by a different model (same shapes, other weights) is loaded as it is, and
    changes the consumer's outputs: the consumer really skips computing the prompt."""
    other = tmp_path / "other-model"
    save_tiny_model("llama", other, seed=tiny_model.seed + 1)
    why = f"model seed {tiny_model.seed}, prompt seed {prompts.seed}"
    store = tmp_path / "kv"
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    requests = [{"prompt_token_ids": p} for p in prompts.produced]

    def generate(model: Path, role: str | None) -> list[list[int]]:
        config = None if role is None else storage_config(store, role)
        llm = LLM(model=str(model), dtype="float32", kv_cache_memory=8 * 2**20,
                  kv_transfer_config=config)
        return [list(o.outputs[0].token_ids) for o in llm.generate(requests, params)]

    generate(other, "producer")
    assert generate(tiny_model.folder, "consumer") != generate(tiny_model.folder, None), why
