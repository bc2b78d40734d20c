"""The quantization layer: how a linear layer, an embedding or an LM head holds its weights.

In the spirit of vLLM's ``QuantizationConfig`` / ``QuantizeMethodBase``: a layer does not
allocate or multiply its weight itself; its *method* does. At construction the layer asks the
model's :class:`QuantizationConfig` (chosen from the checkpoint, or by ``--quantization``)
for a method, which registers the layer's parameters with their loaders
(``create_weights``), fixes them up once they are loaded (``process_weights_after_loading``)
and computes with them (``apply``; an embedding's ``embed``). ``None`` as the config is
dense weights: :class:`UnquantizedLinearMethod` / :class:`UnquantizedEmbeddingMethod`,
today's behaviour.

The config reaches the layers the way the tensor-parallel rank does, from a scope the model
builder opens around construction (:func:`quantization_scope`), so model classes need no
extra argument. Configs are registered by name (:func:`register_quantization_config`, in
``octavo.plugin_api`` for plugins: AWQ, GPTQ, fp8, ...). A platform asks a method whether
it keeps a plain dense weight (:attr:`QuantizeMethodBase.dense`) before giving the layer a
faster dense GEMM, and hands that GEMM's product to the method's ``after_gemm`` (a wrapper
such as LoRA's adds its delta there); it never reads a method's own state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from octavo.models.layers.weights import new_parameter

WeightLoader = Callable[..., None]  # (param, loaded, shard_id=None) -> None


def layer_weight(layer: nn.Module) -> torch.Tensor:
    """``layer.weight``, which a method's ``create_weights`` registered."""
    weight = layer.weight
    assert isinstance(weight, torch.Tensor), f"{type(layer).__name__} has no weight tensor"
    return weight


class QuantizeMethodBase:
    """How one layer holds and uses its weight. One object per layer: it may keep state
    (the type its weights were loaded in). ``layer`` is a ``LinearBase`` for a linear
    method, a ``VocabParallelEmbedding`` for an embedding method (typed ``nn.Module``
    here: those modules import this one)."""

    @property
    def dense(self) -> bool:
        """Whether the layer's ``weight`` is a plain dense ``[rows, cols]`` tensor of the
        model's dtype once loaded: a platform may then multiply with its own dense GEMM."""
        return True

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Repack, transpose or check what was loaded (called once, after loading)."""
        del layer


class LinearMethodBase(QuantizeMethodBase):
    """A linear layer's method: ``y = x W^T (+ b)`` with ``W`` held its way."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       weight_loader: WeightLoader) -> None:
        """Register ``layer.weight`` for this rank's ``[out_features, in_features]``, filled
        through the layer's ``weight_loader`` (which knows the sharding)."""
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def after_gemm(self, layer: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The layer's output from ``y = x W^T (+ b)``, whichever GEMM computed it (this
        method's ``apply`` or a platform's own, ``LinearBase.cpu_gemm``): ``y`` itself here;
        a wrapper adds to it (a LoRA adapter's delta), so a platform's faster GEMM for the
        dense base weight keeps serving the wrapped layer."""
        del layer, x
        return y

    def adds_after_gemm(self) -> bool:
        """Whether :meth:`after_gemm` changes ``y`` in the current step. A platform path
        that computes the layer inside a fused call, never calling ``after_gemm`` (the
        CPU's fused decode stack), may take the layer only while this is False."""
        return False


class EmbeddingMethodBase(QuantizeMethodBase):
    """An embedding table's method, which the LM head (tied or not) uses for its logits."""

    def create_weights(self, layer: nn.Module, rows: int, hidden: int,
                       weight_loader: WeightLoader) -> None:
        raise NotImplementedError

    def embed(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the table, ``[T, hidden]`` in the model's dtype."""
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``x @ table^T``: logits over this rank's rows."""
        raise NotImplementedError

    def dense_weight(self, layer: nn.Module) -> torch.Tensor:
        """This rank's table ``[rows, hidden]`` in the model's dtype (a quantized method
        dequantizes a copy), for code that multiplies with the table itself (speculative
        decoding's draft projections)."""
        raise NotImplementedError


class UnquantizedLinearMethod(LinearMethodBase):
    """Dense weights in the model's dtype, multiplied by ``F.linear``."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       weight_loader: WeightLoader) -> None:
        layer.weight = new_parameter(out_features, in_features, weight_loader=weight_loader)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, layer_weight(layer), bias)


class UnquantizedEmbeddingMethod(EmbeddingMethodBase):
    """A dense table: ``F.embedding`` and ``F.linear``."""

    def create_weights(self, layer: nn.Module, rows: int, hidden: int,
                       weight_loader: WeightLoader) -> None:
        layer.weight = new_parameter(rows, hidden, weight_loader=weight_loader)

    def embed(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, layer_weight(layer))

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer_weight(layer))

    def dense_weight(self, layer: nn.Module) -> torch.Tensor:
        return layer_weight(layer)


class QuantizationConfig:
    """A checkpoint's quantization: which method each layer gets. Subclasses set ``name``
    (vLLM's ``--quantization`` value) and override the methods they change."""

    name: ClassVar[str]
    # Whether a mixture of experts' experts hold this config's weights: one quantized linear
    # pair per expert (``octavo.models.layers.moe.ExpertMLP``) instead of stacked dense
    # tensors. A checkpoint config's do (its tools quantize the experts); GGUF's keeps its
    # stacked expert tensors, dequantized.
    quantizes_experts: ClassVar[bool] = False

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> QuantizationConfig:
        """The config for a checkpoint's ``quantization_config`` (config.json; None where it
        has none); ValueError naming a field it does not support."""
        del config
        return cls()

    def get_linear_method(self, layer: nn.Module) -> LinearMethodBase:
        del layer
        return UnquantizedLinearMethod()

    def get_embedding_method(self, layer: nn.Module) -> EmbeddingMethodBase:
        del layer
        return UnquantizedEmbeddingMethod()


QUANTIZATION_CONFIGS: dict[str, type[QuantizationConfig]] = {}
_current: list[QuantizationConfig | None] = [None]


def register_quantization_config(config: type[QuantizationConfig]) -> type[QuantizationConfig]:
    """Make ``config`` selectable as ``--quantization <config.name>`` (a class decorator)."""
    QUANTIZATION_CONFIGS[config.name] = config
    return config


@contextlib.contextmanager
def quantization_scope(config: QuantizationConfig | None) -> Iterator[None]:
    """Layers built inside take their methods from ``config`` (None: dense)."""
    _current.append(config)
    try:
        yield
    finally:
        _current.pop()


def experts_quantized() -> bool:
    """Whether a mixture of experts being built holds the current scope's quantized weights
    (``QuantizationConfig.quantizes_experts``)."""
    config = _current[-1]
    return config is not None and config.quantizes_experts


def linear_method(layer: nn.Module) -> LinearMethodBase:
    """The method of a linear layer being built, from the current scope's config."""
    config = _current[-1]
    return UnquantizedLinearMethod() if config is None else config.get_linear_method(layer)


def embedding_method(layer: nn.Module) -> EmbeddingMethodBase:
    """The method of an embedding or LM head being built, from the current scope's config."""
    config = _current[-1]
    return UnquantizedEmbeddingMethod() if config is None else config.get_embedding_method(layer)
