"""Fixtures the speculative-decoding tests share: a seed per module and a tiny random
Llama target built from it (print the seed in assert messages to reproduce a failure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def seed() -> int:
    return draw_seed()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, seed: int) -> Path:
    folder = tmp_path_factory.mktemp("target")
    save_tiny_model("llama", folder, seed=seed)
    return folder
