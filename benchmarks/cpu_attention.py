"""The CPU attention kernels at a batch's shape: milliseconds per model step.

A decode step of SmolLM2-135M attends every running request's one new query over its whole
context, layer by layer; a prefill step attends each prompt's queries causally over the
prompt. This times ``octavo.cpu.kernels.decode_attention`` (or, with ``--prefill``,
``prefill_attention`` on ``--rows`` prompts of ``--context`` tokens) over ``--layers``
separate caches, so that each layer's keys and values come from memory as in a model step
(W1's decode reads ~470 MB of them a step), the contexts in blocks of 16 slots scattered at
random over each cache as a long-running server leaves them (``--layout random``; ``runs``:
each row's blocks one adjacent run, as the block pool now hands them out where it has room;
``lockstep``: ``--prompt-blocks`` blocks a row in a run, then its decode blocks ``--rows``
apart, as a batch decoding in lockstep got them before), fresh random bf16 contents. It
prints the best and median step time of ``--repeats``; for decode also the rate at which the
step read the cache, to set beside the machine's memory bandwidth:

    python benchmarks/cpu_attention.py --threads 2 --rows 64 --context 320
    python benchmarks/cpu_attention.py --threads 2 --rows 64 --context 320 --layout lockstep
    python benchmarks/cpu_attention.py --threads 2 --rows 16 --context 256 --prefill
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from octavo.cpu import kernels as cpu_kernels

BLOCK = 16  # slots per KV cache block


def decode_call(args: argparse.Namespace, slots: torch.Tensor,
                ) -> Callable[[torch.Tensor], None]:
    """One layer's decode attention: each row's one query over its whole context."""
    lens = torch.full((args.rows,), args.context, dtype=torch.int64)
    q = torch.randn(args.rows, args.heads, args.head_dim).to(torch.bfloat16)
    flat = slots.flatten()
    return lambda cache: cpu_kernels.decode_attention(
        q, cache, flat, lens, args.context, args.kv_heads, args.head_dim**-0.5)


def prefill_call(args: argparse.Namespace, slots: torch.Tensor,
                 ) -> Callable[[torch.Tensor], None]:
    """One layer's prefill attention: each prompt's queries causally over the prompt."""
    tokens = args.rows * args.context
    q = torch.randn(tokens, args.heads, args.head_dim).to(torch.bfloat16)
    out = torch.empty_like(q)
    starts = torch.arange(args.rows) * args.context
    lens = torch.full((args.rows,), args.context, dtype=torch.int64)
    return lambda cache: cpu_kernels.prefill_attention(
        out, q, cache, slots, starts, lens, lens, args.kv_heads, args.head_dim**-0.5)


def block_order(args: argparse.Namespace, blocks_per_row: int, num_blocks: int,
                ) -> torch.Tensor:
    """``[rows, blocks_per_row]`` block ids in the ``--layout`` asked for."""
    rows = args.rows
    if args.layout == "random":
        return torch.randperm(num_blocks)[: rows * blocks_per_row].view(rows, -1)
    if args.layout == "runs":
        return torch.arange(rows * blocks_per_row).view(rows, -1)
    prompt = min(args.prompt_blocks, blocks_per_row)
    runs = torch.arange(rows * prompt).view(rows, prompt)
    decode = rows * prompt + torch.arange(rows * (blocks_per_row - prompt)).view(-1, rows).T
    return torch.cat([runs, decode], dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=64, help="requests (decode rows or prompts)")
    parser.add_argument("--context", type=int, default=320, help="positions each attends")
    parser.add_argument("--prefill", action="store_true",
                        help="time prefill attention (each row a whole prompt) instead")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--layout", choices=("random", "runs", "lockstep"), default="random",
                        help="where each row's blocks lie in the cache (see above)")
    parser.add_argument("--prompt-blocks", type=int, default=16,
                        help="--layout lockstep: each row's blocks in a run before decode")
    args = parser.parse_args()
    if cpu_kernels.library() is None:
        raise SystemExit("the CPU kernels are not built here (no C compiler?)")
    if args.prefill and not cpu_kernels.attention_available(args.head_dim,
                                                            torch.zeros(2, 1, 1)):
        raise SystemExit("the prefill attention kernel needs AVX512-BF16")
    torch.set_num_threads(args.threads)
    width = args.kv_heads * args.head_dim
    blocks_per_row = -(-args.context // BLOCK)
    num_blocks = args.rows * blocks_per_row + 8
    caches = [torch.randn(2, num_blocks * BLOCK, width).to(torch.bfloat16)
              for _ in tqdm(range(args.layers), desc="caches")]
    order = block_order(args, blocks_per_row, num_blocks)
    slots = (order[:, :, None] * BLOCK + torch.arange(BLOCK)).flatten(1)
    slots = slots[:, : args.context].contiguous()
    layer = (prefill_call if args.prefill else decode_call)(args, slots)

    def step() -> float:
        start = time.perf_counter()
        for cache in caches:
            layer(cache)
        return time.perf_counter() - start

    step()  # warm-up
    times = [step() for _ in tqdm(range(args.repeats), desc="steps")]
    best, median = min(times), statistics.median(times)
    kind = "prefill" if args.prefill else "decode"
    line = (f"{kind} attention, {args.rows} rows x {args.context} positions, {args.heads}/"
            f"{args.kv_heads} heads of {args.head_dim}, {args.layers} layers, "
            f"{args.threads} thread(s): best {best * 1e3:.1f} ms, median {median * 1e3:.1f} "
            f"ms per step")
    if not args.prefill:
        read_gb = 2 * args.rows * args.context * width * 2 * args.layers / 1e9
        line += (f"; {read_gb:.2f} GB of keys and values read, {read_gb / median:.1f} GB/s "
                 f"at the median")
    print(line)


if __name__ == "__main__":
    main()
