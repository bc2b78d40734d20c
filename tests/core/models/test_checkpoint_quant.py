"""AWQ, GPTQ, fp8 and compressed-tensors checkpoints (issue 52), written from each format's
spec (quant_checkpoints.py), against the dense weights they stand for.

The bounds. A 4-bit or 8-bit integer weight runs as GGUF blocks (int_weights.py) whose fp16
``d = s`` and ``m = -z * s`` move each weight by at most ``2^-11 (|z s| + |q s|)``
(:func:`block_bound`); the products add fp32 rounding (``gamma_n`` of Higham 3.1). fp8
weights are dequantized exactly (e4m3 times an fp32 scale). A layout error (a field order,
an offset, a transposed group) moves weights by whole quantization steps, far above these.
The model-level logits: within fp32's ``ATOL`` of the model whose weights are what the
blocks hold, and within ``MODEL_RTOL`` (1%) of the largest logit of the model dequantized
exactly to fp32 (the fp16 rounding above is ~0.1% of a weight; measured 0.06-0.25% of the
largest logit), teacher-forced greedy picks >= 99% the exact model's.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.cpu import quant_gemm
from octavo.cpu.quant import attach_quant_gemms
from octavo.models.build import build_model
from octavo.models.layers.checkpoint_configs import (
    AwqConfig,
    CompressedTensorsConfig,
    Fp8Config,
    GptqConfig,
)
from octavo.models.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from octavo.models.layers.moe import FusedMoE
from octavo.models.layers.quantization import QuantizationConfig, quantization_scope
from octavo.models.loader import ModelLoadError, load_model_files
from octavo.testing import quant_checkpoints as qc
from octavo.testing.seeds import draw_seed
from tests.core.models.test_models_parity import PagedDriver
from tests.core.tiny_models import VOCAB_SIZE, save_tiny_model

pytestmark = pytest.mark.usefixtures("single_thread")

U = 2.0 ** -24
FP16_U = 2.0 ** -11
ATOL = 1e-4  # fp32 parity, as tests/core/models/test_models_parity.py
MODEL_RTOL = 0.01
# The share of a mixture of experts' positions that may be routed to other experts than in a
# dequantized form of the same model (check_against_dequantized): AWQ g32 on the tiny Mixtral
# swapped 0 or 1 of 101 positions in eight fresh draws; a wrong expert or router would route
# most of them otherwise.
ROUTE_SWAPS = 0.05
IN_FEATURES = 256  # groups of 32, 64 and 128 divide it
OUT_SIZES = (40, 88)  # a fused gate/up of odd sizes (multiples of 8, as AWQ packs)


def _ct(weights: dict, inputs: dict | None = None, fmt: str = "pack-quantized") -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": inputs}}}


def _gptq(bits: int, group: int, desc_act: bool, sym: bool, fmt: str = "gptq") -> dict:
    return {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": desc_act,
            "sym": sym, "checkpoint_format": fmt}


W4 = {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 64, "symmetric": True}
# name: (quantizer, config.json's quantization_config)
FORMATS = {
    "awq-g32": (qc.awq(32), {"quant_method": "awq", "bits": 4, "group_size": 32,
                             "zero_point": True, "version": "gemm"}),
    "awq-g64": (qc.awq(64), {"quant_method": "awq", "bits": 4, "group_size": 64,
                             "zero_point": True, "version": "gemm"}),
    "awq-g128": (qc.awq(128), {"quant_method": "awq", "bits": 4, "group_size": 128,
                               "zero_point": True, "version": "gemm"}),
    "gptq-4bit-g64-sym": (qc.gptq(4, 64, True, False, 0), _gptq(4, 64, False, True)),
    "gptq-4bit-g32-asym-act-order": (qc.gptq(4, 32, False, True, 1),
                                     _gptq(4, 32, True, False)),
    "gptq-8bit-per-channel-v2": (qc.gptq(8, -1, True, False, 2, v2=True),
                                 _gptq(8, -1, False, True, "gptq_v2")),
    "gptq-8bit-asym-g128": (qc.gptq(8, 128, False, False, 3), _gptq(8, 128, False, False)),
    "ct-w4a16": (qc.ct_packed(4, 64, True), _ct(W4)),
    "ct-w4a16-asym": (qc.ct_packed(4, 128, False),
                      _ct({**W4, "group_size": 128, "symmetric": False})),
    "ct-w8a8-int8": (qc.ct_int8, _ct({"type": "int", "num_bits": 8, "strategy": "channel",
                                      "symmetric": True},
                                     {"type": "int", "num_bits": 8, "strategy": "token",
                                      "dynamic": True, "symmetric": True}, "int-quantized")),
    "fp8-per-tensor-static": (qc.fp8(False, True), {"quant_method": "fp8",
                                                    "activation_scheme": "static"}),
    "ct-fp8-per-channel": (qc.fp8(True, False), _ct(
        {"type": "float", "num_bits": 8, "strategy": "channel", "symmetric": True},
        {"type": "float", "num_bits": 8, "strategy": "token", "dynamic": True},
        "float-quantized")),
}
CONFIG_CLASSES: dict[str, type[QuantizationConfig]] = {
    "awq": AwqConfig, "gptq": GptqConfig, "fp8": Fp8Config,
    "compressed-tensors": CompressedTensorsConfig}


def config_of(quantization_config: dict) -> QuantizationConfig:
    return CONFIG_CLASSES[quantization_config["quant_method"]].from_config(quantization_config)


def block_bound(x: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """What the fp16 block scales and fp32 sums may move ``x @ reference.T`` by (module
    docstring): ``|z s|`` is at most about the row's largest ``|w|`` (the group's minimum
    or half its range), ``|q s| <= |w| + |z s|``; taken twice over, plus fp32's gamma_n."""
    magnitude = x.abs() @ reference.abs().T
    n = x.shape[-1]
    return (4 * FP16_U + n * U) * magnitude + 4 * FP16_U * x.abs() @ (
        reference.abs().amax(1, keepdim=True).expand_as(reference)).T + 1e-6


