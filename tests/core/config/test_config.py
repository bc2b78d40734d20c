"""The config package: parts composed into ``EngineConfig``, flat vLLM keywords, the CLI's
engine flags generated from the fields, and clear errors for what is not built yet."""

from __future__ import annotations

import re
import sys

import click
import pytest
from click.testing import CliRunner

from octavo.config import ConfigError, EngineConfig, ParallelConfig
from octavo.config.engine import flat_fields
from octavo.entrypoints.engine_args import build_config, engine_options


def test_flat_keywords_land_in_their_parts() -> None:
    config = EngineConfig.from_kwargs(max_num_seqs=8, block_size=32, dtype="bfloat16",
                                      backend="cpu", scheduler_cls="default",
                                      kv_transfer_config={"connector": "x"})
    assert config.scheduler.max_num_seqs == 8
    assert config.cache.block_size == 32
    assert config.model.dtype == "bfloat16"
    assert config.device.backend == "cpu"
    assert config.kv_transfer is not None and config.kv_transfer.connector == "x"
    with pytest.raises(ConfigError, match="unknown engine argument 'max_seqs'"):
        EngineConfig.from_kwargs(max_seqs=8)


def test_memory_sizes_are_read_from_keywords_as_from_flags() -> None:
    assert EngineConfig.from_kwargs(kv_cache_memory="64MiB").cache.kv_cache_memory == 2**26
    assert EngineConfig.from_kwargs(kv_cache_memory=2**20).cache.kv_cache_memory == 2**20
    with pytest.raises(ConfigError, match="cannot read '64 apples' as a memory size"):
        EngineConfig.from_kwargs(kv_cache_memory="64 apples")


def test_each_default_is_written_once_and_the_flags_come_from_it() -> None:
    names = [f.name for _, f in flat_fields()]
    assert len(names) == len(set(names))  # one owner per keyword

    @click.command()
    @engine_options
    def command(**kwargs: object) -> None:
        config = build_config(dict(kwargs))
        click.echo(f"{config.scheduler.max_num_seqs} {config.cache.kv_cache_memory} "
                   f"{config.cache.enable_prefix_caching} {config.device.enforce_eager}")

    runner = CliRunner()
    assert runner.invoke(command, []).output.split() == ["256", "None", "True", "False"]
    result = runner.invoke(command, ["--max-num-seqs", "4", "--kv-cache-memory", "1MiB",
                                     "--no-enable-prefix-caching", "--enforce-eager"])
    assert result.output.split() == ["4", str(2**20), "False", "True"], result.output
    help_text = runner.invoke(command, ["--help"]).output
    for flag in ("--scheduler-cls", "--kv-manager", "-tp, --tensor-parallel-size",
                 "-sp, --sequence-parallel-size",
                 "--distributed-executor-backend", "--disable-log-stats",
                 "--speculative-config", "--structured-outputs-config"):
        assert flag in help_text
    bad = runner.invoke(command, ["--kv-cache-memory", "lots"])
    assert bad.exit_code == 2 and "cannot read 'lots' as a memory size" in bad.output


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"enable_expert_parallel": True}, "it needs tensor_parallel_size > 1"),
    ({"data_parallel_size": 2, "pipeline_parallel_size": 2, "enable_expert_parallel": True},
     "data_parallel_size=2 does not run with pipeline_parallel_size=2 yet"),
    ({"data_parallel_size": 2, "data_parallel_backend": "ray", "enable_expert_parallel": True},
     "does not run with data_parallel_backend='ray' yet"),
    ({"data_parallel_size": 2, "distributed_executor_backend": "uni",
      "enable_expert_parallel": True}, "does not run with distributed_executor_backend='uni'"),
    ({"data_parallel_size": 2, "data_parallel_start_rank": 1, "data_parallel_size_local": 2},
     "name engines beyond data_parallel_size=2"),
    ({"data_parallel_size": 2, "data_parallel_rank": 2}, "is not one of this node's engines"),
    ({"data_parallel_backend": "slurm"}, "must be one of mp, ray"),
    ({"distributed_executor_backend": "slurm"}, "must be one of uni, mp, ray"),
    ({"distributed_executor_backend": "uni", "tensor_parallel_size": 2},
     "'uni' runs one worker"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size must be a positive integer"),
    ({"sequence_parallel_size": 0}, "sequence_parallel_size must be a positive integer"),
    ({"sequence_parallel_size": 2, "pipeline_parallel_size": 2},
     "sequence_parallel_size=2 with pipeline_parallel_size=2 is not built"),
    ({"distributed_executor_backend": "uni", "sequence_parallel_size": 2},
     "'uni' runs one worker"),
])
def test_parallelism_not_built_yet_is_refused_clearly(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        ParallelConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [{"distributed_executor_backend": "ray"},
                                    {"data_parallel_size": 2, "data_parallel_backend": "ray"}])
