"""``build_model``: from a model's files to a loaded, ready-to-run ``CausalLM``.

The implementation is looked up by the config's ``architectures`` in the model registry
(built-ins and plugins alike); every problem with the config or the weights becomes a
``ModelLoadError`` that names the file it comes from.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from octavo.attention.base import AttentionBackend
from octavo.kernels.cpu_layers import use_cpu_layers
from octavo.models.base import CausalLM, WeightLoadError
from octavo.models.config import ArchConfig
from octavo.models.layers.cpu_gemm import attach_cpu_gemms, cpu_gemm_supported
from octavo.models.loader import ModelFiles, ModelLoadError
from octavo.plugins import Registry, get_registries

MAX_NAMES_SHOWN = 8


def build_model(
    files: ModelFiles,
    dtype: torch.dtype,
    attn_backend: type[AttentionBackend],
    device: str | torch.device = "cpu",
) -> CausalLM:
    """Instantiate the architecture of ``files.hf_config`` in ``dtype`` on ``device`` and load
    its weights; the model is returned in eval mode with frozen parameters. A bf16 model on
    the CPU gets its weights prepacked for the CPU's GEMMs (see ``cpu_gemm``) and its
    element-wise layers fused (see ``octavo.kernels.cpu_layers``)."""
    config_file = _config_file(files.source)
    model_class = model_class_for(files.hf_config, config_file)
    config = ArchConfig.from_hf(files.hf_config, config_file)
    try:
        with torch.device(device):
            model = model_class(config, attn_backend, dtype)
    except ValueError as exc:  # dimensions the layers cannot be built with
        raise ModelLoadError(f"{config_file}: cannot build {model_class.__name__}: {exc}") from exc
    _load(model, files)
    use_cpu_kernels(model, dtype, torch.device(device))
    return model.eval()


def use_cpu_kernels(model: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """For a bf16 model on the CPU: prepack the loaded weights for the CPU's GEMMs and fuse
    the element-wise layers; nothing otherwise. Proposers call it for the heads they build
    from the target's layer classes (an EAGLE head), which ``build_model`` never sees."""
    if cpu_gemm_supported(dtype, device):
        from octavo.platforms.cpu import cpu_has_amx

        attach_cpu_gemms(model, fp32_for_large=not cpu_has_amx())
        use_cpu_layers(model)


def model_class_for(
    hf_config: dict, config_file: str | Path, registry: Registry | None = None
) -> type[CausalLM]:
    """The registered implementation of the first supported name in ``architectures``."""
    registry = get_registries().models if registry is None else registry
    architectures = hf_config.get("architectures") or []
    for name in architectures:
        if name in registry:
            return registry.get(name)
    supported = ", ".join(sorted(registry.names())) or "none"
    named = ", ".join(map(repr, architectures)) or "no 'architectures' entry"
    raise ModelLoadError(f"{config_file}: unsupported model architecture ({named}); "
                         f"supported architectures: {supported}")


def _load(model: CausalLM, files: ModelFiles) -> None:
    try:
        loaded = model.load_weights(files.iter_weights())
    except WeightLoadError as exc:
        raise ModelLoadError(f"{files.weight_file_of(exc.weight_name)}: {exc}") from exc
    missing = model.missing_weights(loaded)
    if missing:
        shown = ", ".join(missing[:MAX_NAMES_SHOWN])
        more = len(missing) - MAX_NAMES_SHOWN
        shown += f" and {more} more" if more > 0 else ""
        raise ModelLoadError(f"{files.source}: {len(missing)} weights the "
                             f"{type(model).__name__} needs are missing: {shown}")


def _config_file(source: Path) -> Path:
    """Where the config came from: ``config.json`` of an HF folder, else the file itself."""
    source = Path(source)
    return source / "config.json" if source.is_dir() else source
