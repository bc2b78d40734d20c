"""The reference benchmark workloads (``workloads.json``, a copy of the project's shared
``bench/workloads.json``): their prompts, exactly as specified - random token ids drawn
uniformly from [100, 49000) with ``numpy.random.default_rng(seed)``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

TOKEN_LOW, TOKEN_HIGH = 100, 49000


def load_specs() -> dict[str, dict[str, Any]]:
    text = resources.files("octavo.bench").joinpath("workloads.json").read_text()
    return {k: v for k, v in json.loads(text).items() if k != "about"}


@dataclass
class Workload:
    name: str
    spec: dict[str, Any]
    prompts: list[list[int]]
    output_len: int


def build_workload(name: str) -> Workload:
    specs = load_specs()
    if name not in specs:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(specs)}")
    spec = specs[name]
    rng = np.random.default_rng(spec.get("seed", 0))
    n = spec["num_requests"]
    if "shared_prefix_len" in spec:
        prefix = rng.integers(TOKEN_LOW, TOKEN_HIGH, size=spec["shared_prefix_len"]).tolist()
        prompts = [prefix + rng.integers(TOKEN_LOW, TOKEN_HIGH,
                                         size=spec["unique_suffix_len"]).tolist()
                   for _ in range(n)]
    else:
        prompts = rng.integers(TOKEN_LOW, TOKEN_HIGH, size=(n, spec["prompt_len"])).tolist()
    return Workload(name, spec, prompts, spec["output_len"])
