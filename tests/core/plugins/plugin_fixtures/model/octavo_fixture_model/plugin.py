"""Registers ``NegatedLlamaForCausalLM``: the Llama decoder with its logits negated, so its
greedy tokens (the least likely ones of the plain Llama) show which class ran; and
``RaisingLlamaForCausalLM``, whose rank 0 raises on a poisoned prompt."""

from __future__ import annotations

from typing import Any

from octavo.plugin_api import Registry, hookimpl

OCTAVO_PLUGIN_API = ">=1.0,<2"


@hookimpl
def octavo_register_models(registry: Registry[Any]) -> None:
    from octavo_fixture_model.model import NegatedLlamaForCausalLM, RaisingLlamaForCausalLM

    registry.register("NegatedLlamaForCausalLM", NegatedLlamaForCausalLM)
    registry.register("RaisingLlamaForCausalLM", RaisingLlamaForCausalLM)
