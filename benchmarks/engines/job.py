"""The contract between ``compare.py`` and one engine's runner script: the job file in, one
JSON result out. Plain standard library, because a runner may execute in another engine's
virtual environment where Octavo is not installed.

Job file: ``{"workload", "model", "dtype", "kv_cache_bytes", "prompts": [[token ids]...],
"output_len", "warmup_prompt": [token ids]}``. The warm-up request runs once, untimed, before
the measured generation, so one-time costs are not billed to it.
Result: ``{"engine", "wall_s", "num_requests", "prompt_tokens", "output_tokens"}``, where
``wall_s`` times generation only (not loading, not the warm-up request).
"""

from __future__ import annotations

import argparse
import json
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


def write_result(path: Path, engine: str, wall_s: float, prompts: list[list[int]],
                 output_lens: list[int]) -> None:
    result = {"engine": engine, "wall_s": wall_s, "num_requests": len(prompts),
              "prompt_tokens": sum(len(p) for p in prompts), "output_tokens": sum(output_lens)}
    path.write_text(json.dumps(result, indent=2) + "\n")
