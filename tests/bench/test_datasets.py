"""Benchmark datasets: random lengths and shared prefixes, prefix repetition, ShareGPT files
(with the tiny byte tokenizer: one token per byte), and the reference workloads."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from octavo.bench.datasets import (
    DatasetError,
    DatasetOptions,
    build_requests,
    prefix_repetition_requests,
    random_requests,
    sharegpt_requests,
    workload_requests,
)
from octavo.bench.workloads import build_workload
from octavo.testing.seeds import draw_seed

from ..core.tiny_models import tiny_tokenizer


def test_random_lengths_prefix_and_vocab() -> None:
    seed = draw_seed()
    requests = random_requests(200, input_len=40, output_len=20, range_ratio=0.5,
                               prefix_len=7, seed=seed, vocab_size=300)
    prefix = requests[0].prompt[:7]
    for r in requests:
        assert r.prompt[:7] == prefix, f"seed={seed}"
        assert r.prompt_len == len(r.prompt), f"seed={seed}"
        assert 7 + 20 <= r.prompt_len <= 7 + 60, f"seed={seed}"
        assert 10 <= r.output_len <= 30, f"seed={seed}"
        assert all(100 <= t < 300 for t in r.prompt), f"seed={seed}"
    assert len({r.prompt_len for r in requests}) > 10, f"lengths should vary; seed={seed}"
    again = random_requests(200, 40, 20, 0.5, 7, seed, 300)
    assert [r.prompt for r in again] == [r.prompt for r in requests], "same seed, same prompts"


def test_random_without_range_is_exact() -> None:
    requests = random_requests(5, 16, 8, seed=draw_seed())
    assert {(r.prompt_len, r.output_len) for r in requests} == {(16, 8)}


def test_prefix_repetition_groups() -> None:
    seed = draw_seed()
    requests = prefix_repetition_requests(12, prefix_len=10, suffix_len=5, num_prefixes=3,
                                          output_len=4, seed=seed, vocab_size=5000)
    groups = Counter(tuple(r.prompt[:10]) for r in requests)
    assert sorted(groups.values()) == [4, 4, 4], f"seed={seed}"
    assert {(r.prompt_len, r.output_len) for r in requests} == {(15, 4)}
    # Shuffled, not grouped by prefix (seed 0: a fresh seed leaves them grouped 1 in 5775).
    firsts = [tuple(r.prompt[:10]) for r in prefix_repetition_requests(12, 10, 5, 3, 4, seed=0)]
    assert firsts != sorted(firsts, key=firsts.index)
    with pytest.raises(DatasetError, match="multiple of --prefix-repetition-num-prefixes"):
        prefix_repetition_requests(10, 10, 5, 3, 4)


def write_sharegpt(path: Path, conversations: list) -> Path:
    path.write_text(json.dumps(conversations))
    return path


def test_sharegpt_prompts_and_reply_lengths(tmp_path: Path) -> None:
    data = [{"id": "a", "conversations": [{"from": "human", "value": "hello there"},
                                          {"from": "gpt", "value": "hi, how are you"}]},
            {"id": "b", "conversations": [{"from": "human", "value": "only one turn"}]},
            {"id": "c", "conversations": [{"from": "human", "value": "why"},  # 3 bytes: dropped
                                          {"from": "gpt", "value": "because of reasons"}]},
            {"id": "d", "conversations": [{"from": "human", "value": "tell me a story"},
                                          {"from": "gpt", "value": "once upon a time"},
                                          {"from": "human", "value": "more"}]}]
    path = write_sharegpt(tmp_path / "sg.json", data)
    tokenizer = tiny_tokenizer()
    requests = sharegpt_requests(path, 10, tokenizer, seed=draw_seed())
    got = sorted((r.prompt, r.prompt_len, r.output_len) for r in requests)
    assert got == [("hello there", 11, 15), ("tell me a story", 15, 16)]
    fixed = sharegpt_requests(path, 1, tokenizer, output_len=3)
    assert len(fixed) == 1 and fixed[0].output_len == 3


@pytest.mark.parametrize("content, says", [
    ("not json", "not a readable JSON"),
    ('{"conversations": []}', "JSON list of conversations"),
    ('[{"id": 1}]', "entry 0 has no 'conversations'"),
    ('[{"conversations": [{"from": "human"}, {"from": "gpt"}]}]', "needs a 'value'"),
    ('[{"conversations": [{"value": "a"}]}]', "no conversation with two turns"),
])
def test_sharegpt_bad_files_are_named(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DatasetError, match=says) as info:
        sharegpt_requests(path, 5, tiny_tokenizer())
    assert str(path) in str(info.value)


def test_sharegpt_missing_file_and_path() -> None:
    with pytest.raises(DatasetError, match="no such ShareGPT file"):
        sharegpt_requests("/nonexistent/sg.json", 5, tiny_tokenizer())
    with pytest.raises(DatasetError, match="needs --dataset-path"):
        build_requests(DatasetOptions(dataset_name="sharegpt"), tiny_tokenizer())


def test_workload_requests_are_the_workload() -> None:
    for name in ("W1_throughput", "W3_shared_prefix"):
        workload = build_workload(name)
        requests = workload_requests(name)
        assert [r.prompt for r in requests] == workload.prompts
        assert {r.output_len for r in requests} == {workload.output_len}
    w3 = workload_requests("W3_shared_prefix")
    assert len(w3) == 32 and {r.prompt_len for r in w3} == {544}
    assert len({tuple(r.prompt[:512]) for r in w3}) == 1
    with pytest.raises(DatasetError, match="unknown workload"):
        workload_requests("W9")


def test_build_requests_dispatch_and_errors() -> None:
    tokenizer = tiny_tokenizer()  # 259 tokens: random ids come from [100, 259)
    options = DatasetOptions(num_prompts=6, random_input_len=9, random_output_len=3)
    requests = build_requests(options, tokenizer)
    assert len(requests) == 6 and all(max(r.prompt) < len(tokenizer) for r in requests)
    options = DatasetOptions(dataset_name="prefix-repetition", num_prompts=4,
                             prefix_repetition_num_prefixes=2)
    assert len(build_requests(options, tokenizer)) == 4
    with pytest.raises(DatasetError, match="--dataset-name must be one of"):
        build_requests(DatasetOptions(dataset_name="lmsys"), tokenizer)
    with pytest.raises(DatasetError, match="--num-prompts must be at least 1"):
        build_requests(DatasetOptions(num_prompts=0), tokenizer)
    with pytest.raises(DatasetError, match="--random-range-ratio"):
        build_requests(DatasetOptions(random_range_ratio=1.0), tokenizer)
