"""The TPU backend behind the user-facing entry points, in interpret mode: ``octavo
generate --backend tpu`` prints what the CPU backend prints, ``octavo serve --backend
tpu`` answers the real ``openai`` client with the CPU engine's completion, and ``octavo
plugins`` says which devices the backend runs on (interpret mode, or none seen)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI

from octavo import LLM, SamplingParams
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model
from tests.e2e.server import API_KEY, Server
from tests.tpu.test_tpu_engine import interpret_env

ENGINE_FLAGS = ["--dtype", "float32", "--kv-cache-memory", "1MiB", "--max-num-seqs", "4",
                "--max-num-batched-tokens", "8", "--max-model-len", "64"]
PROMPT = "the tiny model says"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tiny Mistral (sliding window 8, shorter than the prompts) with fresh weights."""
    seed = draw_seed()
    folder = tmp_path_factory.mktemp("mistral")
    save_tiny_model("mistral", folder, seed)
    return folder, f"mistral seed {seed}"


@pytest.fixture(scope="module")
def cpu_llm(mistral: tuple[Path, str]) -> LLM:
    """The torch CPU backend on the tiny Mistral, in this process: the reference."""
    return LLM(model=str(mistral[0]), backend="cpu", dtype="float32", kv_cache_memory=2**20,
               max_model_len=64)


def cpu_text(llm: LLM, **settings: object) -> str:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, **settings)
    return llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].text


def test_cli_generate_matches_cpu(mistral: tuple[Path, str], cpu_llm: LLM) -> None:
    folder, label = mistral
    got = subprocess.run(
        [sys.executable, "-m", "octavo", "generate", PROMPT, "--raw", "--model", str(folder),
         "--backend", "tpu", "--max-tokens", str(MAX_TOKENS), "--temperature", "0",
         *ENGINE_FLAGS], capture_output=True, env=interpret_env(), timeout=600)
    stderr = got.stderr.decode()
    assert got.returncode == 0, stderr[-3000:]
    # Bytes decoded here: text=True would read a generated "\r" as a newline (universal
    # newlines), and a random model does generate one now and then.
    assert got.stdout.decode() == cpu_text(cpu_llm) + "\n", label
    assert "tpu: compiled 3 step buckets" in stderr


def test_serve_answers_openai_client(mistral: tuple[Path, str], cpu_llm: LLM, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    folder, label = mistral
    for name, value in interpret_env().items():  # the server's environment
        monkeypatch.setenv(name, value)
    args = ["--model", str(folder), "--backend", "tpu", "--api-key", API_KEY, *ENGINE_FLAGS]
    with Server(args, tmp_path / "server.log") as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                        timeout=300)
        completion = client.completions.create(
            model=str(folder), prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0,
            extra_body={"ignore_eos": True})
    assert completion.choices[0].text == cpu_text(cpu_llm, ignore_eos=True), label
    assert completion.usage.completion_tokens == MAX_TOKENS


def run_plugins(env: dict[str, str]) -> str:
    result = subprocess.run([sys.executable, "-m", "octavo", "plugins"], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_plugins_row_says_interpret_mode() -> None:
    out = run_plugins(interpret_env(devices=2))
    assert ("tpu: yes (interpret mode on 2 CPU devices (OCTAVO_TPU_INTERPRET=1): Pallas "
            "kernels in TPU interpret mode") in out, out


def test_plugins_row_without_a_tpu() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OCTAVO_TPU_INTERPRET"}
    out = run_plugins(env)
    assert "tpu: no (JAX sees no TPU devices" in out, out