def test_ray_backends_without_ray_name_what_to_install(kwargs: dict,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # find_spec: not installed
    with pytest.raises(ConfigError, match=re.escape("pip install 'octavo[ray]'")):
        ParallelConfig(**kwargs)


def test_data_parallel_defaults_run_every_engine_here() -> None:
    config = ParallelConfig(data_parallel_size=3)
    assert config.data_parallel_size_local == 3
    headless = ParallelConfig(data_parallel_size=3, data_parallel_start_rank=1,
                              data_parallel_rank=2)
    assert (headless.data_parallel_size_local, headless.data_parallel_rank_local) == (2, 1)


def test_executor_backend_follows_the_world_size() -> None:
    assert ParallelConfig().distributed_executor_backend == "uni"
    assert ParallelConfig(tensor_parallel_size=2,
                          pipeline_parallel_size=2).distributed_executor_backend == "mp"
    assert ParallelConfig(tensor_parallel_size=2).world_size == 2
    assert ParallelConfig(tensor_parallel_size=2, sequence_parallel_size=3).world_size == 6


CONNECTOR = {"connector": "shared_storage", "role": "producer", "path": "/nonexistent"}


@pytest.mark.parametrize(("kwargs", "on"), [
    ({"pipeline_parallel_size": 2}, True),
    ({"pipeline_parallel_size": 2, "enable_pipeline_micro_batching": False}, False),
    ({}, False),
    ({"tensor_parallel_size": 2}, False),
    ({"pipeline_parallel_size": 2, "distributed_executor_backend": "ray"}, False),
    ({"pipeline_parallel_size": 2, "kv_transfer_config": CONNECTOR}, False),
    ({"pipeline_parallel_size": 2, "scheduler_cls": "my.Scheduler"}, False),
])
def test_pipeline_micro_batches_are_on_by_default_where_they_run(kwargs: dict, on: bool,
                                                                 ) -> None:
    """Unset, micro-batches run with pipeline stages on the mp executor, and are off where
    steps run one at a time (test_micro_batches.py: asked for there, refused)."""
    assert EngineConfig.from_kwargs(**kwargs).parallel.enable_pipeline_micro_batching is on


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pipeline_parallel_size": 2, "speculative_config": {"method": "ngram",
      "num_speculative_tokens": 2}}, "speculative decoding does not run with several workers"),
    ({"tensor_parallel_size": 2, "speculative_config": {"method": "medusa", "model": "m",
      "num_speculative_tokens": 2}}, "speculative decoding does not run with several workers"),
    ({"sequence_parallel_size": 2, "kv_transfer_config": {"connector": "shared_storage"}},
     "a KV connector .* does not run with sequence parallelism yet"),
])
def test_parallel_combinations_not_built_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EngineConfig.from_kwargs(**kwargs)


def test_structured_outputs_config_is_checked() -> None:
    config = EngineConfig.from_kwargs(structured_outputs_config='{"max_cached_grammars": 8}')
    assert config.structured_outputs.max_cached_grammars == 8
    with pytest.raises(ConfigError, match="unknown key 'cache'"):
        EngineConfig.from_kwargs(structured_outputs_config={"cache": 1})
    with pytest.raises(ConfigError, match="backend must be one of xgrammar"):
        EngineConfig.from_kwargs(structured_outputs_config={"backend": "outlines"})
