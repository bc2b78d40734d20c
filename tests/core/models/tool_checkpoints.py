"""Checkpoints written by the real quantization tools (issue 52) from one tiny random Llama,
for the tests of octavo's loaders, CPU kernels, Triton kernels and tensor parallelism.

Each tool runs ``benchmarks/quant_tools.py`` in its own environment
(``scripts/install_quant_tools.sh TOOL`` makes ``.venv-quant/TOOL``: llm-compressor pins
transformers 5.17 and compressed-tensors 0.19, GPTQModel numpy 2.2.6, none of which octavo's
environment has), once per test session, into a temporary folder: the checkpoint as the tool
saved it and the model dequantized to fp32 by the tool's own code. Where a tool's
environment is missing (CI installs none: their stacks take minutes), the tests that need it
skip, naming the command that installs it. ``OCTAVO_QUANT_TOOLS_OUT=DIR`` keeps the outputs
in DIR and reuses them in later runs (a scheme is written when its ``-exact`` folder is
missing).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.core.tiny_models import save_tiny_model

REPO = Path(__file__).resolve().parents[3]
WRITER = REPO / "benchmarks" / "quant_tools.py"
TOOL_ENVS = Path(os.environ.get("OCTAVO_QUANT_TOOLS", REPO / ".venv-quant"))
SEED = 52  # the tiny Llama's weights: one model for every tool, written once a session
TIMEOUT_S = 1200  # GPTQModel took 7 minutes for one scheme on the busy 2-core machine

# tool: {scheme: the quant_method its config.json names}
SCHEMES = {
    "llmcompressor": {"w4a16": "compressed-tensors", "w8a8": "compressed-tensors",
                      "fp8": "compressed-tensors", "fp8-dynamic": "compressed-tensors"},
    "gptqmodel": {"gptq-4bit-act-order": "gptq", "gptq-8bit": "gptq"},
    "autoawq": {"awq": "awq"},
}
TOOL_SCHEMES = [(tool, scheme) for tool, schemes in SCHEMES.items() for scheme in schemes]


@dataclass(frozen=True)
class ToolCheckpoint:
    """One scheme's checkpoint as the tool saved it, and its dequantized fp32 model."""

    folder: Path
    exact: Path
    quant_method: str


KEEP_ENV = "OCTAVO_QUANT_TOOLS_OUT"  # a folder to keep the tools' outputs in across runs

_root: Path | None = None
_written: dict[str, dict[str, ToolCheckpoint]] = {}


def _session_root() -> Path:
    global _root
    if _root is None:
        if os.environ.get(KEEP_ENV):
            _root = Path(os.environ[KEEP_ENV])
        else:
            _root = Path(tempfile.mkdtemp(prefix="octavo-quant-tools-"))
            atexit.register(shutil.rmtree, _root, ignore_errors=True)
        print(f"tiny Llama for the quantization tools: seed {SEED}, in {_root}")
        if not (_root / "dense" / "model.safetensors").exists():
            save_tiny_model("llama", _root / "dense", SEED, hidden_size=128, head_dim=32,
                            intermediate_size=256)
    return _root


def dense_folder() -> Path:
    """The tiny Llama (hidden 128, 2 layers, fp32) every tool quantizes."""
    return _session_root() / "dense"


def tool_checkpoints(tool: str) -> dict[str, ToolCheckpoint]:
    """Every scheme of ``tool`` (``SCHEMES``), written on first use; skips the calling
    test where the tool's environment is not installed."""
    if tool not in _written:
        python = TOOL_ENVS / tool / "bin" / "python"
        if not python.exists():
            pytest.skip(f"{tool} is not installed ({python} is missing): "
                        f"scripts/install_quant_tools.sh {tool}")
        root = _session_root()
        schemes = SCHEMES[tool]
        missing = [s for s in schemes if not (root / tool / f"{s}-exact").exists()]
        command = [str(python), str(WRITER), tool, "--dense", str(root / "dense"), "--out",
                   str(root / tool), "--schemes", ",".join(missing)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                              cwd=root,  # GPTQModel writes logs/ where it runs
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}
                              ) if missing else None
        if done is not None and done.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
        _written[tool] = {scheme: ToolCheckpoint(root / tool / scheme,
                                                 root / tool / f"{scheme}-exact", method)
                          for scheme, method in schemes.items()}
    return _written[tool]
