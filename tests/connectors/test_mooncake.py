"""The Mooncake connector against a real mooncake_master on loopback: producer and consumer
engines in their own processes, and the fallback when the master is gone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .conftest import (
    ROOT,
    MooncakeMaster,
    Prompts,
    TinyModel,
    engine_command,
    engine_env,
    run_engine,
    write_prompts,
)


def start_engine(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(command, cwd=ROOT, env=engine_env(), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Close its stdin (a held producer then exits) and reap it, killed after ``timeout``."""
    if proc.poll() is None:
        try:
            proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_mooncake_producer_to_consumer_and_master_loss(
        tiny_model: TinyModel, prompts: Prompts, tmp_path: Path,
        mooncake_master: MooncakeMaster) -> None:
    why = f"model seed {tiny_model.seed}, prompt seed {prompts.seed}"
    produced = write_prompts(tmp_path, "produced", prompts.produced)
    consumed = write_prompts(tmp_path, "consumed", prompts.consumed)
    # The producer holds the KV in its store segment: it stays up until the consumer ran.
    # The late consumer joins the store now and generates only once the master is gone.
    producer = start_engine(engine_command(tiny_model, produced,
                                           mooncake_master.kv_config("producer"), "--hold"))
    late_consumer = start_engine(engine_command(
        tiny_model, consumed, mooncake_master.kv_config("consumer"), "--wait"))
    try:
        assert producer.stdout is not None
        assert late_consumer.stdin is not None and late_consumer.stdout is not None
        assert json.loads(producer.stdout.readline())["kv_transfer"]["saves"] == 3, why
        reference = run_engine(tiny_model, consumed)

        consumer = run_engine(tiny_model, consumed, mooncake_master.kv_config("consumer"))
        assert consumer["tokens"] == reference["tokens"], why
        expected = prompts.expected_loaded()
        assert consumer["num_cached_tokens"] == expected, why
        assert consumer["kv_transfer"]["loads"] == 4, why
        assert consumer["kv_transfer"]["loaded_tokens"] == sum(expected), why
        finish(producer)

        # Its master dies before it generates: it computes every prompt itself.
        assert late_consumer.stdout.readline().strip() == "ready"
        mooncake_master.stop()
        late_consumer.stdin.write("go\n")
        late_consumer.stdin.flush()
        late = json.loads(late_consumer.stdout.readline())
        assert late["tokens"] == reference["tokens"], why
        assert late["kv_transfer"]["loads"] == 0, why
        # Its results are in; without a master its client would retry for a while on exit.
        finish(late_consumer, timeout=0)
    finally:
        finish(producer)
        finish(late_consumer)


def test_mooncake_tensor_parallel_producer_to_consumer(
        tiny_model: TinyModel, prompts: Prompts, tmp_path: Path,
        mooncake_master: MooncakeMaster) -> None:
    """Each of two ranks (a Mooncake client of its own in each worker process) puts and
    gets its half of the KV heads; the consumer's tokens are one engine's."""
    why = f"model seed {tiny_model.seed}, prompt seed {prompts.seed}"
    produced = write_prompts(tmp_path, "produced", prompts.produced)
    consumed = write_prompts(tmp_path, "consumed", prompts.consumed)
    producer = start_engine(engine_command(tiny_model, produced,
                                           mooncake_master.kv_config("producer"), "--hold",
                                           "--tp=2"))
    try:
        assert producer.stdout is not None
        assert json.loads(producer.stdout.readline())["kv_transfer"]["saves"] == 3, why
        reference = run_engine(tiny_model, consumed)
        consumer = run_engine(tiny_model, consumed, mooncake_master.kv_config("consumer"),
                              "--tp=2")
        assert consumer["tokens"] == reference["tokens"], why
        assert consumer["num_cached_tokens"] == prompts.expected_loaded(), why
        assert consumer["kv_transfer"]["loads"] == 4, why
        assert consumer["kv_transfer"]["failed_loads"] == 0, why
    finally:
        finish(producer)
