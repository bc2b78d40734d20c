"""The copy and chat workloads and ``octavo bench latency --speculative-config``: prompts that
ask to repeat a passage or give an everyday instruction, and the acceptance figures in the
benchmark's report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octavo.bench.chat_task import INSTRUCTIONS, chat_prompts
from octavo.bench.copy_task import INSTRUCTION, PASSAGES, copy_prompts
from octavo.bench.datasets import DatasetError, chat_requests
from octavo.models.loader import load_model_files
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model
from tests.helpers import run_octavo


def test_copy_prompts_hold_the_passage_in_the_chat_template(tmp_path: Path) -> None:
    save_tiny_model("llama", tmp_path, seed=0)
    tokenizer = load_model_files(tmp_path).tokenizer
    pairs = copy_prompts(7, tokenizer, seed=3)
    texts = [tokenizer.decode(ids) for ids, _ in pairs]
    passages = [next(p for p in PASSAGES if p in text) for text in texts]
    assert len(set(passages[:5])) == 5  # each passage once before any repeats
    for (ids, length), passage, text in zip(pairs, passages, texts):
        assert INSTRUCTION.strip() in text
        assert length == len(tokenizer.encode(passage, add_special_tokens=False))
        assert len(ids) > length


def test_chat_prompts_hold_each_instruction_in_the_chat_template(tmp_path: Path) -> None:
    save_tiny_model("llama", tmp_path, seed=0)
    tokenizer = load_model_files(tmp_path).tokenizer
    requests = chat_requests(len(INSTRUCTIONS) + 2, 40, tokenizer, seed=4)
    texts = [tokenizer.decode(r.prompt) for r in requests]
    found = [next(i for i in INSTRUCTIONS if i in text) for text in texts]
    assert sorted(found[:len(INSTRUCTIONS)]) == sorted(INSTRUCTIONS)  # each once, then cycling
    assert found[len(INSTRUCTIONS):] == found[:2]
    assert all(r.output_len == 40 and r.prompt_len == len(r.prompt) for r in requests)
    assert [r.prompt for r in requests[:3]] == chat_prompts(3, tokenizer, seed=4)
    with pytest.raises(DatasetError, match="--output-len"):
        chat_requests(2, 0, tokenizer)


def test_bench_latency_reports_acceptance(tmp_path: Path) -> None:
    seed = draw_seed()
    save_tiny_model("llama", tmp_path / "model", seed=seed)
    out = tmp_path / "latency.json"
    result = run_octavo(
        "bench", "latency", "--model", str(tmp_path / "model"), "--dtype", "float32",
        "--kv-cache-memory", "8MiB", "--dataset-name", "copy", "--batch-size", "2",
        "--num-iters-warmup", "0", "--num-iters", "1", "--output-json", str(out),
        "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}',
        timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "spec: acceptance rate" in result.stdout
    spec = json.loads(out.read_text())["spec_decoding"]
    assert spec["num_draft_tokens"] >= spec["num_accepted_tokens"] >= 0, f"seed={seed}"
    assert len(spec["per_position_acceptance_rate"]) <= 3
