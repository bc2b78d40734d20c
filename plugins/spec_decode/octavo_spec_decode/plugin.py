"""Entry point of octavo-spec-decode: registers its proposers by the method names of
``--speculative-config``."""

from __future__ import annotations

from typing import Any

from octavo.plugin_api import Registry, hookimpl

# The plugin API range this plugin is written for (see octavo.plugin_api).
OCTAVO_PLUGIN_API = ">=1.4,<2"  # 1.4: LlamaDecoderLayer.build, StepInputs.for_tokens


@hookimpl
def octavo_register_proposers(registry: Registry[Any]) -> None:
    from octavo_spec_decode.draft_model import DraftModelProposer
    from octavo_spec_decode.eagle import EagleProposer
    from octavo_spec_decode.eagle3 import Eagle3Proposer
    from octavo_spec_decode.medusa import MedusaProposer
    from octavo_spec_decode.ngram import NgramProposer

    for proposer in (NgramProposer, DraftModelProposer, MedusaProposer, EagleProposer,
                     Eagle3Proposer):
        registry.register(proposer.name, proposer)


@hookimpl
def octavo_register_cli_commands(registry: Registry[Any]) -> None:
    from octavo_spec_decode.spec_cmd import spec

    registry.register("spec", spec)
