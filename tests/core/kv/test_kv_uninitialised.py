"""Whatever garbage a KV slot no request has written holds - NaN and inf included, as in a
plugin's uninitialised cache - never reaches an attention output; and the CPU cache is
resident from the start (zeroed when allocated), so a server's memory does not grow by the
cache under its first traffic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from octavo.testing.seeds import draw_seed
from tests.attention_cases import (
    DECODE_BATCH,
    MIXED_BATCH,
    NUM_KV_HEADS,
    dense_reference,
    make_case,
    run_backend,
)
from tests.core.tiny_models import save_tiny_model

pytestmark = pytest.mark.usefixtures("single_thread")


def poison_all_but_cached_prefixes(case, requests: list[tuple[int, int]], block_size: int,
                                   seed: int) -> None:
    """Every slot that no request has written before this step - free blocks, the tails of
    partly filled blocks, and the slots this step's new tokens are about to fill - gets NaN,
    +inf or -inf."""
    flat = case.kv_cache.view(2, -1, NUM_KV_HEADS, case.kv_cache.shape[-1])
    keep = torch.zeros(flat.shape[1], dtype=torch.bool)
    for row, (cached, _) in enumerate(requests):
        table = case.metadata.block_tables[row]
        for pos in range(cached):
            keep[int(table[pos // block_size]) * block_size + pos % block_size] = True
    garbage = torch.tensor([float("nan"), float("inf"), float("-inf")])
    pick = torch.randint(0, 3, flat.shape, generator=torch.Generator().manual_seed(seed))
    flat[:, ~keep] = garbage[pick].to(flat.dtype)[:, ~keep]


@pytest.mark.parametrize("requests", [MIXED_BATCH, DECODE_BATCH, MIXED_BATCH + DECODE_BATCH],
                         ids=["mixed", "decodes", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_garbage_in_unwritten_slots_never_reaches_the_output(requests, dtype) -> None:
    seed = draw_seed()
    block_size, num_heads, head_dim = 16, NUM_KV_HEADS * 3, 64
    case = make_case(requests, num_heads, head_dim, block_size, dtype, seed)
    poison_all_but_cached_prefixes(case, requests, block_size, seed)
    out = run_backend(case, num_heads, head_dim)
    assert torch.isfinite(out).all(), f"seed={seed}"
    expected = dense_reference(case, requests, head_dim**-0.5, None)
    atol = 1e-5 if dtype == torch.float32 else 3e-2
    diff = (out.double() - expected).abs().max().item()
    assert diff < atol, f"seed={seed} max abs diff {diff}"


# In a fresh interpreter: the test process's allocator holds memory freed by earlier
# tests, which a new cache may reuse without growing the RSS.
RESIDENT_SCRIPT = """
import sys, psutil, torch
from octavo import LLM, SamplingParams
torch.set_num_threads(1)
before = psutil.Process().memory_info().rss
llm = LLM(model=sys.argv[1], dtype="float32", kv_cache_memory=2**28)
grown = psutil.Process().memory_info().rss - before
out = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
print(grown, len(out[0].outputs[0].token_ids))
"""


def test_kv_cache_memory_is_resident_from_the_start(tmp_path: Path) -> None:
    """A 256 MiB cache adds its 256 MiB of RSS before any request, and generation works."""
    folder = tmp_path / "tiny"
    save_tiny_model("llama", folder, seed=0)
    run = subprocess.run([sys.executable, "-c", RESIDENT_SCRIPT, str(folder)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    grown, num_tokens = (int(x) for x in run.stdout.split()[-2:])
    assert grown > 0.9 * 2**28, f"only {grown / 2**20:.0f} MiB of the KV cache is resident"
    assert num_tokens == 4