def load_layer(name: str, weights: list[torch.Tensor], layer_type: str = "merged"):
    quantizer, quant_config = FORMATS[name]
    config = config_of(quant_config)
    with quantization_scope(config):
        layer = (MergedColumnParallelLinear(IN_FEATURES, OUT_SIZES, tp_rank=0, tp_size=1)
                 if layer_type == "merged" else
                 RowParallelLinear(IN_FEATURES, OUT_SIZES[0], tp_rank=0, tp_size=1))
    references = []
    for shard, w in enumerate(weights):
        tensors, reference, _ = quantizer(w)
        references.append(reference)
        params = dict(layer.named_parameters())
        for suffix, tensor in tensors.items():
            param = params[suffix]
            param.weight_loader(param, tensor, shard if layer_type == "merged" else None)
    layer.quant_method.process_weights_after_loading(layer)
    return layer, torch.cat(references)


@pytest.mark.parametrize("name", FORMATS)
def test_a_layer_multiplies_as_its_dequantized_weights(name, monkeypatch):
    """Each format in a fused gate/up layer: the portable apply and the CPU's kernel (where
    the weight became blocks) against the dense weight the checkpoint stands for."""
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(size, IN_FEATURES, generator=gen) * 0.05 for size in OUT_SIZES]
    layer, reference = load_layer(name, weights)
    for rows in (1, 3, 19):
        x = torch.randn(rows, IN_FEATURES, generator=gen)
        expected = x @ reference.T
        bound = block_bound(x, reference)
        got = layer(x)
        assert ((got - expected).abs() <= bound).all(), (
            f"{name}: portable apply off by {(got - expected).abs().max():.3e}")
        if not attach_quant_gemms(layer):
            continue  # not blocks (or no kernels here): the portable apply only
        # The fp32 kernels, then the VNNI ones on activations quantized per 32 values
        # (each off by at most half a step, max|x_block| / 254: bounded by the row's).
        q8_error = x.abs().amax(-1, keepdim=True) / 254 * reference.abs().sum(1)
        for q8, allowed in ((False, bound), (True, bound + q8_error)):
            monkeypatch.setattr(quant_gemm, "Q8_ACTIVATIONS", q8)
            got = layer(x)
            assert ((got - expected).abs() <= allowed).all(), (
                f"{name}: CPU kernel (Q8 activations {q8}) off by "
                f"{(got - expected).abs().max():.3e}")
        layer.cpu_gemm = None


