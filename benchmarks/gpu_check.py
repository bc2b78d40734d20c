"""The Python half of benchmarks/gpu_check.sh (a machine with one NVIDIA GPU).

    gpu_check.py weights MODEL_DIR  fill an HF folder that holds config.json and a tokenizer
                                    with random bf16 weights of the config's shapes (the
                                    real weights do not fit in what a device run carries)
    gpu_check.py times OUT_DIR      time each Triton kernel against its torch reference on
                                    the GPU (bf16, Llama-3-8B-like shapes) -> kernels.json;
                                    the quantized GEMMs against dequantize-then-matmul
                                    in torch, the LoRA pair against a per-adapter loop
    gpu_check.py table OUT_DIR      print one table: the kernel tests, the kernel timings,
                                    W1/W2 with CUDA graphs on and off, W2 through the
                                    multi-process executor, and the GPU memory the engine
                                    planned (from the files gpu_check.sh wrote into OUT_DIR)

The torch references are the portable implementations the engine uses without the
plugin: the core's layers and its torch attention backend.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, BLOCK = 4096, 32, 8, 128, 14336, 16
# (workload, key of its ``octavo bench`` JSON, unit, whether higher is better)
WORKLOAD_FIGURES = [
    ("W1_throughput", "output_tokens_per_second", "output tok/s", True),
    ("W1_throughput", "tokens_per_second", "total tok/s", True),
    ("W2_latency", "avg_latency", "s end to end", False),
    ("W2_latency", "avg_decode_tok_per_s", "decode tok/s", True),
]


def weights(model_dir: Path) -> None:
    """Random weights, seeded, in bf16, saved as the safetensors the loader reads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(model_dir)
    count = sum(p.numel() for p in model.parameters())
    print(f"{model_dir}: {count / 1e6:.1f}M random bf16 parameters "
          f"({config.architectures[0]}, {config.num_hidden_layers} layers)")


