"""``check_model_fits``: whether a model splits over the configured ranks,
``check_model_features``: whether the engine's features work with it, and
``check_weights_fit``: whether its weights fit the CPU's memory - all checked in the engine
process before any worker starts (a worker finding out after its load would cost every rank
a model load, or the machine its memory, and say less)."""

from __future__ import annotations

from pathlib import Path

import torch

from octavo.config import ConfigError, EngineConfig
from octavo.models.build import count_parameters
from octavo.models.config import ArchConfig
from octavo.models.loader import ModelFiles
from octavo.platforms import Platform
from octavo.plugins import get_registries
from octavo.plugins.resolve import attention_backend


def check_model_fits(config: EngineConfig, hf_config: dict, source: str | Path) -> None:
    """Raise ``ConfigError`` naming the model's dimension that does not split."""
    parallel = config.parallel
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if parallel.world_size == 1 and not parallel.experts_across_engines:
        return
    arch = ArchConfig.from_hf(hf_config, source)
    sliced = [(arch.num_attention_heads, "attention heads")]
    moe = arch.moe
    if moe is None or not all(moe.layers):  # dense MLPs
        sliced.append((arch.intermediate_size, "MLP features"))
    if moe is not None:
        if not parallel.enable_expert_parallel:  # EP: whole experts
            sliced.append((moe.intermediate_size, "expert MLP features"))
        if moe.shared_intermediate_size:
            sliced.append((moe.shared_intermediate_size, "shared-expert MLP features"))
    problems = [f"its {count} {what} do not divide by tensor_parallel_size={tp}"
                for count, what in sliced if count % tp]
    kv = arch.num_key_value_heads
    if kv % tp and tp % kv:
        problems.append(f"its {kv} key/value heads neither divide nor are a multiple of "
                        f"tensor_parallel_size={tp}")
    dp = parallel.data_parallel_size if parallel.experts_across_engines else 1
    if parallel.enable_expert_parallel and arch.num_experts % (dp * tp):
        over = (f"data_parallel_size x tensor_parallel_size = {dp} x {tp} = {dp * tp}"
                if dp > 1 else f"tensor_parallel_size={tp}")
        problems.append(f"its {arch.num_experts} experts do not divide by {over} "
                        "(expert parallelism)")
    problems += sequence_split_problems(arch, tp, parallel.sequence_parallel_size)
    if arch.num_hidden_layers < pp:
        problems.append(f"its {arch.num_hidden_layers} layers are fewer than "
                        f"pipeline_parallel_size={pp}")
    if problems:
        raise ConfigError(f"{source}: the model cannot be split over the workers: "
                          + "; ".join(problems))


def sequence_split_problems(arch: ArchConfig, tp: int, sp: int) -> list[str]:
    """Why a tensor rank's heads do not split over ``sp`` sequence ranks (each attends with
    a whole share of the query and the key/value heads; replicated KV heads cannot)."""
    if sp == 1:
        return []
    heads, kv = arch.num_attention_heads, arch.num_key_value_heads
    return [f"its {count} {what} do not divide by tensor_parallel_size x "
            f"sequence_parallel_size = {tp} x {sp} = {tp * sp}"
            for count, what in ((heads, "attention heads"), (kv, "key/value heads"))
            if count % (tp * sp)]


def check_model_features(config: EngineConfig, hf_config: dict, source: str | Path) -> None:
    """Raise ``ConfigError`` naming a feature the model cannot be run with."""
    arch = ArchConfig.from_hf(hf_config, source)
    ropes = [rope for rope in (arch.rope, arch.local_rope) if rope is not None]
    length_dependent = [rope.rope_type for rope in ropes if rope.length_dependent]
    if length_dependent and config.speculative is not None:
        raise ConfigError(f"{source}: speculative decoding (--speculative-config) does not "
                          f"support the {length_dependent[0]} RoPE scaling (its frequencies "
                          "depend on each sequence's length, which drafts do not carry)")
    if arch.mla is not None:
        # Drafts' caches and the connectors move keys and values by KV head.
        for what, used in (("speculative decoding (--speculative-config)",
                            config.speculative is not None),
                           ("a KV connector (--kv-transfer-config)",
                            config.kv_transfer is not None)):
            if used:
                raise ConfigError(f"{source}: multi-head latent attention (its KV cache "
                                  f"holds one latent per token) does not support {what}")


def check_weights_fit(config: EngineConfig, files: ModelFiles, platform: type[Platform]) -> None:
    """On the CPU, where every rank's weights share the machine's memory: raise
    ``ConfigError`` when the weights alone (counted on a model built on the meta device, so
    a huge vocabulary, layer or expert count is caught before anything is allocated) exceed
    the memory available, with the numbers. Devices size their memory themselves."""
    if platform.device_type != "cpu":
        return
    available = platform.free_memory()
    if available <= 0:  # unknown here
        return
    dtype = config.model.torch_dtype(platform.default_dtype)
    arch = ArchConfig.from_hf(files.hf_config, files.source)
    # The declared sizes first: a model too big by its config alone is refused before it
    # is built even on the meta device (whose modules still cost host memory per layer).
    _check_weight_bytes(files, arch, declared_parameters(arch), dtype, available, "at least ")
    registries = get_registries()
    params = count_parameters(files, attention_backend(config, platform, registries),
                              registries.models.as_dict())
    _check_weight_bytes(files, arch, params, dtype, available, "")


def declared_parameters(arch: ArchConfig) -> int:
    """A lower bound of the model's parameters from its config alone: the embedding, and
    per layer its MLP (two matrices at least; every expert's in a mixture) and the query
    and output projections of its attention (latent attention: the query's rotated part)."""
    total = arch.vocab_size * arch.hidden_size
    moe = arch.moe
    attention = (1 if arch.mla else 2) * arch.hidden_size * arch.num_attention_heads * \
        arch.head_dim
    for layer in range(arch.num_hidden_layers):
        sparse = moe is not None and moe.layers[layer]
        width = moe.num_experts * moe.intermediate_size if sparse and moe else \
            arch.intermediate_size
        attends = arch.mamba is None or arch.mamba.attention_layers[layer]
        total += 2 * arch.hidden_size * width + (attention if attends else 0)
    return total


def _check_weight_bytes(files: ModelFiles, arch: ArchConfig, params: int, dtype: torch.dtype,
                        available: int, bound: str) -> None:
    weight_bytes = params * torch.finfo(dtype).bits // 8
    if weight_bytes > available:
        experts = f", {arch.num_experts} experts" if arch.num_experts else ""
        raise ConfigError(
            f"{files.source}: the weights take {bound}{weight_bytes / 2**30:.1f} GiB in "
            f"{dtype} ({bound}{params:,} parameters: vocabulary {arch.vocab_size}, hidden "
            f"size {arch.hidden_size}, {arch.num_hidden_layers} layers{experts}), more than "
            f"the {available / 2**30:.1f} GiB of memory available")
