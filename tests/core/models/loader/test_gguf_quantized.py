"""GGUF weights kept in their quantized blocks (``--quantization gguf``):
the model built on the blocks computes what the dense one (``--quantization none``) does,
the conversion cache keeps the blocks, and tensor parallelism splits them on block
boundaries or refuses with the numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from octavo import LLM, SamplingParams, paths
from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.cpu import kernels
from octavo.cpu.quant import attach_quant_gemms
from octavo.cpu.quant_gemm import quant_kernels_available
from octavo.models.build import build_model
from octavo.models.layers.gguf import GgufConfig, GgufLinearMethod
from octavo.models.layers.linear import ColumnParallelLinear, RowParallelLinear
from octavo.models.layers.quantization import quantization_scope
from octavo.models.loader import gguf_cache, load_model_files
from octavo.models.loader.dequant import GgmlType
from octavo.models.loader.quantized import GgufTensor
from octavo.testing.seeds import draw_seed
from octavo.worker.worker import matmul_weight_bytes
from tests.core.cpu.test_cpu_decode_layer_quant import fused_and_layer_by_layer
from tests.core.loader_helpers import TinyGguf, random_raw
from tests.core.models.loader.test_loader_gguf import ALL_TYPES
from tests.core.models.test_models_parity import PagedDriver

# Every matrix of the tiny model (its norms stay F32).
MATRICES = ("token_embd", "output", *(f"blk.{i}.{t}" for i in (0, 1) for t in (
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")))
UNIFORM = {f"{name}.weight": GgmlType.Q4_1 for name in MATRICES} | {
    "token_embd.weight": GgmlType.Q8_0}
# Layers that keep their blocks with ALL_TYPES: the others take an F16/BF16/F32 part or
# fuse parts of several types.
ALL_TYPES_KEPT = {"model.layers.0.self_attn.o_proj"}
PROMPTS = ("The capital of France is Paris, a city known for its museums, its cafes and the "
           "river that runs through it. Every year, millions of visitors",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + ",
           "Once upon a time, in a small village by the sea, there lived an old fisherman "
           "who every morning rowed out beyond the rocks to")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(folder))
    return folder


def _logits(model, prompts: list[list[int]], seed: int) -> dict[int, torch.Tensor]:
    return PagedDriver(model, seed).step(dict(enumerate(prompts)))


@pytest.mark.parametrize("types", [UNIFORM, ALL_TYPES], ids=["q4_1-q8_0", "mixed-k-quants"])
def test_the_quantized_model_computes_what_the_dense_one_does(
        cache_dir: Path, tmp_path: Path, types) -> None:
    """fp32, portable path: the blocks dequantized per call are the dense weights, so the
    logits agree to rounding. A fused layer whose parts come in several types (ALL_TYPES'
    q/k/v) keeps dense weights; the others keep their blocks."""
    seed = draw_seed()
    path = tmp_path / "tiny.gguf"
    TinyGguf(types=types).write(path, np.random.default_rng(seed))
    files = load_model_files(path)
    quantized = build_model(files, torch.float32, TorchAttentionBackend,
                            quantization="gguf")
    dense = build_model(load_model_files(path), torch.float32, TorchAttentionBackend,
                        quantization="none")
    methods = {name: module.quant_method for name, module in quantized.named_modules()
               if isinstance(getattr(module, "quant_method", None), GgufLinearMethod)}
    kept = {name for name, method in methods.items() if not method.dense}
    assert kept == (set(methods) if types is UNIFORM else ALL_TYPES_KEPT), f"seed={seed}"
    assert quantized.model.embed_tokens.weight.dtype == torch.uint8, f"seed={seed}"
    assert quantized.lm_head.weight.dtype == torch.uint8, f"seed={seed}"
    if types is UNIFORM:  # every projection and the head in Q4_1 blocks
        check_matmul_weight_bytes(path, quantized, dense)
    prompts = [[int(t) for t in np.random.default_rng(seed).integers(0, 200, n)]
               for n in (1, 7, 19)]
    ours, expected = _logits(quantized, prompts, seed), _logits(dense, prompts, seed)
    for seq in expected:
        torch.testing.assert_close(ours[seq], expected[seq], rtol=1e-4, atol=1e-4,
                                   msg=f"seed={seed} prompt {seq}")


def check_matmul_weight_bytes(path: Path, quantized: torch.nn.Module,
                              dense: torch.nn.Module) -> None:
    """What ``octavo bench sweep``'s roofline streams (``matmul_weight_bytes``): the file's
    projection and head blocks at their size; dense fp32, 4 bytes for each of those weights."""
    blocks = [tensor for name, tensor in load_model_files(path).iter_weights()
              if isinstance(tensor, GgufTensor) and "embed_tokens" not in name]
    weights = sum(int(np.prod(tensor.shape)) for tensor in blocks)
    assert matmul_weight_bytes(quantized) == (sum(t.blocks.nbytes for t in blocks), weights)
    assert matmul_weight_bytes(dense) == (4 * weights, weights)


def test_the_cache_keeps_the_blocks(cache_dir: Path, tmp_path: Path) -> None:
    seed = draw_seed()
    path = tmp_path / "tiny.gguf"
    TinyGguf(types=UNIFORM).write(path, np.random.default_rng(seed))
    first = dict(load_model_files(path).iter_weights())  # converts
    cached = dict(load_model_files(path).iter_weights())  # reads the entry
    for name, tensor in first.items():
        again = cached[name]
        if isinstance(tensor, GgufTensor):
            assert isinstance(again, GgufTensor), f"seed={seed} {name}"
            assert (again.ggml_type, again.shape) == (tensor.ggml_type, tensor.shape), name
            assert torch.equal(again.blocks, tensor.blocks), f"seed={seed} {name}"
        else:
            assert torch.equal(again, tensor), f"seed={seed} {name}"
    entry = gguf_cache.entry_path(path) / gguf_cache.WEIGHTS
    fp32_bytes = sum(4 * int(np.prod(t.shape)) for t in first.values())
    print(f"seed={seed} gguf {path.stat().st_size} B, entry {entry.stat().st_size} B, "
          f"fp32 {fp32_bytes} B")
    assert entry.stat().st_size < 1.1 * path.stat().st_size, f"seed={seed}"
    assert entry.stat().st_size < fp32_bytes / 4, f"seed={seed}"


def _blocks(ggml_type: GgmlType, rows: int, cols: int, seed: int) -> GgufTensor:
    raw = random_raw(ggml_type, (rows, cols), np.random.default_rng(seed))
    return GgufTensor(int(ggml_type), torch.from_numpy(raw.copy()), (rows, cols))


@pytest.mark.parametrize("layer_class", [ColumnParallelLinear, RowParallelLinear])
def test_tensor_parallel_ranks_split_the_blocks(layer_class) -> None:
    """Each rank's shard, dequantized, is its slice of the whole dense weight."""
    seed = draw_seed()
    weight = _blocks(GgmlType.Q4_K, 64, 512, seed)  # 2 Q4_K blocks of 256 per row
    dense = weight.dequantize()
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(seed))
    total = torch.zeros(3, 64)
    for rank in range(2):
        with quantization_scope(GgufConfig()):
            layer = layer_class(512, 64, tp_rank=rank, tp_size=2)
        layer.weight.weight_loader(layer.weight, weight)
        assert layer.weight.dtype == torch.uint8, f"seed={seed}"
        if layer_class is ColumnParallelLinear:
            expected = x @ dense[rank * 32:(rank + 1) * 32].T
            torch.testing.assert_close(layer.quant_method.apply(layer, x), expected,
                                       msg=f"seed={seed} rank {rank}")
        else:
            total += layer.quant_method.apply(layer, x[:, rank * 256:(rank + 1) * 256])
    if layer_class is RowParallelLinear:
        # Two partial sums, added: fp32 rounding of another order (outputs reach ~3e3,
        # whose ulp is 2.4e-4).
        torch.testing.assert_close(total, x @ dense.T, rtol=1e-5, atol=1e-3, msg=f"seed={seed}")