def test_int_weights_become_blocks_where_they_can():
    """4-bit groups and symmetric 8-bit weights run as Q4_1 / Q8_0 blocks (act-order with a
    permutation of the inputs); asymmetric 8-bit ones stay integers, dequantized per call."""
    gen = torch.Generator().manual_seed(draw_seed())
    weights = [torch.randn(size, IN_FEATURES, generator=gen) for size in OUT_SIZES]
    kinds = {}
    for name in ("awq-g32", "gptq-4bit-g32-asym-act-order", "ct-w8a8-int8",
                 "gptq-8bit-asym-g128", "fp8-per-tensor-static"):
        method = load_layer(name, weights)[0].quant_method
        blocks = getattr(method, "weight", None)
        kinds[name] = (getattr(blocks, "ggml_type", None),
                       getattr(method, "perm", None) is not None)
    assert kinds == {"awq-g32": (3, False), "gptq-4bit-g32-asym-act-order": (3, True),
                     "ct-w8a8-int8": (8, False), "gptq-8bit-asym-g128": (None, False),
                     "fp8-per-tensor-static": (None, False)}


def quantized_model(tmp_path_factory, dense: Path, name: str) -> tuple[Path, Path, Path]:
    """The checkpoint, its exact dequantized model and the model as blocks hold it."""
    return quantized_model_in(tmp_path_factory.mktemp(name), dense, name)


# The tiny models the quantized checkpoints are written from: sizes in whole groups of 32,
# on each of two ranks too (a Mixtral of 4 experts of intermediate 64, 2 per token).
TINY_SIZES = {"llama": dict(hidden_size=128, head_dim=32, intermediate_size=256),
              "mixtral": dict(hidden_size=128, head_dim=32, intermediate_size=64)}


def tiny_quantized_model(root: Path, name: str, seed: int, arch: str = "llama") -> Path:
    """A tiny ``arch`` model of ``seed`` written under ``root`` as checkpoint ``name`` (and
    its dense, exact and blocks forms beside it): the checkpoint's folder."""
    save_tiny_model(arch, root / "dense", seed, **TINY_SIZES[arch])
    quantized_model_in(root, root / "dense", name)
    return root / "q"


def quantized_model_in(root: Path, dense: Path, name: str) -> tuple[Path, Path, Path]:
    """``quantized_model`` in the folder ``root``."""
    quantizer, quant_config = FORMATS[name]
    qc.quantize_folder(dense, root / "q", root / "exact", root / "blocks", quantizer,
                       quant_config)
    return root / "q", root / "exact", root / "blocks"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model("llama", folder, draw_seed(), **TINY_SIZES["llama"])
    return folder


@dataclass
class PromptRun:
    """A model's logits at every prompt position, and where it is a mixture of experts the
    experts each MoE layer sent each position to."""

    logits: torch.Tensor  # [T, vocab]
    routes: torch.Tensor | None  # [T, MoE layers, top-k] expert ids, sorted; None: no MoE

    def same_routes(self, other: PromptRun) -> torch.Tensor:
        """[T] bool: whether every MoE layer sent the position to the same experts in both
        runs (all True without MoE)."""
        if self.routes is None or other.routes is None:
            return torch.ones(len(self.logits), dtype=torch.bool)
        return (self.routes == other.routes).flatten(1).all(1)


def prompt_run(folder: Path, prompts: list[list[int]], kernels: bool) -> PromptRun:
    model = build_model(load_model_files(str(folder)), torch.float32, TorchAttentionBackend)
    if kernels:
        attach_quant_gemms(model)
    routes: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, FusedMoE):  # forward(x, weights, expert_ids)
            module.register_forward_hook(
                lambda _m, args, _out: routes.append(args[2].sort(-1).values))
    driver = PagedDriver(model, 0)
    out = driver.step(dict(enumerate(prompts)))
    return PromptRun(torch.cat([out[i] for i in range(len(prompts))]),
                     torch.stack(routes, 1) if routes else None)


def prompt_logits(folder: Path, prompts: list[list[int]], kernels: bool) -> torch.Tensor:
    return prompt_run(folder, prompts, kernels).logits


