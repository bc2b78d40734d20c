"""The contract between ``compare.py`` and one engine's runner script: the job file in, one
JSON result out. Plain standard library, because a runner may execute in another engine's
virtual environment where Octavo is not installed.

Job file: ``{"workload", "model" (HF folder), "gguf" (the GGUF it came from, or null),
"dtype", "kv_cache_bytes" (or null: the engine's default), "enable_prefix_caching",
"threads", "prompts": [[token ids]...], "output_len", "repeats", "warmup_prompt"}``.
The warm-up request runs once, untimed, before the measured generations, so one-time costs
are not billed to them; the whole workload then runs ``repeats`` times.
Result: ``{"engine", "wall_s" (the median of the repeats), "walls", "ready_unix" (the
time.time() at which the model was loaded and ready), "num_requests", "prompt_tokens",
"output_tokens"}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WARMUP_OUTPUT_LEN = 4


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--job", required=True, type=Path, help="the job file compare.py wrote")
    parser.add_argument("--output-json", required=True, type=Path, help="where to write")
    return parser.parse_args()


def load_job(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def measure(engine: str, job: dict[str, Any], output: Path,
            generate: Callable[[list[list[int]], int], list[int]]) -> None:
    """Warm up, then time ``generate(prompts, output_len)`` (which returns each request's
    output length) ``repeats`` times, and write the result. Call it once the model is
    loaded: that moment is the engine's start-up time."""
    ready_unix = time.time()
    generate([job["warmup_prompt"]], WARMUP_OUTPUT_LEN)
    walls = []
    for _ in range(job.get("repeats", 1)):
        start = time.perf_counter()
        output_lens = generate(job["prompts"], job["output_len"])
        walls.append(time.perf_counter() - start)
    prompts = job["prompts"]
    result = {"engine": engine, "wall_s": statistics.median(walls), "walls": walls,
              "ready_unix": ready_unix, "num_requests": len(prompts),
              "prompt_tokens": sum(len(p) for p in prompts), "output_tokens": sum(output_lens)}
    output.write_text(json.dumps(result, indent=2) + "\n")