def attention_case(context_lens: list[int], query_lens: list[int]) -> dict[str, Any]:
    """A step over a bf16 paged cache: requests with ``context_lens`` tokens in total, the
    last ``query_lens`` of them new, their blocks shuffled through the cache."""
    import torch

    from octavo.attention.base import AttentionMetadata

    blocks_per_req = [-(-n // BLOCK) for n in context_lens]
    order = torch.randperm(sum(blocks_per_req), device="cuda").int()
    table = torch.zeros(len(context_lens), max(blocks_per_req), dtype=torch.int32,
                        device="cuda")
    slots, start = [], 0
    for row, (n, q, b) in enumerate(zip(context_lens, query_lens, blocks_per_req)):
        table[row, :b] = order[start:start + b]
        start += b
        pos = torch.arange(n - q, n, device="cuda")
        slots.append(table[row, pos // BLOCK].long() * BLOCK + pos % BLOCK)
    tokens = sum(query_lens)
    query_start = torch.tensor([0, *query_lens], device="cuda").cumsum(0).int()
    seq_lens = torch.tensor(context_lens, dtype=torch.int32, device="cuda")
    metadata = AttentionMetadata(
        num_actual_tokens=tokens, num_reqs=len(context_lens), query_start_loc=query_start,
        seq_lens=seq_lens, block_tables=table, slot_mapping=torch.cat(slots),
        max_query_len=max(query_lens), max_seq_len=max(context_lens),
        query_start_loc_cpu=query_start.cpu(), seq_lens_cpu=seq_lens.cpu())
    bf16 = {"dtype": torch.bfloat16, "device": "cuda"}
    return {"query": torch.randn(tokens, HEADS, HEAD_DIM, **bf16),
            "key": torch.randn(tokens, KV_HEADS, HEAD_DIM, **bf16),
            "value": torch.randn(tokens, KV_HEADS, HEAD_DIM, **bf16),
            "kv_cache": torch.randn(2, sum(blocks_per_req), BLOCK, KV_HEADS, HEAD_DIM, **bf16),
            "metadata": metadata}


def kernel_pairs() -> list[tuple[str, str, Callable[[], Any], Callable[[], Any]]]:
    """(kernel, shape, Triton call, torch reference call) on bf16 inputs."""
    import torch

    from octavo.attention.torch_backend import TorchAttentionBackend, write_kv
    from octavo.models.config import RopeConfig
    from octavo.models.layers.activation import SiluAndMul
    from octavo.models.layers.norm import RMSNorm
    from octavo.models.layers.rotary import RotaryEmbedding
    from octavo_cuda.platform import CudaPlatform
    from octavo_triton.backend import TritonAttentionBackend
    from octavo_triton.kernels.activation import silu_and_mul
    from octavo_triton.kernels.kv_cache import reshape_and_cache
    from octavo_triton.kernels.rms_norm import rms_norm
    from octavo_triton.kernels.rotary import rotary_embedding
    from octavo_triton.tuning import set_tuning

    set_tuning(CudaPlatform.kernel_tuning)
    bf16 = {"dtype": torch.bfloat16, "device": "cuda"}
    tokens = 4096
    x, residual = torch.randn(tokens, HIDDEN, **bf16), torch.randn(tokens, HIDDEN, **bf16)
    norm = RMSNorm(HIDDEN).to(**bf16)
    q = torch.randn(tokens, HEADS, HEAD_DIM, **bf16)
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, **bf16)
    positions = torch.randint(0, 8192, (tokens,), device="cuda")
    rope = RotaryEmbedding(HEAD_DIM, RopeConfig(theta=500000.0)).cuda()
    gate_up = torch.randn(tokens, 2 * INTERMEDIATE, **bf16)
    cache = torch.empty(2, tokens // BLOCK + 8, BLOCK, KV_HEADS, HEAD_DIM, **bf16)
    slots = torch.randperm(cache.shape[1] * BLOCK, device="cuda")[:tokens]

    pairs = [
        ("rms_norm + residual", f"{tokens} x {HIDDEN}",
         lambda: rms_norm(x, norm.weight, norm.eps, residual), lambda: norm(x, residual)),
        ("rotary", f"{tokens} tok, {HEADS}/{KV_HEADS} heads x {HEAD_DIM}",
         lambda: rotary_embedding(positions, q, k, rope.inv_freq), lambda: rope(positions, q, k)),
        ("silu_and_mul", f"{tokens} x {INTERMEDIATE}",
         lambda: silu_and_mul(gate_up), lambda: SiluAndMul()(gate_up)),
        ("reshape_and_cache", f"{tokens} tok, {KV_HEADS} x {HEAD_DIM}",
         lambda: reshape_and_cache(k, k, cache[0], cache[1], slots),
         lambda: write_kv(cache[0], cache[1], k, k, slots)),
    ]
    attention = [("prefill 8 x 512", [512] * 8, [512] * 8),
                 ("chunk 4 x 512 over 3584 cached", [4096] * 4, [512] * 4),
                 ("decode 64 x 2048", [2048] * 64, [1] * 64),
                 ("decode 4 x 16384 (split-KV)", [16384] * 4, [1] * 4)]
    for name, context_lens, query_lens in attention:
        case = attention_case(context_lens, query_lens)
        args = (case["query"], case["key"], case["value"], case["kv_cache"], case["metadata"])
        with torch.device("cuda"):  # layers are built on their device, as build_model does
            triton_impl = TritonAttentionBackend.make_impl(HEADS, HEAD_DIM, HEAD_DIM**-0.5,
                                                           KV_HEADS)
        torch_impl = TorchAttentionBackend.make_impl(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS)
        pairs.append(("paged attention (+ cache write)", name,
                      lambda impl=triton_impl, a=args: impl.forward(*a),
                      lambda impl=torch_impl, a=args: impl.forward(*a)))
    return pairs


def unpack_int4(words: Any, order: list[int]) -> Any:
    """[R, C] int32 words -> [R, 8C] 4-bit values, nibble i holding column ``order[i]``."""
    import torch

    nibbles = torch.stack([(words >> (4 * i)) & 15 for i in range(8)], -1)
    return nibbles[..., [order.index(c) for c in range(8)]].reshape(words.shape[0], -1)


def gemm_pairs() -> list[tuple[str, str, Callable[[], Any], Callable[[], Any]]]:
    """The LoRA and quantized GEMM kernels: a Triton call against the torch path a plain
    implementation takes (dequantize the weight, then matmul; a loop over adapters)."""
    import torch

    from octavo_triton.kernels.lora import lora_expand, lora_shrink
    from octavo_triton.kernels.quant_gemm import awq_gemm, gptq_gemm
    from octavo_triton.kernels.scaled_mm import quantize_per_token, scaled_mm

    bf16 = {"dtype": torch.bfloat16, "device": "cuda"}
    k, n, group, awq_order = HIDDEN, HIDDEN, 128, [0, 2, 4, 6, 1, 3, 5, 7]
    words = {"dtype": torch.int32, "device": "cuda"}
    awq_q = torch.randint(-2**31, 2**31 - 1, (k, n // 8), **words)
    gptq_q = torch.randint(-2**31, 2**31 - 1, (k // 8, n), **words)
    zeros = torch.randint(-2**31, 2**31 - 1, (k // group, n // 8), **words)
    scales = torch.rand(k // group, n, **bf16) * 0.01

    def awq_torch(x: Any) -> Any:
        weight = (unpack_int4(awq_q, awq_order) - unpack_int4(zeros, awq_order)
                  .repeat_interleave(group, 0)) * scales.repeat_interleave(group, 0)
        return x @ weight.to(x.dtype)

    def gptq_torch(x: Any) -> Any:
        q = unpack_int4(gptq_q.T.contiguous(), list(range(8))).T
        z = unpack_int4(zeros, list(range(8))) + 1
        weight = (q - z.repeat_interleave(group, 0)) * scales.repeat_interleave(group, 0)
        return x @ weight.to(x.dtype)

    pairs = []
    for m in (16, 1024):
        x = torch.randn(m, k, **bf16)
        pairs.append(("w4a16 AWQ (g128)", f"{m} x {k} x {n}",
                      lambda x=x: awq_gemm(x, awq_q, scales, zeros), lambda x=x: awq_torch(x)))
    x = torch.randn(16, k, **bf16)
    pairs.append(("w4a16 GPTQ (g128)", f"16 x {k} x {n}",
                  lambda: gptq_gemm(x, gptq_q, scales, zeros), lambda: gptq_torch(x)))
    x = torch.randn(1024, k, **bf16)
    fp8_w = (torch.randn(n, k, device="cuda") * 50).to(torch.float8_e4m3fn)
    int8_w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    w_scale = torch.rand(n, device="cuda") * 0.01

    def scaled(w: Any, qdtype: Any) -> Any:
        x_q, x_scale = quantize_per_token(x, qdtype)
        return scaled_mm(x_q, w, x_scale, w_scale, torch.bfloat16)

    for name, w, qdtype in (("fp8", fp8_w, torch.float8_e4m3fn), ("int8", int8_w, torch.int8)):
        pairs.append((f"{name} scaled GEMM (+ per-token quantize)", f"1024 x {k} x {n}",
                      lambda w=w, q=qdtype: scaled(w, q),
                      lambda w=w: x @ (w.to(torch.bfloat16) * w_scale[:, None]).T))

    slots, rank, tokens = 8, 16, 1024
    token_lora = torch.randint(-1, slots, (tokens,), dtype=torch.int32, device="cuda")
    lora_a = torch.randn(slots, rank, k, **bf16) * 0.01
    lora_b = torch.randn(slots, n, rank, **bf16) * 0.01
    y, buf = torch.randn(tokens, n, **bf16), torch.empty(tokens, rank, device="cuda")

    def lora_triton() -> None:
        lora_shrink(x, lora_a, token_lora, buf, 2.0)
        lora_expand(y, buf, lora_b, token_lora, 0, n)

    def lora_torch() -> None:
        for slot in range(slots):
            rows = (token_lora == slot).nonzero().squeeze(1)
            y.index_add_(0, rows, (2.0 * x[rows] @ lora_a[slot].T) @ lora_b[slot].T)

    pairs.append(("LoRA shrink + expand", f"{tokens} tok, {slots} adapters, rank {rank}, "
                  f"{k} -> {n}", lora_triton, lora_torch))
    return pairs


def times(out_dir: Path) -> None:
    import torch
    from triton.testing import do_bench

    rows = []
    with torch.inference_mode():
        for kernel, shape, triton_call, torch_call in kernel_pairs() + gemm_pairs():
            triton_ms = do_bench(triton_call, warmup=10, rep=50)
            torch_ms = do_bench(torch_call, warmup=10, rep=50)
            rows.append({"kernel": kernel, "shape": shape, "triton_us": triton_ms * 1e3,
                         "torch_us": torch_ms * 1e3})
            print(f"{kernel} [{shape}]: triton {triton_ms * 1e3:.1f} us, "
                  f"torch {torch_ms * 1e3:.1f} us", flush=True)
    (out_dir / "kernels.json").write_text(json.dumps(rows, indent=2))


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _memory_line(log: Path) -> str:
    """The GPU worker's "memory: ..." line from a bench log, without the log prefix."""
    text = log.read_text() if log.exists() else ""
    match = re.search(r"memory: (.*)", text)
    return match[1].strip() if match else "not logged (see the W1 log)"


def _w2_against_graphs(out_dir: Path, label: str, configuration: str) -> list[object]:
    """The W2_latency row of run ``label`` beside the in-process run with CUDA graphs."""
    run, graphs = (_load(out_dir / f"W2_latency_{m}.json") for m in (label, "graphs"))
    if run is None or graphs is None:
        return ["W2_latency", configuration, "missing (see its log)", "", ""]
    return ["W2_latency", configuration, f"{run['avg_latency']:.4g} s",
            f"{graphs['avg_latency']:.4g} s", f"{graphs['avg_latency'] / run['avg_latency']:.2f}x"]


def table(out_dir: Path) -> None:
    from octavo.entrypoints.table import format_table

    rows: list[list[object]] = []
    tests = out_dir / "tests.summary"
    rows.append(["kernel tests on the GPU", "pytest tests/triton tests/cuda",
                 tests.read_text().strip() if tests.exists() else "not run", "", ""])
    for row in _load(out_dir / "kernels.json") or []:
        rows.append([row["kernel"], row["shape"], f"{row['triton_us']:.1f} us",
                     f"{row['torch_us']:.1f} us", f"{row['torch_us'] / row['triton_us']:.2f}x"])
    for name, key, unit, higher_is_better in WORKLOAD_FIGURES:
        graphs = _load(out_dir / f"{name}_graphs.json")
        eager = _load(out_dir / f"{name}_eager.json")
        if graphs is None or eager is None:
            rows.append([name, "--backend cuda", "missing (see its log)", "", ""])
            continue
        ratio = graphs[key] / eager[key] if higher_is_better else eager[key] / graphs[key]
        rows.append([name, "--backend cuda: graphs | --enforce-eager",
                     f"{graphs[key]:.4g} {unit}", f"{eager[key]:.4g} {unit}", f"{ratio:.2f}x"])
    rows.append(_w2_against_graphs(out_dir, "mp", "TP=1: mp executor | in-process worker"))
    rows.append(_w2_against_graphs(out_dir, "async",
                                   "graphs: --async-scheduling | one step at a time"))
    staged, serial = (_load(out_dir / f"W1_throughput_{m}.json") for m in ("pp2", "pp2-serial"))
    if staged is not None and serial is not None:  # two GPUs only
        key = "output_tokens_per_second"
        rows.append(["W1_throughput", "PP=2: micro-batches | one step at a time",
                     f"{staged[key]:.4g} output tok/s", f"{serial[key]:.4g} output tok/s",
                     f"{staged[key] / serial[key]:.2f}x"])
    rows.append(["GPU memory", "W1_throughput, graphs",
                 _memory_line(out_dir / "W1_throughput_graphs.log"), "", ""])
    print(format_table(["check", "configuration", "octavo (triton / graphs)",
                        "reference (torch / eager)", "speedup"], rows))


if __name__ == "__main__":
    command, out = sys.argv[1], Path(sys.argv[2])
    {"weights": weights, "times": times, "table": table}[command](out)
