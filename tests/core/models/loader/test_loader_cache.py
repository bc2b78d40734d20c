"""The GGUF conversion cache: the first load converts, later loads read the entry and give
the very model a direct read gives; broken entries are rebuilt, a changed file gets a new
entry, and an unwritable cache only costs speed."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from octavo import paths
from octavo.models.loader import gguf_cache, gguf_file, load_model_files
from octavo.testing.seeds import draw_seed
from tests.core.loader_helpers import TinyGguf, dense_weights
from tests.core.models.loader.test_loader_gguf import ALL_TYPES

TEXT = "<|bos|>user\nhé 🙂 the<|eos|>"


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(folder))
    return folder


@pytest.fixture
def gguf(tmp_path: Path) -> tuple[Path, int]:
    seed = draw_seed()
    path = tmp_path / "tiny.gguf"
    TinyGguf(types=ALL_TYPES).write(path, np.random.default_rng(seed))
    return path, seed


def assert_same_model(path: Path, seed: int) -> None:
    """What load_model_files gives now equals a direct read of the GGUF."""
    direct = gguf_file.read_gguf(path)
    loaded = load_model_files(path)
    assert loaded.source == path
    assert loaded.hf_config == direct.hf_config, f"seed={seed}"
    ours, expected = dense_weights(loaded), dense_weights(direct)
    assert ours.keys() == expected.keys(), f"seed={seed}"
    for name, tensor in expected.items():
        assert ours[name].dtype == tensor.dtype, f"seed={seed} {name}"
        assert torch.equal(ours[name], tensor), f"seed={seed} {name}"
    assert loaded.tokenizer.chat_template == direct.tokenizer.chat_template
    assert loaded.tokenizer.encode(TEXT) == direct.tokenizer.encode(TEXT)
    assert loaded.tokenizer.eos_token_id == direct.tokenizer.eos_token_id


def test_first_load_converts_and_later_loads_read_the_entry(
        cache_dir: Path, gguf: tuple[Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    path, seed = gguf
    assert_same_model(path, seed)  # converts
    entry = gguf_cache.entry_path(path)
    assert entry.parent == cache_dir / "gguf"
    manifest = json.loads((entry / gguf_cache.MANIFEST).read_text())
    assert manifest["source"] == str(path.resolve())

    def no_gguf_read(_: Path) -> None:
        raise AssertionError("the GGUF was parsed although its entry exists")

    monkeypatch.setattr(gguf_file, "read_gguf", no_gguf_read)
    files = load_model_files(path)
    assert files.weight_file_of("lm_head.weight") == path  # errors name the user's file


def _truncate_weights(entry: Path) -> None:
    weights = entry / gguf_cache.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:1000])


def _drop_manifest(entry: Path) -> None:
    (entry / gguf_cache.MANIFEST).unlink()


def _garble_config(entry: Path) -> None:
    # Same size, so only loading it finds the problem.
    config = entry / "config.json"
    config.write_bytes(b"{" * config.stat().st_size)


def _garble_weights_header(entry: Path) -> None:
    weights = entry / gguf_cache.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[8:40] = b"x" * 32
    weights.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate_weights, _drop_manifest, _garble_config,
                                    _garble_weights_header], ids=lambda f: f.__name__[1:])
def test_a_damaged_entry_is_rebuilt(cache_dir: Path, gguf: tuple[Path, int], damage,
                                    caplog: pytest.LogCaptureFixture) -> None:
    path, seed = gguf
    load_model_files(path)
    entry = gguf_cache.entry_path(path)
    damage(entry)
    with caplog.at_level(logging.WARNING, logger=gguf_cache.__name__):
        assert_same_model(path, seed)
    assert f"conversion cache entry {entry} is unusable" in caplog.text
    assert gguf_cache.lookup(path) == entry  # whole again


def test_a_changed_file_gets_a_new_entry_and_the_old_one_goes(
        cache_dir: Path, gguf: tuple[Path, int]) -> None:
    path, _ = gguf
    load_model_files(path)
    old_entry = gguf_cache.entry_path(path)
    seed = draw_seed()
    TinyGguf(tied=True).write(path, np.random.default_rng(seed))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert gguf_cache.entry_path(path) != old_entry
    assert_same_model(path, seed)
    assert not old_entry.exists()
    assert [p.name for p in (cache_dir / "gguf").iterdir()] == [gguf_cache.entry_path(path).name]


def test_an_unwritable_cache_falls_back_to_reading_the_gguf(
        tmp_path: Path, gguf: tuple[Path, int], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("the cache folder cannot be made under a file")
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(blocker / "cache"))
    path, seed = gguf
    with caplog.at_level(logging.WARNING, logger=gguf_cache.__name__):
        assert_same_model(path, seed)
    assert "cannot write the conversion cache" in caplog.text


def test_a_second_conversion_of_the_same_file_leaves_the_first_entry_in_place(
        cache_dir: Path, gguf: tuple[Path, int]) -> None:
    """Two engines converting one GGUF at once (data-parallel engines of a fresh cache):
    the one that finishes second must not remove the entry the first stored, which that
    engine is loading; it finds the entry there and uses it."""
    path, seed = gguf
    load_model_files(path)
    entry = gguf_cache.entry_path(path)
    first = (entry / gguf_cache.WEIGHTS).stat().st_ino
    assert gguf_cache.store(path, gguf_file.read_gguf(path)) == entry
    assert (entry / gguf_cache.WEIGHTS).stat().st_ino == first, "the first entry was replaced"
    assert [p.name for p in (cache_dir / "gguf").iterdir()] == [entry.name]  # no leftovers
    assert_same_model(path, seed)
