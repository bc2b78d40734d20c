"""Hostile model configs and GGUF files: each is one error naming the field, raised before
anything is allocated; the CLI exits 2 with that one line and a small peak RSS.

The GGUFs are a tiny one (``TinyGguf``) with one field patched in place, so the file is
valid up to that field: what catches it is the check of that field, not a broken layout.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from octavo.models.config import ArchConfig
from octavo.models.loader import ModelLoadError
from octavo.models.loader.gguf_file import read_gguf
from tests.core.loader_helpers import TinyGguf
from tests.core.tiny_models import save_tiny_model, tiny_config

SEED = 5401  # the tiny models' weights; printed by the fixtures that use it
RSS_LIMIT_KIB = 1 << 20  # 1 GiB
# The CLI, writing its peak RSS (VmHWM) to argv[1] as it exits. Not the parent's
# ru_maxrss of the child: that keeps the high-water mark of the forked pytest image
# across exec, so it reads as this test process's size, not the CLI's.
PEAK_RSS_LAUNCHER = """
import atexit, sys
peak_file = sys.argv.pop(1)
def write_peak():
    with open("/proc/self/status") as status, open(peak_file, "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM")))
atexit.register(write_peak)
sys.argv[0] = "octavo"
from octavo.entrypoints.cli import main
main()
"""

HOSTILE_CONFIGS = {  # field edits -> what the one-line error says
    "vocab 2**40": ({"vocab_size": 2**40}, "'vocab_size': 1099511627776 is out of range"),
    "1e9 layers": ({"num_hidden_layers": 10**9}, "'num_hidden_layers': 1000000000 is out"),
    "float layers": ({"num_hidden_layers": 1e9}, "'num_hidden_layers': must be an integer"),
    "rope_theta -1": ({"rope_theta": -1}, "'rope_theta': -1 is out of range"),
    "eps NaN": ({"rms_norm_eps": math.nan}, "'rms_norm_eps': nan is out of range"),
    "head_dim 0": ({"head_dim": 0}, "'head_dim': 0 is out of range"),
    "head_dim 2**20": ({"head_dim": 2**20}, "'head_dim': 1048576 is out of range"),
    "context 2**40": ({"max_position_embeddings": 2**40}, "'max_position_embeddings'"),
    "hidden 0": ({"hidden_size": 0}, "'hidden_size': 0 is out of range"),
    "hidden str": ({"hidden_size": "64"}, "'hidden_size': must be an integer"),
    "heads 0": ({"num_attention_heads": 0}, "'num_attention_heads': 0 is out of range"),
    "heads > hidden": ({"num_attention_heads": 4096, "head_dim": None},
                       "'head_dim': is 0 (hidden_size"),
    "kv heads 3 of 4": ({"num_key_value_heads": 3}, "'num_key_value_heads': 3 does not divide"),
    "intermediate 2**40": ({"intermediate_size": 2**40}, "'intermediate_size'"),
    "rope factor -2": ({"rope_scaling": {"rope_type": "linear", "factor": -2.0}},
                       "'rope_scaling.factor': -2.0 is out of range"),
    "rope factor inf": ({"rope_scaling": {"rope_type": "linear", "factor": math.inf}},
                        "'rope_scaling.factor': inf"),
    "rope original 2**40": ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                              "original_max_position_embeddings": 2**40}},
                            "'rope_scaling.original_max_position_embeddings'"),
    "no rotated dims": ({"partial_rotary_factor": 0.01}, "rotates 0 of the"),
    "odd rotated dims": ({"partial_rotary_factor": 0.5, "head_dim": 6}, "rotates 3 of the"),
    "window 0": ({"sliding_window": 0}, "'sliding_window': 0 tokens: the layers that use"),
    "window -1": ({"sliding_window": -1}, "'sliding_window': -1 is out of range"),
    "experts 2**20": ({"num_local_experts": 2**20, "num_experts_per_tok": 2},
                      "'num_local_experts': 1048576"),
    "layer norm eps -1": ({"layer_norm_eps": -1.0}, "'layer_norm_eps': -1.0 is out of range"),
    "vocab bool": ({"vocab_size": True}, "'vocab_size': must be an integer"),
}


@pytest.mark.parametrize("edits, message", HOSTILE_CONFIGS.values(), ids=HOSTILE_CONFIGS)
def test_hostile_config_is_one_line_naming_the_field(edits, message):
    config = {**tiny_config("llama").to_dict(), **edits}
    with pytest.raises(ModelLoadError) as error:
        ArchConfig.from_hf(config, "config.json")
    text = str(error.value)
    assert message in text and "\n" not in text, text


def _patch_kv(data: bytearray, key: str, fmt: str, value: object) -> None:
    """Overwrite the value of metadata ``key`` (of ``fmt``'s size) in place."""
    name = key.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4
    struct.pack_into(fmt, data, at, value)


def _tensor_info(data: bytearray, name: str) -> int:
    """Where ``name``'s description goes on after its name (its dimension count)."""
    raw = name.encode()
    return data.index(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)


def _patch_tensor(data: bytearray, name: str, field: str, value: int) -> None:
    at = _tensor_info(data, name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    where = {"n_dims": (at, "<I"), "dim0": (at + 4, "<Q"), "dim1": (at + 12, "<Q"),
             "type": (at + 4 + 8 * n_dims, "<I"), "offset": (at + 8 + 8 * n_dims, "<Q")}
    struct.pack_into(where[field][1], data, where[field][0], value)


def _kv(key: str, fmt: str, value: object):
    return lambda data: _patch_kv(data, key, fmt, value)


def _tensor(name: str, field: str, value: int):
    return lambda data: _patch_tensor(data, name, field, value)


def _header(offset: int, fmt: str, value: int):
    return lambda data: struct.pack_into(fmt, data, offset, value)


def _array_length(key: str, value: int):
    def patch(data: bytearray) -> None:
        name = key.encode()
        at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4 + 4
        struct.pack_into("<Q", data, at, value)
    return patch


def _key_length(key: str, value: int):
    def patch(data: bytearray) -> None:
        name = key.encode()
        struct.pack_into("<Q", data, data.index(struct.pack("<Q", len(name)) + name), value)
    return patch


HOSTILE_GGUFS = {  # patch -> what the one-line error says
    "head_count 0": (_kv("llama.attention.head_count", "<I", 0),
                     "'llama.attention.head_count': must be a positive integer, got 0"),
    "context 2**32-1": (_kv("llama.context_length", "<I", 2**32 - 1),
                        "'max_position_embeddings': 4294967295 is out of range"),
    "embedding 0": (_kv("llama.embedding_length", "<I", 0), "'llama.embedding_length'"),
    "blocks 2**32-1": (_kv("llama.block_count", "<I", 2**32 - 1),
                       "'num_hidden_layers': 4294967295 is out of range"),
    "ffn 2**32-1": (_kv("llama.feed_forward_length", "<I", 2**32 - 1),
                    "'intermediate_size': 4294967295"),
    "kv heads 0": (_kv("llama.attention.head_count_kv", "<I", 0), "'num_key_value_heads': 0"),
    "key length 0": (_kv("llama.attention.key_length", "<I", 0),
                     "'llama.attention.key_length': must be a positive integer"),
    "rope dims 0": (_kv("llama.rope.dimension_count", "<I", 0), "'llama.rope.dimension_count'"),
    "rope dims odd": (_kv("llama.rope.dimension_count", "<I", 63), "63 must be even"),
    "freq base -1": (_kv("llama.rope.freq_base", "<f", -1.0), "'rope_theta': -1.0 is out"),
    "eps NaN": (_kv("llama.attention.layer_norm_rms_epsilon", "<f", math.nan),
                "'rms_norm_eps': nan is out of range"),
    "vocab 2**32-1": (_kv("llama.vocab_size", "<I", 2**32 - 1),
                      "'llama.vocab_size': 4294967295, but token_embd.weight has"),
    "offset near 2**64": (_tensor("blk.0.attn_q.weight", "offset", 2**64 - 32),
                          "tensor 'blk.0.attn_q.weight' offset: 18446744073709551584 +"),
    "offset unaligned": (_tensor("blk.0.attn_q.weight", "offset", 33),
                         "33 is not a multiple of the alignment 32"),
    "embedding rows 2**32-1": (_tensor("token_embd.weight", "dim1", 2**32 - 1),
                               "runs past the data section"),
    "dims 9": (_tensor("output.weight", "n_dims", 9), "dimension count: 9 is not in 1..4"),
    "dim 0": (_tensor("output_norm.weight", "dim0", 0), "none empty"),
    "type 999": (_tensor("output_norm.weight", "type", 999), "999 is not a GGML type"),
    "tensor count 2**63": (_header(8, "<Q", 2**63), "tensor count: 9223372036854775808 items"),
    "kv count 2**64-1": (_header(16, "<Q", 2**64 - 1), "key/value count"),
    "key length 2**64-1": (_key_length("general.name", 2**64 - 1), "run past the end"),
    "array length 2**62": (_array_length("tokenizer.ggml.tokens", 2**62),
                           "'tokenizer.ggml.tokens' array length: 4611686018427387904"),
    "version 7": (_header(4, "<I", 7), "version: 7 is not supported"),
    "magic": (_header(0, "<I", 0), "does not start with 'GGUF'"),
}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> bytes:
    print(f"tiny GGUF seed {SEED}")
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    TinyGguf(layers=1).write(path, np.random.default_rng(SEED))
    return path.read_bytes()


def _hostile_gguf(tiny: bytes, patch, folder: Path) -> Path:
    data = bytearray(tiny)
    patch(data)
    path = folder / "hostile.gguf"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("patch, message", HOSTILE_GGUFS.values(), ids=HOSTILE_GGUFS)
def test_hostile_gguf_is_one_line_naming_the_field(tiny_gguf, tmp_path, patch, message):
    path = _hostile_gguf(tiny_gguf, patch, tmp_path)
    with pytest.raises(ModelLoadError) as error:
        files = read_gguf(path)
        ArchConfig.from_hf(files.hf_config, path)
    text = str(error.value)
    assert message in text and "\n" not in text, text


def _hostile_folder(folder: Path, edits: dict) -> Path:
    save_tiny_model("llama", folder, seed=SEED)
    config_path = folder / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **edits}))
    return folder