def test_an_input_split_off_block_boundaries_is_refused_with_the_numbers() -> None:
    with quantization_scope(GgufConfig()):
        layer = RowParallelLinear(512, 64, tp_rank=0, tp_size=4)  # 128 per rank, Q4_K: 256
    with pytest.raises(ValueError, match=r"128 input features are not whole Q4_K blocks of "
                                         r"256 \(this rank's share of 512 input features "
                                         r"split over 4 tensor-parallel ranks\)"):
        layer.weight.weight_loader(layer.weight, _blocks(GgmlType.Q4_K, 64, 512, 0))


@pytest.fixture(scope="module")
def default_models():
    """The default model (SmolLM2-135M, Q4_1 with a Q8_0 embedding) in bf16, on its blocks
    (multiplied by the CPU's quantized kernels where they are built) and dense, from one
    read of its files."""
    files = load_model_files(None)
    tokens = [files.tokenizer.encode(p) for p in PROMPTS]
    quantized = build_model(files, torch.bfloat16, TorchAttentionBackend, quantization="gguf")
    kernels = attach_quant_gemms(quantized)  # as CpuPlatform.prepare_model does
    print(f"quantized CPU kernels on {kernels} layers")
    # Per layer qkv, o, gate/up and down (the file's 210 Q4_1 tensors, fused), and the head.
    layers = 4 * len(quantized.model.layers) + 1
    assert kernels == (layers if quant_kernels_available() else 0)
    dense = build_model(files, torch.bfloat16, TorchAttentionBackend, quantization="none")
    return quantized, dense, tokens