@pytest.mark.parametrize("name", ["awq-g128", "gptq-4bit-g32-asym-act-order", "ct-w8a8-int8",
                                  "fp8-per-tensor-static", "ct-w4a16-asym"])
def test_a_tiny_llama_checkpoint_matches_its_dequantized_model(name, tiny_llama,
                                                               tmp_path_factory):
    """The checkpoint's logits at every prompt position (portable, then on the CPU's
    kernels): within fp32's ``ATOL`` of the model as its blocks hold it, within
    ``MODEL_RTOL`` of the largest logit of the exact dequantized model, whose greedy picks
    they share wherever that bound cannot flip them (``check_against_dequantized``)."""
    check_against_dequantized(name, *quantized_model(tmp_path_factory, tiny_llama, name))


def check_against_dequantized(name: str, folder: Path, exact_folder: Path,
                              blocks_folder: Path) -> None:
    """The checks of the test above, on a checkpoint and its two dequantized forms; greedy
    picks must agree wherever the exact model's top two logits are further apart than twice
    the logits' bound (at a nearer tie the format's rounding may pick the other: on 101
    positions of a tiny random model that happened at 0-2 positions, so a share of 99%
    would fail now and then on a fresh draw; the share is printed). In a
    mixture of experts they hold at the positions every MoE layer routed alike in both
    models: a router's top-k is discontinuous, and the blocks' fp16 rounding (or fp32's,
    between the kernels and the dense model) can swap two experts whose router logits are
    within it, which moves that position's output by the experts' difference, not by the
    rounding. Such swaps are counted and must stay rare (``ROUTE_SWAPS``)."""
    gen = torch.Generator().manual_seed(draw_seed())
    prompts = [torch.randint(0, VOCAB_SIZE, (n,), generator=gen).tolist() for n in (37, 64)]
    exact = prompt_run(exact_folder, prompts, kernels=False)
    as_blocks = prompt_run(blocks_folder, prompts, kernels=False)
    for kernels in (False, True):
        run = prompt_run(folder, prompts, kernels)
        alike, alike_blocks = run.same_routes(exact), run.same_routes(as_blocks)
        logits, bound = run.logits, MODEL_RTOL * exact.logits.abs().max().item()
        diff = (logits - exact.logits)[alike].abs().max().item()
        blocks_diff = (logits - as_blocks.logits)[alike_blocks].abs().max().item()
        same = (logits.argmax(-1) == exact.logits.argmax(-1))[alike]
        top2 = exact.logits[alike].topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * bound  # no logit within the bound can flip it
        print(f"{name} kernels={kernels}: logit diff {diff:.2e} from the exact model "
              f"(max |logit| {exact.logits.abs().max():.2f}), {blocks_diff:.2e} from the "
              f"blocks', greedy agreement {same.float().mean():.3f} ({int(clear.sum())} clear "
              f"picks); positions routed otherwise than the exact model "
              f"{int((~alike).sum())}, than the blocks' {int((~alike_blocks).sum())} of "
              f"{len(alike)}")
        assert (~alike).float().mean() <= ROUTE_SWAPS, f"{name}: {int((~alike).sum())} swaps"
        assert (~alike_blocks).float().mean() <= ROUTE_SWAPS, f"{name}: swaps against blocks"
        assert blocks_diff < ATOL, f"{name}: {blocks_diff:.2e} from the model as blocks"
        assert diff < bound, f"{name}: {diff:.2e} from exact"
        assert same[clear].all(), f"{name}: a pick the bound cannot flip differs"


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory) -> Path:
    """A tiny Mixtral whose experts' sizes are whole groups of 32 (hidden 128, 4 experts of
    intermediate 64) and whose router picks 2 of them."""
    folder = tmp_path_factory.mktemp("tiny-mixtral")
    save_tiny_model("mixtral", folder, draw_seed(), **TINY_SIZES["mixtral"])
    return folder