def test_cli_refuses_hostile_models_with_exit_2_and_a_small_peak_rss(tiny_gguf, tmp_path):
    """``octavo generate`` (two at once: each is mostly its imports) on the GGUF whose
    tensor offset wraps past 2**64, and on a config whose every number is in range but whose
    declared weights (~2 TiB) cannot fit: exit 2, one line, peak RSS < 1 GiB."""
    print(f"tiny model seed {SEED}")
    cases = {
        "gguf offset near 2**64": _hostile_gguf(
            tiny_gguf, HOSTILE_GGUFS["offset near 2**64"][0], tmp_path),
        "hf declared 2 TiB": _hostile_folder(tmp_path / "big", {
            "vocab_size": 2**24, "hidden_size": 2**16, "intermediate_size": 2**16,
            "head_dim": 16}),
    }
    env = {**os.environ, "OCTAVO_CACHE_DIR": str(tmp_path / "cache")}
    runs = {}
    for name, model in cases.items():
        out, peak = tmp_path / f"{name}.txt", tmp_path / f"{name}.peak"
        with out.open("w") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-c", PEAK_RSS_LAUNCHER, str(peak), "generate", "hi",
                 "--model", str(model), "--max-tokens", "1"],
                stdout=sink, stderr=subprocess.STDOUT, env=env)
        runs[name] = (proc, out, peak)
    for name, (proc, out, peak) in runs.items():
        proc.wait()
        text = out.read_text()
        errors = [line for line in text.splitlines() if line.startswith("Error: ")]
        peak_kib = int(peak.read_text().split()[1])
        print(f"{name}: exit {proc.returncode}, peak RSS {peak_kib / 1024:.0f} MiB, {errors}")
        assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in text, text
        assert peak_kib < RSS_LIMIT_KIB, name
    assert "GiB in" in (tmp_path / "hf declared 2 TiB.txt").read_text()
