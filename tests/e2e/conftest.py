"""Shared servers: one tiny-model ``octavo serve`` for the whole session, started once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from openai import OpenAI

from octavo import LLM

from ..core.tiny_models import TinyModel, fresh_tiny_llama
from .server import API_KEY, Server

TINY_SERVER_ARGS = ["--dtype", "float32", "--kv-cache-memory", "32MiB",
                    "--max-num-batched-tokens", "1024"]


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The offline engines these tests compare against run on one thread, as the servers do
    (see ONE_THREAD_ENV)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return fresh_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def offline(tiny_model: TinyModel) -> LLM:
    """The offline API on the tiny model: the reference the servers' outputs must equal."""
    return LLM(model=str(tiny_model.folder), dtype="float32", kv_cache_memory=8 * 2**20)


def start_tiny_server(model: TinyModel, log_dir: Path, *args: str) -> Server:
    return Server(["--model", str(model.folder), *TINY_SERVER_ARGS, *args],
                  log_dir / "server.log")


@pytest.fixture(scope="session")
def tiny_server(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory,
                ) -> Iterator[Server]:
    """The tiny model behind an API key (the served name is the model path)."""
    with start_tiny_server(tiny_model, tmp_path_factory.mktemp("tiny-server"),
                           "--api-key", API_KEY) as server:
        yield server


@pytest.fixture(scope="session")
def client(tiny_server: Server) -> OpenAI:
    """The official client; no retries, so a 503 is seen as one."""
    return OpenAI(base_url=f"{tiny_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
