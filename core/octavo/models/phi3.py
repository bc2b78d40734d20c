"""Phi-3 (HF ``Phi3ForCausalLM``): the Llama decoder as HF Phi-3 computes it.

Its checkpoints fuse the projections Llama keeps apart - one ``qkv_proj`` and one
``gate_up_proj`` tensor per layer, the layout of this package's fused parameters - so they
load whole (shard id None, split by the layer's weight loader, tensor-parallel slices
included). Long-context versions scale RoPE with ``longrope`` (``su``): short and long
per-frequency factors and an attention factor (``octavo.models.layers.rotary``); Phi-4-mini
rotates only part of each head (``partial_rotary_factor``). A ``sliding_window`` applies to
every layer, as in Mistral.
"""

from __future__ import annotations

from typing import ClassVar

from octavo.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    # HF's names are the fused parameters' own: nothing to map.
    stacked_params: ClassVar[tuple[tuple[str, str, object], ...]] = ()
