"""The parts of an HF config beyond the dense decoder: a mixture of experts
(``MoEConfig``), multi-head latent attention (``MLAConfig``) and Mamba layers
(``MambaConfig``), each family's dialect read into one shape."""

from __future__ import annotations

import math
from dataclasses import dataclass

from octavo.models.config_reader import ConfigReader


@dataclass(frozen=True)
class MoEConfig:
    """A mixture of experts' shape and routing, in every family's dialect (Mixtral's
    ``num_local_experts``; Qwen's ``num_experts``, shared expert and sparse steps;
    DeepSeek's ``n_routed_experts``, shared experts, dense first layers and groups)."""

    num_experts: int
    top_k: int  # num_experts_per_tok
    intermediate_size: int  # of each routed expert (moe_intermediate_size)
    layers: tuple[bool, ...]  # per decoder layer: whether its MLP is the mixture
    renormalize: bool = True  # the top-k weights divided by their sum (norm_topk_prob)
    # Experts every token runs (Qwen: one of shared_expert_intermediate_size; DeepSeek:
    # n_shared_experts of moe_intermediate_size, as one MLP); 0: none.
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid(gate(x)) scales the shared one
    # DeepSeek's group-limited top-k: experts in num_groups groups, the top_k chosen among
    # the topk_groups groups with the best expert; and a factor on the routing weights.
    num_groups: int = 1
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values come from one latent
    per token, ``kv_lora_rank`` wide, through ``kv_b_proj``; a ``qk_rope_head_dim`` key part
    carries the position, shared by every head. Queries are projected directly
    (``q_lora_rank`` None, V2-Lite) or through a low-rank ``q_a_proj``/``q_b_proj`` pair."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class MambaDims:
    """A Mamba mixer's sizes (HF Jamba's ``mamba_*`` fields)."""

    hidden_size: int
    inner: int  # mamba_expand * hidden_size
    d_state: int
    d_conv: int
    dt_rank: int
    conv_bias: bool = True
    proj_bias: bool = False


@dataclass(frozen=True)
class MambaConfig:
    """Jamba's Mamba layers: every layer but the attention ones (``attn_layer_period``,
    ``attn_layer_offset``) is a Mamba mixer of ``dims``."""

    dims: MambaDims
    attention_layers: tuple[bool, ...]  # per decoder layer: whether it attends


def read_mamba(reader: ConfigReader, num_layers: int, hidden_size: int) -> MambaConfig | None:
    """The Mamba layers of a Jamba config (it has ``mamba_d_state``), else None."""
    if reader.optional("mamba_d_state", None) is None:
        return None
    dt_rank = reader.optional("mamba_dt_rank", "auto")
    period = reader.positive_int("attn_layer_period")
    offset = int(reader.optional("attn_layer_offset", 0))
    dims = MambaDims(hidden_size=hidden_size,
                     inner=reader.positive_int("mamba_expand") * hidden_size,
                     d_state=reader.positive_int("mamba_d_state"),
                     d_conv=reader.positive_int("mamba_d_conv"),
                     dt_rank=math.ceil(hidden_size / 16) if dt_rank == "auto" else int(dt_rank),
                     conv_bias=bool(reader.optional("mamba_conv_bias", True)),
                     proj_bias=bool(reader.optional("mamba_proj_bias", False)))
    return MambaConfig(dims, tuple(i % period == offset for i in range(num_layers)))


def read_mla(reader: ConfigReader) -> MLAConfig | None:
    """The latent attention of a DeepSeek config (it has ``kv_lora_rank``), else None."""
    if reader.optional("kv_lora_rank", None) is None:
        return None
    q_lora_rank = reader.optional("q_lora_rank", None)
    return MLAConfig(kv_lora_rank=reader.positive_int("kv_lora_rank"),
                     qk_nope_head_dim=reader.positive_int("qk_nope_head_dim"),
                     qk_rope_head_dim=reader.positive_int("qk_rope_head_dim"),
                     v_head_dim=reader.positive_int("v_head_dim"),
                     q_lora_rank=None if q_lora_rank is None else
                     reader.positive_int("q_lora_rank"))


def read_moe(reader: ConfigReader, num_layers: int, intermediate_size: int) -> MoEConfig | None:
    """The mixture of experts a config describes, None for a dense model. Which layers are
    sparse, as each family's HF modelling decides: DeepSeek's from first_k_dense_replace on;
    Qwen's every decoder_sparse_step-th but mlp_only_layers; Jamba's every
    expert_layer_period-th from expert_layer_offset; Mixtral's all."""
    key = next((k for k in ("n_routed_experts", "num_local_experts", "num_experts")
                if reader.optional(k, 0)), None)
    if key is None:
        return None
    num_experts = int(reader.raw[key])
    top_k = int(reader.optional("num_experts_per_tok", 0))
    if not 1 <= top_k <= num_experts:
        raise reader.error("num_experts_per_tok", f"must be in 1..{num_experts} ({key}), "
                                                  f"got {top_k}")
    layers = range(num_layers)
    moe_size = int(reader.optional("moe_intermediate_size", 0)) or intermediate_size
    if key == "n_routed_experts":  # DeepSeek
        first_sparse = int(reader.optional("first_k_dense_replace", 0))
        groups = (int(reader.optional("n_group", 1)), int(reader.optional("topk_group", 1)))
        if reader.optional("topk_method", "greedy") == "greedy":
            groups = (1, 1)
        if num_experts % groups[0] or not 1 <= groups[1] <= groups[0]:
            raise reader.error("n_group", f"{num_experts} experts in {groups[0]} groups, "
                                          f"top {groups[1]} of them: not a valid split")
        # HF's DeepSeek-V2 router never renormalises (whatever norm_topk_prob says).
        return MoEConfig(num_experts, top_k, moe_size, tuple(i >= first_sparse for i in layers),
                         renormalize=False, num_groups=groups[0], topk_groups=groups[1],
                         shared_intermediate_size=moe_size * int(
                             reader.optional("n_shared_experts", 0)),
                         routed_scaling_factor=float(
                             reader.optional("routed_scaling_factor", 1.0)))
    if "expert_layer_period" in reader.raw:  # Jamba: one "expert" is a dense MLP
        if num_experts <= 1:
            return None
        period = int(reader.raw["expert_layer_period"])
        offset = int(reader.optional("expert_layer_offset", 0))
        return MoEConfig(num_experts, top_k, moe_size,
                         tuple(i % period == offset for i in layers), renormalize=False)
    dense = set(reader.optional("mlp_only_layers", []))
    step = int(reader.optional("decoder_sparse_step", 1))
    shared = int(reader.optional("shared_expert_intermediate_size", 0))
    return MoEConfig(num_experts, top_k, moe_size,
                     tuple(i not in dense and (i + 1) % step == 0 for i in layers),
                     renormalize=bool(reader.optional("norm_topk_prob", True)),
                     shared_intermediate_size=shared, shared_expert_gate=shared > 0)
