"""The copy workload and ``octavo bench latency --speculative-config``: prompts that ask to
repeat a passage, and the acceptance figures in the benchmark's report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from octavo.bench.copy_task import INSTRUCTION, PASSAGES, copy_prompts
from octavo.models.loader import load_model_files
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


def test_bench_latency_reports_acceptance(tmp_path: Path) -> None:
    seed = int(np.random.default_rng().integers(1 << 30))
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
