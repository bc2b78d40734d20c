"""The public hook contract of Octavo plugins (pluggy project name ``octavo``).

A plugin is a module exposed through the entry-point group ``octavo`` that implements
some of these hooks with ``@octavo.plugins.hookimpl``. Every hook receives a
:class:`~octavo.plugins.registry.Registry` and calls ``registry.register(name, obj)``;
nothing is returned.

When and where: the hooks run once per process, the first time that process asks for a
registry (``octavo.plugins.get_registries()``). That happens in every process that needs
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
    from octavo.plugins.registry import Registry

PROJECT = "octavo"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def octavo_register_platforms(registry: Registry[Any]) -> None:
    """Register hardware platforms: ``registry.register("cuda", CudaPlatform)``.

    The object is a subclass of :class:`octavo.platforms.Platform`. ``--backend NAME`` looks
    it up by name; ``--backend auto`` picks the available one with the highest ``priority``.
    Called in every process, before the engine is built.
    """


@hookspec
def octavo_register_attention_backends(registry: Registry[Any]) -> None:
    """Register attention backends: ``registry.register("torch", TorchAttentionBackend)``.

    The object is a subclass of :class:`octavo.attention.AttentionBackend`. A platform names
    its default; ``--attention-backend NAME`` overrides it. Called in workers.
    """


@hookspec
def octavo_register_kv_connectors(registry: Registry[Any]) -> None:
    """Register KV connectors for disaggregated prefill/decode (``--kv-transfer-config``).

    The object is a KV-connector class with a scheduler side and a worker side. Called in
    the engine core (scheduler side) and in workers (worker side).
    """


@hookspec
def octavo_register_proposers(registry: Registry[Any]) -> None:
    """Register speculative-decoding proposers (``--speculative-config '{"method": NAME}'``).

    The object is a subclass of :class:`octavo.worker.spec.proposer.Proposer`, registered under its
    method name (``registry.register("ngram", NgramProposer)``).
    Called in workers, where proposers run next to the target model.
    """


@hookspec
def octavo_register_schedulers(registry: Registry[Any]) -> None:
    """Register scheduler classes; the engine core builds the one the config names."""


@hookspec
def octavo_register_scheduling_policies(registry: Registry[Any]) -> None:
    """Register waiting-queue policies (``--scheduling-policy NAME``).

    The object is a :class:`octavo.sched.policy.SchedulingPolicy` subclass that orders the
    waiting queue and picks preemption victims. Called in the engine core.
    """


@hookspec
def octavo_register_kv_managers(registry: Registry[Any]) -> None:
    """Register KV-cache manager classes; the scheduler builds the one the config names."""


@hookspec
def octavo_register_models(registry: Registry[Any]) -> None:
    """Register model implementations by HF ``architectures`` name.

    ``registry.register("LlamaForCausalLM", LlamaForCausalLM)``. Called in workers, where
    models are built, and in the engine process when it validates a model config.
    """


@hookspec
def octavo_register_cli_commands(registry: Registry[Any]) -> None:
    """Register click commands or groups under ``octavo``:
    ``registry.register("spec", spec_group)`` makes ``octavo spec ...``.

    Called in the CLI process when ``octavo`` starts; import heavy libraries inside the
    command's function, not where the command is defined.
    """
