"""The quantization configs of safetensors checkpoints, read from config.json's
``quantization_config`` (vLLM's ``--quantization`` names: ``awq``, ``gptq``, ``fp8``,
``compressed-tensors``).

Each config checks the fields it relies on and refuses what it does not run with a
``ValueError`` naming the field and value (the builder adds the file): other bit widths,
AWQ's GEMV/Marlin layouts, fp8 block scales, compressed-tensors schemes other than W8A8
int8, W4A16/W8A16 and fp8, quantized LM heads. The embedding, the LM head and mixtures of
experts' routers stay dense, as these tools leave them; the experts themselves hold the
config's weights (``quantizes_experts``). The fields follow the tools' own config writers (AutoAWQ
``awq/models/base.py``, AutoGPTQ/GPTQModel ``quantize_config.py``, vLLM's ``fp8.py``,
compressed-tensors ``quantization/quant_config.py`` and ``quant_scheme.py``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from octavo.models.layers.checkpoint_formats import IntScheme
from octavo.models.layers.checkpoint_methods import Fp8LinearMethod, IntLinearMethod
from octavo.models.layers.quantization import (
    LinearMethodBase,
    QuantizationConfig,
    register_quantization_config,
)

GROUP_SIZES = (32, 64, 128)
# Names that only say "the LM head": the head is never quantized here, so they are moot.
LM_HEAD_NAMES = frozenset({"lm_head", "re:.*lm_head", "re:^lm_head$"})


def stays_dense(name: str) -> bool:
    """Whether a layer a config leaves unquantized (``ignore``, ``ignored_layers``,
    ``modules_to_not_convert``) is one that is dense here anyway: the LM head, or a mixture
    of experts' router (``gate``, Qwen2-MoE's ``shared_expert_gate``; routers are built
    outside the quantization scope) - by name, by a full module name or by a ``re:``
    pattern ending in one."""
    if name in LM_HEAD_NAMES:
        return True
    tail = name.removeprefix("re:").removesuffix("$").rsplit(".", 1)[-1]
    return tail in ("gate", "shared_expert_gate")


def check_unquantized(name: str, modules: list[str] | None) -> None:
    """Refuse a config that leaves some other layer unquantized (not built: every linear
    layer here holds the config's weights)."""
    others = [m for m in modules or [] if not stays_dense(m)]
    if others:
        raise ValueError(f"{name}={modules!r}: only the LM head and MoE routers may stay "
                         f"unquantized here (not {others[0]!r})")


def field(config: dict[str, Any], name: str, allowed: tuple, default: Any = None) -> Any:
    """``config[name]`` (``default`` where absent), refused unless it is one of ``allowed``."""
    value = config.get(name, default)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported (supported: "
                         f"{', '.join(map(repr, allowed))})")
    return value


class IntConfig(QuantizationConfig):
    """A config whose every linear layer holds integers of one :class:`IntScheme`."""

    quantizes_experts = True

    def __init__(self, scheme: IntScheme) -> None:
        self.scheme = scheme

    def get_linear_method(self, layer: nn.Module) -> LinearMethodBase:
        return IntLinearMethod(self.scheme)


@register_quantization_config
class AwqConfig(IntConfig):
    """AutoAWQ's GEMM checkpoints: 4-bit, groups of 32/64/128, zero points."""

    name = "awq"

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> AwqConfig:
        config = config or {}
        field(config, "bits", (4,), config.get("w_bit"))
        group = field(config, "group_size", GROUP_SIZES, config.get("q_group_size"))
        field(config, "zero_point", (True,), True)
        field(config, "version", ("gemm", "GEMM"), "gemm")
        check_unquantized("modules_to_not_convert", config.get("modules_to_not_convert"))
        return cls(IntScheme("awq", 4, group))


@register_quantization_config
class GptqConfig(IntConfig):
    """AutoGPTQ / GPTQModel checkpoints: 4- or 8-bit, any group (``-1``: per row),
    act-order (``desc_act``), symmetric or not."""

    name = "gptq"

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> GptqConfig:
        config = config or {}
        bits = field(config, "bits", (4, 8))
        group = config.get("group_size")
        if not isinstance(group, int) or not (group == -1 or group > 0):
            raise ValueError(f"group_size={group!r} is not -1 or a positive integer")
        layout = field(config, "checkpoint_format", ("gptq", "gptq_v2"), "gptq")
        field(config, "lm_head", (False,), False)
        act_order = field(config, "desc_act", (True, False), False)
        field(config, "sym", (True, False), True)
        return cls(IntScheme("gptq", bits, group, act_order,
                             zero_offset=1 if layout == "gptq" else 0))


@register_quantization_config
class Fp8Config(QuantizationConfig):
    """vLLM's ``fp8``: e4m3 weights with a per-tensor scale, static or dynamic activation
    scales; block-scaled (``weight_block_size``) checkpoints are refused."""

    name = "fp8"
    quantizes_experts = True

    def __init__(self, static_activations: bool) -> None:
        self.static_activations = static_activations

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> Fp8Config:
        config = config or {}
        scheme = field(config, "activation_scheme", ("static", "dynamic"), "dynamic")
        field(config, "weight_block_size", (None,))
        check_unquantized("ignored_layers", config.get("ignored_layers"))
        return cls(scheme == "static")

    def get_linear_method(self, layer: nn.Module) -> LinearMethodBase:
        return Fp8LinearMethod(self.static_activations)


@register_quantization_config
class CompressedTensorsConfig(QuantizationConfig):
    """llm-compressor's checkpoints: one config group targeting ``Linear`` with W8A8 int8
    (per-channel weights, per-token dynamic or static activations), W4A16 / W8A16 packed
    integers (groups or per channel, act-order, symmetric or not) or fp8 (per-tensor or
    per-channel weights)."""

    name = "compressed-tensors"
    quantizes_experts = True

    def __init__(self, method: IntScheme | bool) -> None:
        self.method = method  # an integer scheme, or fp8 with static activations or not

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> CompressedTensorsConfig:
        config = config or {}
        check_unquantized("ignore", config.get("ignore"))
        groups = config.get("config_groups") or {}
        if len(groups) != 1:
            raise ValueError(f"config_groups has {len(groups)} groups; one is supported")
        group = next(iter(groups.values()))
        field(group, "targets", (["Linear"],))
        weights = group.get("weights") or {}
        inputs = group.get("input_activations")
        fmt = field(group, "format", ("pack-quantized", "int-quantized", "float-quantized",
                                      "naive-quantized"), config.get("format"))
        if weights.get("type") == "float":
            return cls(_ct_fp8(weights, inputs))
        return cls(_ct_int(weights, inputs, fmt))

    def get_linear_method(self, layer: nn.Module) -> LinearMethodBase:
        if isinstance(self.method, IntScheme):
            return IntLinearMethod(self.method)
        return Fp8LinearMethod(self.method)


def _ct_fp8(weights: dict[str, Any], inputs: dict[str, Any] | None) -> bool:
    """fp8 weights (per tensor or channel): whether activations have a static scale."""
    field(weights, "num_bits", (8,))
    field(weights, "strategy", ("tensor", "channel"))
    if inputs is None:
        return False
    field(inputs, "type", ("float",))
    return not field(inputs, "dynamic", (True, False))


def _ct_int(weights: dict[str, Any], inputs: dict[str, Any] | None, fmt: str) -> IntScheme:
    """The integer scheme of W4A16 / W8A16 (packed) or W8A8 int8."""
    field(weights, "type", ("int",))
    bits = field(weights, "num_bits", (4, 8))
    strategy = field(weights, "strategy", ("group", "channel"))
    size = (field(weights, "group_size", (*GROUP_SIZES, 256)) if strategy == "group"
            else -1)
    # compressed-tensors' ActivationOrdering: "static" is an alias of "weight" (calibration
    # order only, no g_idx: what llm-compressor 0.14's GPTQ writes), "dynamic" of "group"
    act_order = field(weights, "actorder",
                      (None, "group", "dynamic", "weight", "static")) in ("group", "dynamic")
    symmetric = field(weights, "symmetric", (True, False), True)
    if inputs is None:
        field({"format": fmt}, "format", ("pack-quantized",))
        return IntScheme("ct-packed", bits, size, act_order, zero_points=not symmetric)
    field({"format": fmt}, "format", ("int-quantized", "naive-quantized"))
    field(weights, "num_bits", (8,))
    field(weights, "strategy", ("channel",))
    field(weights, "symmetric", (True,), True)
    field(inputs, "type", ("int",))
    field(inputs, "symmetric", (True,), True)
    dynamic = field(inputs, "dynamic", (True, False))
    field(inputs, "strategy", ("token",) if dynamic else ("tensor",))
    return IntScheme("ct-int", 8, -1, zero_points=False, static_input=not dynamic)
