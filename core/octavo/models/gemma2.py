"""Gemma 2 (HF ``Gemma2ForCausalLM``): Gemma 3's decoder (``gemma3.py``) without the per-head
q/k norms, one RoPE for local and global layers, attention scores and final logits
soft-capped (``attn_logit_softcapping`` 50, ``final_logit_softcapping`` 30 in the released
models). Local (sliding-window) and global layers alternate, the first one local.

The soft-capped scores need an attention backend that ``supports_logits_soft_cap`` (the
torch one, which the CPU's falls back to for such layers); others refuse the model when
it is built.
"""

from __future__ import annotations

from octavo.models.gemma3 import Gemma3ForCausalLM


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    qk_norm = False
    caps_attention = True