def test_default_model_teacher_forced_greedy_agrees_with_dense(default_models) -> None:
    """The greedy token at every position of a few prompts, the quantized kernels (fp32
    sums of bf16 activations) vs the dense bf16 option (bar: >= 95%)."""
    quantized, dense, prompts = default_models
    seed = draw_seed()
    ours, expected = _logits(quantized, prompts, seed), _logits(dense, prompts, seed)
    agree = total = 0
    for seq in expected:
        agree += int((ours[seq].argmax(-1) == expected[seq].argmax(-1)).sum())
        total += len(expected[seq])
    print(f"seed={seed}: {agree}/{total} teacher-forced greedy positions agree")
    assert agree >= 0.95 * total, f"seed={seed}: {agree}/{total}"


def test_the_engine_generates_on_the_default_gguf_kept_in_blocks(
        default_models, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end (the engine on the CPU platform, its quantized kernels): greedy tokens as
    the dense model's, from the weights kept in their blocks (``--quantization gguf``); and
    where the fused decode stack runs them, its tokens and logprobs are those of the layers
    one by one (the same kernels)."""
    _, dense, prompts = default_models
    llm = LLM(max_model_len=256, kv_cache_memory=32 * 2**20, quantization="gguf",
              enable_prefix_caching=False)  # fused_and_layer_by_layer's prefills alike
    model = llm.llm_engine.core.executor.worker.runner.model
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.uint8
    out = llm.generate([{"prompt_token_ids": prompts[0]}],
                       SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    generated = list(out[0].outputs[0].token_ids)
    driver, tokens, expected = PagedDriver(dense, 0), prompts[0], []
    for _ in range(2):
        expected.append(int(driver.step({0: tokens})[0][-1].argmax()))
        tokens = expected[-1:]
    assert generated == expected
    if not kernels.pair_gemm_available():
        return  # no fused stack on this CPU
    for i, (fused, one_by_one, fused_lp, one_by_one_lp) in enumerate(
            fused_and_layer_by_layer(llm, prompts, monkeypatch, max_tokens=6)):
        assert fused == one_by_one, f"prompt {i}"
        assert fused_lp == one_by_one_lp, f"prompt {i}: same kernels, same bits"