@pytest.mark.parametrize("name", ["awq-g32", "fp8-per-tensor-static", "ct-w4a16"])
def test_a_tiny_mixtral_checkpoint_with_quantized_experts_matches_its_dequantized_model(
        name, tiny_mixtral, tmp_path_factory, monkeypatch):
    """Every expert's w1/w3/w2 quantized (the router dense, as the tools leave it): each
    expert is an ``ExpertMLP`` of the checkpoint's method, and the logits (portable, then on
    the CPU's kernels) are within the bounds of the Llama test above. The kernels run with
    fp32 activations: an expert's few tokens would take the VNNI kernels, whose int8
    activations move logits by ~0.2 here (their bound is test_quant_gemm's; the whole
    prompt of the Llama test above takes fp32 panels instead)."""
    monkeypatch.setattr(quant_gemm, "Q8_ACTIVATIONS", False)
    folders = quantized_model(tmp_path_factory, tiny_mixtral, name)
    model = build_model(load_model_files(str(folders[0])), torch.float32, TorchAttentionBackend)
    experts = model.model.layers[0].mlp.experts
    assert experts.quantized is not None and len(experts.quantized) == 4
    assert not experts.quantized["0"].down_proj.quant_method.dense
    assert model.model.layers[0].mlp.gate.quant_method.dense  # the router
    check_against_dequantized(name, *folders)


@pytest.mark.parametrize("ignored", [["gate"], ["re:.*block_sparse_moe.gate$", "lm_head"],
                                     ["model.layers.0.block_sparse_moe.gate"]])
def test_a_config_may_leave_the_routers_unquantized(ignored):
    """The tools list the MoE routers (and the LM head) as unquantized: moot here, where
    both are dense anyway; any other layer left unquantized is refused, named."""
    config_of({"quant_method": "fp8", "activation_scheme": "dynamic",
               "ignored_layers": ignored})
    config_of({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
               "version": "gemm", "modules_to_not_convert": ignored})
    with pytest.raises(ValueError, match="not 'model.layers.0.mlp.down_proj'"):
        config_of({"quant_method": "fp8", "ignored_layers":
                   [*ignored, "model.layers.0.mlp.down_proj"]})


def _refused(tmp_path_factory, tiny_llama, name: str, message: str, edit=None,
             config_edit=None) -> None:
    folder = quantized_model(tmp_path_factory, tiny_llama, name)[0]
    if edit is not None:
        from safetensors.torch import load_file, save_file
        tensors = load_file(folder / "model.safetensors")
        edit(tensors)
        save_file(tensors, folder / "model.safetensors")
    if config_edit is not None:
        config = json.loads((folder / "config.json").read_text())
        config_edit(config["quantization_config"])
        (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=message):
        build_model(load_model_files(str(folder)), torch.float32, TorchAttentionBackend)


LAYER = "model.layers.0.mlp.down_proj."


@pytest.mark.parametrize("case", [
    ("awq-g32", r"quant_method 'bitsandbytes' is not supported",
     None, lambda c: c.update(quant_method="bitsandbytes")),
    ("awq-g32", r"version='gemv' is not supported", None, lambda c: c.update(version="gemv")),
    ("fp8-per-tensor-static", r"weight_block_size=\[128, 128\] is not supported", None,
     lambda c: c.update(weight_block_size=[128, 128])),
    ("awq-g32", rf"missing: {LAYER}scales", lambda t: t.pop(LAYER + "scales"), None),
    ("awq-g32", rf"'{LAYER}qzeros'.*expected shape \[8, 16\]",
     lambda t: t.update({LAYER + "qzeros": t[LAYER + "qzeros"][:4]}), None),
    ("gptq-4bit-g32-asym-act-order", rf"'{LAYER}g_idx'.*outside the 8 groups",
     lambda t: t[LAYER + "g_idx"].__setitem__(0, 8), None),
    ("gptq-4bit-g64-sym", r"group size 96 does not divide the 128 input features",
     None, lambda c: c.update(group_size=96)),
    ("ct-w4a16", rf"'{LAYER}weight_scale'.*expected bfloat16|weight_scale.*expected",
     lambda t: t.update({LAYER + "weight_scale": t[LAYER + "weight_scale"].int()}), None),
], ids=lambda case: case[1][:40])
def test_a_checkpoint_that_disagrees_with_its_config_is_refused(case, tiny_llama,
                                                                tmp_path_factory):
    name, message, edit, config_edit = case
    _refused(tmp_path_factory, tiny_llama, name, message, edit, config_edit)


