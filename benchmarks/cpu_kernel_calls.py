"""The cost of calling each CPU kernel from Python: microseconds per call on tiny tensors.

On one row of a small layer a kernel's arithmetic takes well under a microsecond, so what
this times is the wrapper: its checks of the tensors, the output allocation and the ctypes
call with its argument conversions (and, where a kernel can fail, the test of its status).
A decode step calls ~10 of them per layer on the portable-layer path, or one
``decode_layers`` for the whole stack of fused layers; ``decode_layers`` is timed over
``--layers`` layers, and the ``DecodeStep`` a step builds is timed too. Run it on two
checkouts side by side, on an idle machine, to compare the interface's overhead:

    python benchmarks/cpu_kernel_calls.py --calls 20000 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from octavo.cpu import kernels

BF16 = torch.bfloat16
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, SLOTS = 64, 2, 1, 32, 128, 64


def layer_weights(keep: list[torch.Tensor]) -> kernels.LayerWeights:
    """A small fused layer's weights (random, kept alive in ``keep``)."""
    def packed(out: int, inp: int) -> torch.Tensor:
        return kernels.pack_pair_weight(torch.randn(out, inp).to(BF16) * 0.05)
    ws = [packed((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), packed(HIDDEN, HEADS * HEAD_DIM),
          packed(2 * INTER, HIDDEN), packed(HIDDEN, INTER)]
    norm = torch.ones(HIDDEN, dtype=BF16)
    keep += [*ws, norm]
    qkv, o, gate_up, down = (w.data_ptr() for w in ws)
    return kernels.LayerWeights(
        input_norm=norm.data_ptr(), post_norm=norm.data_ptr(), qkv=qkv, o=o, gate_up=gate_up,
        down=down, qkv_bias=None, o_bias=None, gate_up_bias=None, down_bias=None,
        qkv_scale=None, o_scale=None, gate_up_scale=None, down_scale=None,
        qkv_type=0, o_type=0, gate_up_type=0, down_type=0, hidden=HIDDEN, num_heads=HEADS,
        num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate=INTER, qkv_lora=None,
        o_lora=None, gate_up_lora=None, down_lora=None, eps=1e-5, scale=HEAD_DIM**-0.5)


def calls(layers: int, keep: list[torch.Tensor]) -> dict[str, Callable[[], object]]:
    """Each wrapper on one row of tiny tensors (the fused layers' weights and caches kept
    alive in ``keep``)."""
    x, residual = torch.randn(1, HIDDEN).to(BF16), torch.randn(1, HIDDEN).to(BF16)
    weight = torch.ones(HIDDEN, dtype=BF16)
    gate_up = torch.randn(1, 2 * INTER).to(BF16)
    q, k = torch.randn(1, HEADS, HEAD_DIM).to(BF16), torch.randn(1, KV_HEADS, HEAD_DIM).to(BF16)
    cos, sin = torch.randn(1, 1, HEAD_DIM).to(BF16), torch.randn(1, 1, HEAD_DIM).to(BF16)
    cache = torch.zeros(2, SLOTS, KV_HEADS * HEAD_DIM, dtype=BF16)
    kv = torch.randn(1, KV_HEADS * HEAD_DIM).to(BF16)
    slot, seq_lens = torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    found: dict[str, Callable[[], object]] = {
        "rms_norm": lambda: kernels.rms_norm(x, residual, weight, 1e-5),
        "silu_and_mul": lambda: kernels.silu_and_mul(gate_up),
        "rope_": lambda: kernels.rope_(q, k, cos, sin),
        "write_kv": lambda: kernels.write_kv(cache, kv, kv, slot),
        "decode_attention": lambda: kernels.decode_attention(
            q, cache, slot, seq_lens, 1, KV_HEADS, 0.125),
    }
    if kernels.pair_gemm_available():
        packed = kernels.pack_pair_weight(torch.randn(HIDDEN, HIDDEN).to(BF16))
        found["pair_gemm"] = lambda: kernels.pair_gemm(x, packed, None, HIDDEN)
        caches = [cache.clone() for _ in range(layers)]
        keep += caches  # the stack holds their addresses only
        stack = kernels.LayerStack([layer_weights(keep) for _ in range(layers)], caches)
        tensors = [cos.view(1, HEAD_DIM), sin.view(1, HEAD_DIM), slot, seq_lens]

        def step() -> kernels.DecodeStep:
            return kernels.DecodeStep(
                tokens=1, cos=tensors[0].data_ptr(), sin=tensors[1].data_ptr(),
                slot_mapping=tensors[2].data_ptr(), slots=tensors[2].data_ptr(),
                seq_lens=tensors[3].data_ptr(), max_len=1, prefix_slots=None, prefix_len=0,
                lora_sorted_tokens=None, lora_starts=None, lora_counts=None)
        one_step = step()
        found["DecodeStep(...)"] = step
        found[f"decode_layers ({layers} layers)"] = lambda: kernels.decode_layers(
            stack, one_step, x)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=7, help="timings per kernel")
    parser.add_argument("--layers", type=int, default=30, help="layers of decode_layers")
    args = parser.parse_args()
    if kernels.library() is None:
        raise SystemExit("the CPU kernels are not built here (no C compiler?)")
    torch.set_num_threads(1)
    keep: list[torch.Tensor] = []
    for name, call in calls(args.layers, keep).items():
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _ in range(args.calls):
                call()
            times.append((time.perf_counter() - start) / args.calls * 1e6)
        print(f"{name:28s} best {min(times):7.2f} us  median {statistics.median(times):7.2f} us")


if __name__ == "__main__":
    main()
