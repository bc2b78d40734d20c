"""Per-step cost of guided decoding for a W1-sized batch (64 requests, SmolLM2's 49152-token
vocabulary): the scheduler's batched bitmask fill and the runner's masking of the logits,
with every request's JSON open inside a string (where most tokens are allowed).

    .venv/bin/python benchmarks/guided_step_overhead.py [SCHEMA.json]

The end-to-end figure is ``octavo bench throughput --workload W1_throughput`` with and
without ``--json-schema benchmarks/schemas/records.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from octavo.models.loader import load_model_files
from octavo.sampling_params import StructuredOutputsParams
from octavo.sched.structured_outputs import StructuredOutputManager
from octavo.worker.grammar_bitmask import apply_grammar_bitmask

NUM_REQUESTS = 64
VOCAB = 49152
PREFIX = '{"records": [{"id": 12, "name": "ab'  # a state inside a string
REPEATS = 50


class _Sampling:
    """What ``grammar_bitmask`` reads of a request: one that samples this step."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.num_computed_tokens = self.num_tokens = 1


def main() -> None:
    torch.set_num_threads(1)
    schema_file = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/schemas/records.json"
    params = StructuredOutputsParams(json=Path(schema_file).read_text())
    tokenizer = load_model_files(None).tokenizer
    manager = StructuredOutputManager(tokenizer, VOCAB, [tokenizer.eos_token_id])
    start = time.perf_counter()
    manager.cache.get(params.kind, params.spec).result()
    print(f"grammar compiled in {time.perf_counter() - start:.2f} s (tokenizer info included)")
    prefix = tokenizer.encode(PREFIX, add_special_tokens=False)
    requests = [_Sampling(f"r{i}") for i in range(NUM_REQUESTS)]
    for request in requests:
        manager.add_request(request.request_id, params)
        assert manager.grammar_ready(request.request_id)
        assert manager.accept_tokens(request.request_id, prefix), f"{schema_file} rejects {PREFIX}"
    logits = torch.randn(NUM_REQUESTS, VOCAB)
    fill, apply = [], []
    for _ in range(REPEATS):
        start = time.perf_counter()
        _, bitmask = manager.grammar_bitmask(requests)
        fill.append(time.perf_counter() - start)
        assert bitmask is not None
        start = time.perf_counter()
        apply_grammar_bitmask(logits, bitmask, list(range(NUM_REQUESTS)))
        apply.append(time.perf_counter() - start)
    print(f"per step, {NUM_REQUESTS} constrained requests: bitmask fill "
          f"{np.median(fill) * 1e3:.2f} ms, apply {np.median(apply) * 1e3:.2f} ms "
          f"(medians of {REPEATS})")
    print(json.dumps({"schema": schema_file, "fill_ms": np.median(fill) * 1e3,
                      "apply_ms": np.median(apply) * 1e3}))


if __name__ == "__main__":
    main()