def test_a_row_split_that_cuts_a_group_is_refused():
    with quantization_scope(config_of(FORMATS["gptq-4bit-g64-sym"][1])), pytest.raises(
            ValueError, match="192 input features over 2 .* 96 each, which cuts groups of 64"):
        RowParallelLinear(192, 64, tp_rank=0, tp_size=2)


def test_act_order_and_per_row_scales_replicate_on_a_row_split():
    """A row-parallel rank of an act-order (or per-row) layer keeps every group's scales
    and its slice of g_idx: the two ranks' partial products sum to the whole."""
    gen = torch.Generator().manual_seed(draw_seed())
    w = torch.randn(48, 2 * IN_FEATURES, generator=gen) * 0.05
    x = torch.randn(3, 2 * IN_FEATURES, generator=gen)
    for name in ("gptq-4bit-g32-asym-act-order", "gptq-8bit-per-channel-v2", "awq-g32"):
        quantizer, quant_config = FORMATS[name]
        tensors, reference, _ = quantizer(w)
        total = torch.zeros(3, 48)
        for rank in range(2):
            with quantization_scope(config_of(quant_config)):
                layer = RowParallelLinear(2 * IN_FEATURES, 48, tp_rank=rank, tp_size=2)
            params = dict(layer.named_parameters())
            for suffix, tensor in tensors.items():
                params[suffix].weight_loader(params[suffix], tensor)
            layer.quant_method.process_weights_after_loading(layer)
            total += layer.quant_method.apply(layer, x.chunk(2, -1)[rank])
        expected = x @ reference.T
        assert ((total - expected).abs() <= block_bound(x, reference)).all(), name


def test_quantized_layers_leave_embeddings_dense(tiny_llama, tmp_path_factory):
    folder = quantized_model(tmp_path_factory, tiny_llama, "awq-g32")[0]
    files = load_model_files(str(folder))
    assert files.quantization == "awq"
    model = build_model(files, torch.float32, TorchAttentionBackend)
    assert model.model.embed_tokens.quant_method.dense
    assert model.lm_head.quant_method.dense


def test_autoawq_dequantizes_the_awq_fixture_as_octavo_does():
    """AutoAWQ's own dequantizer (``awq/utils/packing_utils.py``, loaded by path: the
    package's ``__init__`` needs datasets and triton) reads the AWQ fixture's tensors back
    as the weight octavo loads. AutoAWQ is not a CI dependency (it pulls triton): skipped
    where it is not installed."""
    spec = importlib.util.find_spec("awq")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip("autoawq is not installed")
    path = Path(spec.submodule_search_locations[0]) / "utils" / "packing_utils.py"
    module_spec = importlib.util.spec_from_file_location("awq_packing_utils", path)
    assert module_spec is not None and module_spec.loader is not None
    packing = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(packing)
    gen = torch.Generator().manual_seed(draw_seed())
    w = torch.randn(OUT_SIZES[0], IN_FEATURES, generator=gen) * 0.05
    tensors, reference, _ = qc.awq(64)(w)
    theirs = packing.dequantize_gemm(tensors["qweight"], tensors["qzeros"], tensors["scales"],
                                     4, 64)  # [in, out]
    # AutoAWQ multiplies in fp16: each value rounded once (2^-11 of it); a wrong field
    # order or zero would be off by whole steps.
    torch.testing.assert_close(theirs.float().T, reference, rtol=FP16_U, atol=0)
    layer = load_layer("awq-g64", [w], "row")[0]
    x = torch.randn(2, IN_FEATURES, generator=gen)
    assert ((layer(x) - x @ theirs.float()).abs() <= block_bound(x, reference)).all()


@pytest.mark.parametrize(("actorder", "act_order"), [
    (None, False), ("weight", False), ("static", False), ("group", True), ("dynamic", True)])
def test_compressed_tensors_actorder_aliases(actorder, act_order):
    """compressed-tensors' ActivationOrdering: "static" is an alias of "weight" (calibration
    order only, no g_idx: llm-compressor 0.14's GPTQ default), "dynamic" of "group"."""
    config = CompressedTensorsConfig.from_config(_ct({**W4, "actorder": actorder}))
    assert config.method.act_order is act_order
