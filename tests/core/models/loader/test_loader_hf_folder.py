"""HF folder loading: a tiny random Llama saved by transformers round-trips exactly, single-file
and sharded; its tokenizer is tokenizer.json's; each bad folder names the bad file."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from octavo.models.loader import ModelLoadError, load_model_files
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import CHAT_TEMPLATE, make_tiny_model, tiny_tokenizer

TEXTS = ["Hello, world!", "naïve café 日本語 😀", "def f(x):\n    return x * 2\n", "  spaced  "]


def save(folder: Path, dtype: torch.dtype, max_shard_size: str | None = None):
    seed = draw_seed()
    model = make_tiny_model("llama", seed).to(dtype)
    if max_shard_size is None:
        model.save_pretrained(folder)
    else:
        model.save_pretrained(folder, max_shard_size=max_shard_size)
    tiny_tokenizer().save_pretrained(folder)
    return model, seed


@pytest.mark.parametrize(
    ("dtype", "max_shard_size"), [(torch.float32, None), (torch.bfloat16, "40KB")],
    ids=["single-fp32", "sharded-bf16"],
)
def test_weights_round_trip_exactly(
    tmp_path: Path, dtype: torch.dtype, max_shard_size: str | None
) -> None:
    model, seed = save(tmp_path, dtype, max_shard_size)
    files = load_model_files(tmp_path)

    assert files.source == tmp_path
    assert files.hf_config == json.loads((tmp_path / "config.json").read_text())
    expected = model.state_dict()
    ours = dict(files.iter_weights())
    assert set(ours) == set(expected), f"seed={seed}"
    for name, tensor in ours.items():
        assert tensor.dtype == dtype, f"seed={seed}: {name}"
        assert torch.equal(tensor, expected[name]), f"seed={seed}: {name}"

    if max_shard_size is None:
        assert {files.weight_file_of(n) for n in ours} == {tmp_path / "model.safetensors"}
    else:
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1, "the model should span shards"
        for name in ours:
            assert files.weight_file_of(name) == tmp_path / index["weight_map"][name]


def test_tokenizer_is_tokenizer_json_with_chat_template(tmp_path: Path) -> None:
    save(tmp_path, torch.float32)
    tokenizer = load_model_files(tmp_path).tokenizer
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tokenizer.is_fast
    assert tokenizer.chat_template == CHAT_TEMPLATE
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == raw.encode(text, add_special_tokens=False).ids, text
        assert tokenizer.decode(ids) == text


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("good")
    save(folder, torch.float32)
    return folder


@pytest.fixture(scope="module")
def sharded_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sharded")
    save(folder, torch.float32, max_shard_size="40KB")
    return folder


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _first_shard(folder: Path) -> Path:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return folder / sorted(set(index["weight_map"].values()))[0]


# case -> (start from the sharded folder?, how to break it, text the error must contain)
BREAKS: dict[str, tuple[bool, Callable[[Path], object], str]] = {
    "no-config": (False, lambda f: (f / "config.json").unlink(), "config.json"),
    "config-not-json": (
        False, lambda f: (f / "config.json").write_text("{ not json"), "config.json: not valid JSON"
    ),
    "config-not-object": (False, lambda f: (f / "config.json").write_text("[1, 2]"), "config.json"),
    "no-safetensors": (False, lambda f: (f / "model.safetensors").unlink(), "model.safetensors"),
    "truncated-safetensors": (
        False, lambda f: _truncate(f / "model.safetensors"), "model.safetensors"
    ),
    "no-tokenizer": (False, lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json"),
    "missing-shard": (True, lambda f: _first_shard(f).unlink(), "model-00001-of-"),
    "truncated-shard": (True, lambda f: _truncate(_first_shard(f)), "model-00001-of-"),
    "index-not-json": (
        True,
        lambda f: (f / "model.safetensors.index.json").write_text("nope"),
        "model.safetensors.index.json",
    ),
}


@pytest.mark.parametrize("case", BREAKS, ids=str)
def test_bad_folder_gives_error_naming_the_file(
    tmp_path: Path, good_folder: Path, sharded_folder: Path, case: str
) -> None:
    sharded, break_it, expected = BREAKS[case]
    folder = tmp_path / "model"
    shutil.copytree(sharded_folder if sharded else good_folder, folder)
    break_it(folder)
    with pytest.raises(ModelLoadError, match=expected.replace(".", r"\.")):
        load_model_files(folder)


def test_missing_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no-such-model: no such file or folder"):
        load_model_files(tmp_path / "no-such-model")


def test_file_that_is_not_a_model_is_named(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match=r"weights\.bin: not a model"):
        load_model_files(path)
