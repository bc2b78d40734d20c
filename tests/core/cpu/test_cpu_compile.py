"""``-O`` (``compilation_config``): the model's forward through ``torch.compile`` on the CPU
(``octavo.cpu.compile``), attention an opaque op (``octavo.attention.opaque``), checked
against the eager engine on a tiny random Qwen3 - a model the fused kernels do not take in
fp32, the path ``-O`` is for."""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from octavo import LLM
from octavo.config import ConfigError, EngineConfig
from octavo.config.compilation import CompilationConfig
from octavo.cpu.compile import check_inductor_options, num_compiled_graphs
from octavo.entrypoints.engine_args import build_config, engine_options
from octavo.paths import cache_root
from octavo.platforms.base import Platform
from octavo.testing.seeds import draw_seed
from tests.core.parity import engine_greedy
from tests.core.tiny_models import VOCAB_SIZE, save_tiny_model


def _cpp_compiler() -> str | None:
    """The C++ compiler Inductor would use, None where there is none."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        return get_cpp_compiler()
    except RuntimeError:
        return None


needs_cpp_compiler = pytest.mark.skipif(
    _cpp_compiler() is None, reason="Inductor's C++ backend needs a C++ compiler (g++/clang++)")


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB_SIZE, size=n).tolist() for n in lengths]


@needs_cpp_compiler
def test_compiled_qwen3_greedy_matches_eager(tmp_path: Path) -> None:
    """fp32 greedy tokens identical to eager and logits within 1e-4, over chunked prefills
    and decodes of several batch sizes, all from ONE graph compiled at start-up; a second
    batch of other sizes, one lone request among them (a one-token step), compiles none;
    Inductor's kernels are in the default cache, under $OCTAVO_CACHE_DIR: where CI keeps
    that folder between runs, a later run compiles from it (seconds, not a minute)."""
    weights_seed, seed = draw_seed(), draw_seed()
    print(f"weights seed={weights_seed} prompts seed={seed}")
    save_tiny_model("qwen3", tmp_path / "model", weights_seed)
    engine = dict(model=str(tmp_path / "model"), dtype="float32", max_num_batched_tokens=32,
                  max_num_seqs=4, kv_cache_memory=16 * 2**20)
    prompts = _prompts([3, 11, 26, 40], seed)
    eager = LLM(**engine)
    eager_tokens, eager_logits = engine_greedy(eager, prompts, 12)
    eager_lone = engine_greedy(eager, _prompts([9], seed + 1), 4)[0]

    before, start = num_compiled_graphs(), time.perf_counter()
    llm = LLM(**engine, compilation_config=3)
    graphs = num_compiled_graphs() - before
    print(f"start-up with the compile: {time.perf_counter() - start:.1f} s, {graphs} graph(s)")
    tokens, logits = engine_greedy(llm, prompts, 12)
    assert num_compiled_graphs() - before == graphs, "the steps compiled after start-up"
    label = f"weights seed {weights_seed}, prompts seed {seed}"
    assert tokens == eager_tokens, label
    gap = max(float((a - b).abs().max()) for got, want in zip(logits, eager_logits)
              for a, b in zip(got, want))
    print(f"largest logit difference {gap:.2e}")
    assert gap < 1e-4, f"{label}: logits differ by {gap:.2e}"
    assert graphs == 1, f"{graphs} graphs: a graph break or a recompile"
    assert any((cache_root() / "inductor").rglob("*.so")), "no kernel in the default cache"

    again = num_compiled_graphs()
    assert engine_greedy(llm, _prompts([9], seed + 1), 4)[0] == eager_lone, label
    engine_greedy(llm, _prompts([5, 17, 33], seed + 2), 6)
    assert num_compiled_graphs() == again, "other batch sizes recompiled the forward"


def test_levels_parse_as_vllm_spells_them() -> None:
    """``-O3``, JSON and dicts; a bad level, key or Inductor option is a ConfigError naming
    it; the default is eager."""
    assert CompilationConfig.parse("3").level == 3
    parsed = CompilationConfig.parse('{"level": 2, "cache_dir": "/x", '
                                     '"inductor_compile_config": {"freezing": true}}')
    assert (parsed.cache_dir, parsed.inductor_compile_config) == ("/x", {"freezing": True})
    assert EngineConfig.from_kwargs().compilation.level == 0
    assert EngineConfig.from_kwargs(compilation_config=1).compilation.level == 1
    with pytest.raises(ConfigError, match="level must be an integer from 0 to 3, got 4"):
        CompilationConfig.parse("4")
    with pytest.raises(ConfigError, match="unknown key 'mode'"):
        CompilationConfig.parse('{"mode": 3}')
    with pytest.raises(ConfigError, match="no option 'freezeing'"):
        check_inductor_options({"freezeing": True, "cpp.threads": 2})


def test_the_flag_as_vllm_users_type_it() -> None:
    """``-O3``, ``-O 3`` and ``--compilation-config JSON`` reach the config; a bad level is
    a usage error naming it, before any model is loaded."""
    levels: list[int] = []

    @click.command()
    @engine_options
    def command(**kwargs: object) -> None:
        levels.append(build_config(kwargs).compilation.level)

    for args in (["-O3"], ["-O", "2"], ["--compilation-config", '{"level": 1}'], []):
        result = CliRunner().invoke(command, args)
        assert result.exit_code == 0, result.output
    assert levels == [3, 2, 1, 0]
    result = CliRunner().invoke(command, ["-O7"])
    assert result.exit_code == 2 and "level must be an integer from 0 to 3, got 7" in result.output


def test_unverified_combinations_are_refused() -> None:
    """-O with several ranks or LoRA is refused when the config is built; --enforce-eager
    turns -O off, so then nothing is refused."""
    with pytest.raises(ConfigError, match="one rank only"):
        EngineConfig.from_kwargs(compilation_config=3, tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="enable_lora"):
        EngineConfig.from_kwargs(compilation_config=3, enable_lora=True)
    EngineConfig.from_kwargs(compilation_config=3, enable_lora=True, enforce_eager=True)


def test_a_platform_without_compile_refuses() -> None:
    """The portable default says which backend and what to do instead."""

    class Bare(Platform):
        name = "bare"

    with pytest.raises(ConfigError, match="not supported on the bare backend; use -O0"):
        Bare.compile_model(None, CompilationConfig(level=3))  # type: ignore[arg-type]
