"""``build_model``: from a model's files to a loaded, ready-to-run ``CausalLM``.

The implementation is looked up by the config's ``architectures`` in a mapping of
architecture names to classes: the engine passes the model registry's (built-ins and
plugins alike), the default is the built-ins'. Every problem with the config or the weights
becomes a ``ModelLoadError`` that names the file it comes from. Specialising the loaded
model for a device (fused kernels, prepacked weights) is the platform's job
(``Platform.prepare_model``), not this module's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from octavo.attention.base import AttentionBackend
from octavo.models.architectures import BUILTIN_ARCHITECTURES
from octavo.models.base import CausalLM, WeightLoadError
from octavo.models.config import ArchConfig
from octavo.models.kv_scales import apply_kv_scales, take_kv_scales
from octavo.models.layers.checkpoint_configs import AwqConfig
from octavo.models.layers.gguf import GgufConfig
from octavo.models.layers.quantization import (
    QUANTIZATION_CONFIGS,
    QuantizationConfig,
    QuantizeMethodBase,
    quantization_scope,
)
from octavo.models.loader import ModelFiles, ModelLoadError

MAX_NAMES_SHOWN = 8
NO_QUANTIZATION = "none"  # --quantization none: dense weights (a GGUF dequantized at load)
# Checkpoint formats that load dense unless --quantization names them. A GGUF kept in its
# blocks runs slower than dense bf16 today (SmolLM2 Q4_1, idle machine, 2026-12-07: W2 47.7
# vs 65.7 decode tok/s, W1 275 vs 423 output tok/s): its layers leave the fused decode stack
# and its prefill dequantizes panels. It becomes the default once it is the faster path.
OPT_IN = frozenset({"gguf"})
assert GgufConfig.name in QUANTIZATION_CONFIGS  # imported for its registration
assert AwqConfig.name in QUANTIZATION_CONFIGS  # and the checkpoint formats' module with it


def build_model(
    files: ModelFiles,
    dtype: torch.dtype,
    attn_backend: type[AttentionBackend],
    device: str | torch.device = "cpu",
    architectures: Mapping[str, type[CausalLM]] = BUILTIN_ARCHITECTURES,
    quantization: str | None = None,
) -> CausalLM:
    """Instantiate the architecture of ``files.hf_config`` in ``dtype`` on ``device`` and load
    its weights; the model is returned in eval mode with frozen parameters.

    ``quantization`` (``--quantization``): None, the checkpoint's own, except the formats
    of ``OPT_IN`` (a GGUF), which load dense; ``"none"``, dense weights in ``dtype`` whatever
    the checkpoint; else a registered config's name (``octavo.models.layers.quantization``),
    ``"gguf"`` keeping a GGUF's blocks."""
    config = quantization_config(files, quantization)
    with quantization_scope(config):
        model = _instantiate(files, dtype, attn_backend, device, architectures)
    _load(model, files)
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, QuantizeMethodBase):
            method.process_weights_after_loading(module)
    return model.eval()


def quantization_config(files: ModelFiles, quantization: str | None
                        ) -> QuantizationConfig | None:
    """The config the layers of ``files``' model take their methods from (None: dense)."""
    if quantization is None and files.quantization in OPT_IN:
        return None
    known = ", ".join(sorted([NO_QUANTIZATION, *QUANTIZATION_CONFIGS]))
    if files.quantization is not None and files.quantization not in QUANTIZATION_CONFIGS:
        raise ModelLoadError(f"{config_file_of(files.source)}: quantization_config's "
                             f"quant_method {files.quantization!r} is not supported "
                             f"(supported: {known})")
    name = files.quantization if quantization is None else quantization
    if name == NO_QUANTIZATION and files.quantization not in (None, *OPT_IN):
        raise ModelLoadError(f"{files.source}: --quantization {NO_QUANTIZATION} cannot "
                             f"load the {files.quantization} checkpoint's weights densely")
    if name is None or name == NO_QUANTIZATION:
        return None
    if name not in QUANTIZATION_CONFIGS:
        raise ModelLoadError(f"--quantization {name!r} is not a known method ({known})")
    if name != files.quantization:
        raise ModelLoadError(f"{files.source}: --quantization {name} does not match the "
                             f"checkpoint's weights ({files.quantization or 'dense'}); "
                             f"use --quantization {NO_QUANTIZATION} for dense weights")
    try:
        return QUANTIZATION_CONFIGS[name].from_config(files.hf_config.get("quantization_config"))
    except ValueError as exc:
        raise ModelLoadError(f"{config_file_of(files.source)}: quantization_config "
                             f"({name}): {exc}") from exc


def count_parameters(files: ModelFiles, attn_backend: type[AttentionBackend],
                     architectures: Mapping[str, type[CausalLM]] = BUILTIN_ARCHITECTURES,
                     ) -> int:
    """The parameters the model of ``files`` has (on one rank), counted on a model built on
    the meta device: nothing allocated, nothing loaded."""
    model = _instantiate(files, torch.float32, attn_backend, "meta", architectures)
    return sum(param.numel() for param in model.parameters())


def _instantiate(files: ModelFiles, dtype: torch.dtype, attn_backend: type[AttentionBackend],
                 device: str | torch.device,
                 architectures: Mapping[str, type[CausalLM]]) -> CausalLM:
    """The architecture of ``files.hf_config`` built in ``dtype`` on ``device``, its weights
    not loaded; dimensions its layers cannot be built with are a ``ModelLoadError`` naming
    the config."""
    config_file = config_file_of(files.source)
    model_class = model_class_for(files.hf_config, config_file, architectures)
    config = ArchConfig.from_hf(files.hf_config, config_file)
    try:
        with torch.device(device):
            return model_class(config, attn_backend, dtype)
    except ValueError as exc:  # dimensions the layers cannot be built with
        raise ModelLoadError(f"{config_file}: cannot build {model_class.__name__}: {exc}") from exc


def model_class_for(
    hf_config: dict, config_file: str | Path,
    architectures: Mapping[str, type[CausalLM]] = BUILTIN_ARCHITECTURES,
) -> type[CausalLM]:
    """The implementation of the first supported name in the config's ``architectures``."""
    named_architectures = hf_config.get("architectures") or []
    for name in named_architectures:
        if name in architectures:
            return architectures[name]
    supported = ", ".join(sorted(architectures)) or "none"
    named = ", ".join(map(repr, named_architectures)) or "no 'architectures' entry"
    raise ModelLoadError(f"{config_file}: unsupported model architecture ({named}); "
                         f"supported architectures: {supported}")


def _load(model: CausalLM, files: ModelFiles) -> None:
    kv_scales: dict[str, tuple[str, float]] = {}
    try:
        loaded = model.load_weights(take_kv_scales(files.iter_weights(), kv_scales))
        apply_kv_scales(model, kv_scales)
    except WeightLoadError as exc:
        raise ModelLoadError(f"{files.weight_file_of(exc.weight_name)}: {exc}") from exc
    missing = model.missing_weights(loaded)
    if missing:
        shown = ", ".join(missing[:MAX_NAMES_SHOWN])
        more = len(missing) - MAX_NAMES_SHOWN
        shown += f" and {more} more" if more > 0 else ""
        raise ModelLoadError(f"{files.source}: {len(missing)} weights the "
                             f"{type(model).__name__} needs are missing: {shown}")


def config_file_of(source: Path) -> Path:
    """Where the config came from: ``config.json`` of an HF folder, else the file itself."""
    source = Path(source)
    return source / "config.json" if source.is_dir() else source
