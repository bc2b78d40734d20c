"""The public hook contract of Octavo plugins (pluggy project name ``octavo``).

A plugin is a module exposed through the entry-point group ``octavo`` that implements
some of these hooks with ``@octavo.plugin_api.hookimpl`` and declares the plugin API range
it is written for (``OCTAVO_PLUGIN_API = ">=1.0,<2"``). Every hook receives a typed
:class:`~octavo.plugins.registry.Registry` and calls ``registry.register(name, obj)``;
nothing is returned. The classes named below are all in ``octavo.plugin_api``.

When and where: the hooks run once per process, the first time that process asks for a
registry (``octavo.plugin_api.get_registries()``). That happens in every process that needs
them - the API server, the engine core and each worker - so a plugin must be importable
and cheap to import everywhere: import heavy libraries (torch kernels, jax) inside the
objects it registers, not at module top level.

A hook that raises is reported by ``octavo plugins`` and the plugin is skipped; what it
registered before raising is kept out of the registries too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import click

    from octavo.attention.base import AttentionBackend
    from octavo.kv.interface import KVCacheManagerInterface
    from octavo.kv_transfer.base import KVConnector
    from octavo.models.base import CausalLM
    from octavo.platforms.base import Platform
    from octavo.plugins.registry import Registry
    from octavo.sched.interface import SchedulerInterface
    from octavo.sched.policy import SchedulingPolicy
    from octavo.worker.spec_decode.proposer import Proposer

PROJECT = "octavo"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def octavo_register_platforms(registry: Registry[type[Platform]]) -> None:
    """Register hardware platforms: ``registry.register("cuda", CudaPlatform)``.

    The object is a subclass of ``Platform``. ``--backend NAME`` looks
    it up by name; ``--backend auto`` picks the available one with the highest ``priority``.
    Called in every process, before the engine is built.
    """


@hookspec
def octavo_register_attention_backends(registry: Registry[type[AttentionBackend]]) -> None:
    """Register attention backends: ``registry.register("torch", TorchAttentionBackend)``.

    The object is a subclass of ``AttentionBackend``. A platform names
    its default; ``--attention-backend NAME`` overrides it. Called in workers.
    """


@hookspec
def octavo_register_kv_connectors(registry: Registry[type[KVConnector]]) -> None:
    """Register KV connectors for disaggregated prefill/decode (``--kv-transfer-config``).

    The object is a ``KVConnector`` subclass, with a scheduler side and a worker side,
    registered under the name ``{"connector": NAME}`` takes. Called in the engine core
    (scheduler side) and in workers (worker side).
    """


@hookspec
def octavo_register_proposers(registry: Registry[type[Proposer]]) -> None:
    """Register speculative-decoding proposers (``--speculative-config '{"method": NAME}'``).

    The object is a subclass of ``Proposer``, registered under its
    method name (``registry.register("ngram", NgramProposer)``).
    Called in workers, where proposers run next to the target model.
    """


@hookspec
def octavo_register_schedulers(registry: Registry[type[SchedulerInterface]]) -> None:
    """Register ``SchedulerInterface`` subclasses; the engine core builds the one
    ``--scheduler-cls NAME`` names (``default``: the core's ``Scheduler``)."""


@hookspec
def octavo_register_scheduling_policies(registry: Registry[type[SchedulingPolicy]]) -> None:
    """Register waiting-queue policies (``--scheduling-policy NAME``).

    The object is a ``SchedulingPolicy`` subclass that orders the
    waiting queue and picks preemption victims. Called in the engine core.
    """


@hookspec
def octavo_register_kv_managers(registry: Registry[type[KVCacheManagerInterface]]) -> None:
    """Register ``KVCacheManagerInterface`` subclasses; the engine core builds the one
    ``--kv-manager NAME`` names (``default``: the core's ``KVCacheManager``) and hands it to
    the scheduler."""


@hookspec
def octavo_register_models(registry: Registry[type[CausalLM]]) -> None:
    """Register model implementations by HF ``architectures`` name.

    ``registry.register("LlamaForCausalLM", LlamaForCausalLM)``. Called in workers, where
    models are built, and in the engine process when it validates a model config.
    """


@hookspec
def octavo_register_cli_commands(registry: Registry[click.Command]) -> None:
    """Register click commands or groups under ``octavo``:
    ``registry.register("spec", spec_group)`` makes ``octavo spec ...``.

    Called in the CLI process when ``octavo`` starts; import heavy libraries inside the
    command's function, not where the command is defined.
    """


@hookspec
def octavo_register_tool_parsers(registry: Registry[type[Any]]) -> None:
    """Register tool-call parsers for ``octavo serve --tool-call-parser NAME``:
    ``registry.register("my_format", MyToolParser)``, a subclass of
    ``octavo.plugin_api.ToolParser`` (the built-ins ``hermes``, ``llama3_json``, ``mistral``
    and ``pythonic`` cannot be replaced). Called in the API server process.
    """


@hookspec
def octavo_register_reasoning_parsers(registry: Registry[type[Any]]) -> None:
    """Register reasoning parsers for ``octavo serve --reasoning-parser NAME``:
    ``registry.register("my_model", MyReasoningParser)``, a subclass of
    ``octavo.plugin_api.ReasoningParser`` (the built-ins ``deepseek_r1`` and ``qwen3`` cannot
    be replaced). Called in the API server process.
    """
