"""Fixtures of the KV-connector tests: a tiny random model, fresh random prompts, engines in
their own processes, and a real ``mooncake_master`` on loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from octavo.net import free_port
from octavo.testing.seeds import draw_seed

from ..core.tiny_models import TinyModel, fresh_tiny_llama

BLOCK_SIZE = 16
HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return fresh_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@dataclass
class Prompts:
    produced: list[list[int]]  # what the producer computes
    consumed: list[list[int]]  # the same, plus one extending a produced prompt, one short
    seed: int

    def expected_loaded(self) -> list[int]:
        """Per consumed prompt: the prompt tokens a consumer loads (block-aligned, the last
        token always computed; the extension finds its base prompt's stored prefix)."""
        base = (len(self.produced[0]) - 1) // BLOCK_SIZE * BLOCK_SIZE
        own = [(len(p) - 1) // BLOCK_SIZE * BLOCK_SIZE for p in self.produced]
        return [*own, base, 0]


@pytest.fixture
def prompts(tmp_path: Path) -> Prompts:
    seed = draw_seed()
    rng = np.random.default_rng(seed)
    produced = [rng.integers(0, 256, int(n)).tolist() for n in rng.integers(40, 120, 3)]
    extension = produced[0] + rng.integers(0, 256, 2 * BLOCK_SIZE + 3).tolist()
    short = rng.integers(0, 256, BLOCK_SIZE - 3).tolist()
    return Prompts(produced, [*produced, extension, short], seed)


def write_prompts(folder: Path, name: str, token_ids: list[list[int]]) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(token_ids))
    return path


def engine_command(model: TinyModel, prompts_file: Path, kv_config: dict[str, Any] | None,
                   *flags: str) -> list[str]:
    args = [str(model.folder), str(prompts_file)]
    if kv_config is not None:
        args.append(json.dumps(kv_config))
    return [sys.executable, "-m", "tests.connectors.engine_process", *args, *flags]


def engine_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def run_engine(model: TinyModel, prompts_file: Path,
               kv_config: dict[str, Any] | None = None, *flags: str) -> dict[str, Any]:
    """One engine in its own process (``flags``: engine_process's); its JSON report."""
    return run_engines(model, (prompts_file, kv_config), flags=flags)[0]


def run_engines(model: TinyModel, *runs: tuple[Path, dict[str, Any] | None],
                flags: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Independent engines, each in its own process, side by side; their JSON reports."""
    procs = [subprocess.Popen(engine_command(model, prompts_file, kv_config, *flags), cwd=ROOT,
                              env=engine_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
             for prompts_file, kv_config in runs]
    reports = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            reports.append(dict(json.loads(out.strip().splitlines()[-1])))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return reports



@dataclass
class MooncakeMaster:
    proc: subprocess.Popen[bytes]
    address: str  # host:port of its RPC service

    def kv_config(self, role: str) -> dict[str, Any]:
        return {"connector": "mooncake", "role": role, "master_server_address": self.address,
                "global_segment_size": 64 * 2**20, "local_buffer_size": 16 * 2**20}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_mooncake_master(*extra_args: str, log: Any = subprocess.DEVNULL) -> MooncakeMaster:
    """A real mooncake_master on loopback (peers find each other by P2P handshake, so no
    metadata server), once it listens; ``log`` takes its output."""
    binary = shutil.which("mooncake_master", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.fail("mooncake_master is not installed: scripts/install.sh installs "
                    "octavo-connectors[mooncake]")
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--rpc_port={port}", f"--rpc_address={HOST}",
         f"--metrics_port={free_port()}", f"--metrics_host={HOST}", *extra_args],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    master = MooncakeMaster(proc, f"{HOST}:{port}")
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            master.stop()
            pytest.fail("mooncake_master exited (see its log)")
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return master
        except OSError:
            if time.monotonic() > deadline:
                master.stop()
                pytest.fail("mooncake_master did not start listening")
            time.sleep(0.1)


@pytest.fixture
def mooncake_master(tmp_path: Path) -> Iterator[MooncakeMaster]:
    """A mooncake_master for one test, stopped after it even when it fails."""
    with open(tmp_path / "mooncake_master.log", "wb") as log:
        master = start_mooncake_master(log=log)
        try:
            yield master
        finally:
            master.stop()
