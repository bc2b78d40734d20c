"""``-O`` on the CPU: the model's forward through ``torch.compile`` (Inductor's C++ backend).

This is the path a new architecture takes before it has fused kernels: Inductor fuses the
element-wise work between the GEMMs (norms, rotary, activations, residual adds) into
generated C++ loops. Three choices keep it to one graph, compiled once:

- attention is one opaque op (``octavo.attention.opaque``), so Dynamo traces the whole
  forward - every layer - as one graph, whatever the step's plan;
- the token dimension of the inputs is marked dynamic on every call, so the graph is
  compiled for a symbolic number of tokens (vLLM marks the batch dimension dynamic and
  compiles one graph too). Dynamo specialises the sizes 0 and 1, so a one-token step is
  padded to two (``_padded``): a prefill of any length and a decode of any batch share
  the graph. Marking the dimension unbacked instead fails on ``roll`` (RoPE), and a
  ``backed_size_oblivious`` shape environment still guarded ``2 <= tokens`` (torch 2.13);
- Inductor keeps what it compiled on disk (``CompilationConfig.cache_dir``, default
  ``inductor`` under Octavo's cache root): another run of the same model and torch reuses
  it and compiles in a fraction of the time.

``num_compiled_graphs`` says how many graphs the process compiled: the test checks that new
batch sizes add none.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from octavo.attention.base import AttentionMetadata
from octavo.attention.opaque import attention_step, make_attention_opaque
from octavo.config.compilation import CompilationConfig
from octavo.config.errors import ConfigError
from octavo.paths import cache_root

logger = logging.getLogger(__name__)

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache_dir(compilation: CompilationConfig) -> Path:
    """Where Inductor keeps its compiled kernels for this run."""
    return Path(compilation.cache_dir) if compilation.cache_dir else cache_root() / "inductor"


def num_compiled_graphs() -> int:
    """Graphs Dynamo has compiled in this process (each piece between graph breaks, each
    recompile): the figure that says whether shapes recompile."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_forward(model: nn.Module, compilation: CompilationConfig) -> None:
    """Replace ``model.forward`` with its compiled form, compiled at its first call (with a
    log line before and after: compiling takes seconds to minutes)."""
    check_inductor_options(compilation.inductor_compile_config)
    cache_dir = inductor_cache_dir(compilation)
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ[INDUCTOR_CACHE_ENV] = str(cache_dir)  # read by Inductor at each compile
    compiled = torch.compile(model.forward, backend="inductor",
                             options=compilation.inductor_compile_config or None)
    model.forward = _compiled_step(model, compiled)  # type: ignore[method-assign]
    logger.info("-O%d: the model's forward runs through torch.compile (Inductor, cache %s), "
                "compiled at its first call", compilation.level, cache_dir)


def check_inductor_options(options: dict[str, Any]) -> None:
    """Refuse, at model load, an ``inductor_compile_config`` key Inductor does not have
    (torch.compile would raise only when it first compiles)."""
    from torch._inductor import config as inductor_config

    unknown = sorted(set(options) - set(inductor_config.get_config_copy()))
    if unknown:
        raise ConfigError(f"compilation_config: inductor_compile_config has no option "
                          f"{unknown[0]!r} in torch {torch.__version__}'s Inductor")


def _compiled_step(model: nn.Module, compiled: Callable[..., Any]) -> Callable[..., Any]:
    """The forward the runner calls: the attention made opaque at the first call (after
    the KV cache is set up: a KV-group wrapper is then in place), a one-token step padded
    to two, the token dimension marked dynamic, the step's metadata set for the attention
    op; logs a compile."""
    opaque: list[int] = []

    def forward(input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn_metadata: AttentionMetadata,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        if not opaque:
            opaque.append(make_attention_opaque(model))
        num_tokens = input_ids.shape[0]
        tokens = [_padded(t) for t in (input_ids, positions, inputs_embeds)]
        metadata = (attn_metadata if attn_metadata.rope_lengths is None else
                    replace(attn_metadata, rope_lengths=_padded(attn_metadata.rope_lengths)))
        extra = {} if tokens[2] is None else {"inputs_embeds": tokens[2]}
        before, start = num_compiled_graphs(), time.perf_counter()
        with attention_step(attn_metadata):
            hidden = compiled(tokens[0], tokens[1], kv_caches, metadata, **extra)
        new = num_compiled_graphs() - before
        if new:
            logger.info("torch.compile: %d new graph(s) in %.1f s (%d in all)", new,
                        time.perf_counter() - start, num_compiled_graphs())
        return hidden[:num_tokens]

    return forward


def _padded(tokens: torch.Tensor | None) -> torch.Tensor | None:
    """``tokens`` (``[T, ...]``) with its first dimension marked dynamic, and a zero row
    added to a single one. Dynamo compiles sizes 0 and 1 apart from the others (it
    specialises on them), so a step of one token is run as two - the attention backends
    take padded queries and give their rows zeros - and every step shares one graph."""
    if tokens is None:
        return None
    if tokens.shape[0] == 1:
        tokens = torch.cat([tokens, torch.zeros_like(tokens)])
    torch._dynamo.mark_dynamic(tokens, 0)
    return tokens
