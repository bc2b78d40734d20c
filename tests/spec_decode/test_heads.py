"""Medusa and EAGLE heads: published checkpoint layouts round-trip and bad ones fail with
the file and tensor named; head shapes; and in the engine, greedy outputs with either head
are token-identical to outputs without speculation (tiny random models, mixed batches)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from octavo import LLM, SamplingParams
from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.cpu import kernels as cpu
from octavo.cpu.gemm import cpu_gemm_supported
from octavo.cpu.platform import CpuPlatform
from octavo_spec_decode.eagle import load_eagle, save_eagle
from octavo_spec_decode.heads_io import HeadCheckpointError
from octavo_spec_decode.medusa import MedusaConfig, MedusaHeads, load_medusa, save_medusa
from octavo_spec_decode.train.data import load_target
from octavo_spec_decode.train.dense_attention import DenseCausalBackend, full_sequence_metadata
from octavo_spec_decode.train.eagle_train import new_eagle_head
from tests.core.tiny_models import VOCAB_SIZE

HIDDEN = 64  # the tiny models' hidden size


def random_medusa(seed: int, num_heads: int = 3, num_layers: int = 1) -> MedusaHeads:
    torch.manual_seed(seed)
    heads = MedusaHeads(MedusaConfig(num_heads, num_layers, HIDDEN, VOCAB_SIZE))
    for param in heads.parameters():
        torch.nn.init.normal_(param, std=0.5)
    return heads


@pytest.fixture(scope="module")
def medusa_folder(tmp_path_factory: pytest.TempPathFactory, seed: int) -> Path:
    folder = tmp_path_factory.mktemp("medusa")
    save_medusa(random_medusa(seed), folder)
    return folder


@pytest.fixture(scope="module")
def eagle_folder(tmp_path_factory: pytest.TempPathFactory, target: Path, seed: int) -> Path:
    folder = tmp_path_factory.mktemp("eagle")
    torch.manual_seed(seed)
    model, hf_config = load_target(str(target))
    head = new_eagle_head(model)
    head.draft_token_ids = draft_vocabulary(seed)
    save_eagle(head, folder, hf_config)
    return folder


def draft_vocabulary(seed: int) -> torch.Tensor:
    """A random half of the vocabulary: the tokens EAGLE drafts may pick (``d2t``)."""
    return torch.randperm(VOCAB_SIZE, generator=torch.Generator().manual_seed(seed))[
        : VOCAB_SIZE // 2].sort().values


# -- checkpoint layouts -----------------------------------------------------------------

@pytest.mark.parametrize("weights_name", ["medusa_lm_head.safetensors", "medusa_lm_head.pt"])
def test_medusa_round_trip_in_published_layout(tmp_path: Path, seed: int,
                                               weights_name: str) -> None:
    heads = random_medusa(seed, num_heads=2, num_layers=2)
    save_medusa(heads, tmp_path, weights_name=weights_name)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["medusa_num_heads"] == 2 and config["medusa_num_layers"] == 2
    loaded = load_medusa(tmp_path, HIDDEN, VOCAB_SIZE)
    names = set(loaded.state_dict())
    assert {"0.0.linear.weight", "0.0.linear.bias", "1.1.linear.bias", "1.2.weight"} <= names
    for name, tensor in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), f"{name} (seed {seed})"
    x = torch.randn(5, HIDDEN)
    assert heads.features(x).shape == (2, 5, HIDDEN)
    assert loaded.draft_token_ids is None
    heads.draft_token_ids = draft_vocabulary(seed)  # as `octavo spec train` writes them
    save_medusa(heads, tmp_path, weights_name=weights_name)
    again = load_medusa(tmp_path, HIDDEN, VOCAB_SIZE)
    assert again.draft_token_ids is not None
    assert again.draft_token_ids.tolist() == draft_vocabulary(seed).tolist(), f"seed {seed}"


def test_medusa_layout_errors_name_file_and_tensor(medusa_folder: Path, tmp_path: Path) -> None:
    tensors = load_file(medusa_folder / "medusa_lm_head.safetensors")
    tensors["0.0.lin.weight"] = tensors.pop("0.0.linear.weight")
    save_file(tensors, tmp_path / "medusa_lm_head.safetensors")
    (tmp_path / "config.json").write_text((medusa_folder / "config.json").read_text())
    with pytest.raises(HeadCheckpointError, match=r"medusa_lm_head.safetensors: unexpected "
                                                  r"tensor '0.0.lin.weight'"):
        load_medusa(tmp_path, HIDDEN, VOCAB_SIZE)
    with pytest.raises(HeadCheckpointError, match=r"shape \(320, 64\), expected \(300, 64\)"):
        load_medusa(medusa_folder, HIDDEN, 300)
    tensors = load_file(medusa_folder / "medusa_lm_head.safetensors")
    tensors["d2t"] = torch.full((4,), VOCAB_SIZE)  # past the vocabulary
    save_file(tensors, tmp_path / "medusa_lm_head.safetensors")
    with pytest.raises(HeadCheckpointError, match=r"medusa_lm_head.safetensors: tensor 'd2t' "
                                                  r"maps draft tokens outside"):
        load_medusa(tmp_path, HIDDEN, VOCAB_SIZE)
    (tmp_path / "config.json").write_text('{"medusa_num_layers": 1}')
    with pytest.raises(HeadCheckpointError, match=r"config.json: 'medusa_num_heads' must be"):
        load_medusa(tmp_path, HIDDEN, VOCAB_SIZE)


def test_eagle_round_trip_in_published_layout(eagle_folder: Path, target: Path,
                                              tmp_path: Path, seed: int) -> None:
    model, _ = load_target(str(target))
    embed = model.model.embed_tokens
    tensors = load_file(eagle_folder / "model.safetensors")
    assert tensors["fc.weight"].shape == (HIDDEN, 2 * HIDDEN) and "fc.bias" in tensors
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert f"layers.0.self_attn.{name}.weight" in tensors
    assert "layers.0.mlp.gate_proj.weight" in tensors
    assert "layers.0.input_layernorm.weight" not in tensors  # EAGLE-1's first layer has none
    head = load_eagle(eagle_folder, TorchAttentionBackend, embed, HIDDEN)
    assert head.published_tensors().keys() == tensors.keys()
    for name, tensor in head.published_tensors().items():
        assert torch.equal(tensor, tensors[name]), name
    assert head.draft_token_ids is not None
    assert head.draft_token_ids.tolist() == draft_vocabulary(seed).tolist(), f"seed {seed}"
    # The .bin layout, with the optional embedding copy and without d2t, loads the same.
    del tensors["d2t"]
    torch.save({**tensors, "embed_tokens.weight": embed.weight.detach().clone()},
               tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((eagle_folder / "config.json").read_text())
    again = load_eagle(tmp_path, TorchAttentionBackend, embed, HIDDEN)
    assert again.draft_token_ids is None
    for name, tensor in again.published_tensors().items():
        assert torch.equal(tensor, tensors[name]), name


def test_eagle_layout_errors_name_file_and_tensor(eagle_folder: Path, target: Path,
                                                  tmp_path: Path) -> None:
    embed = load_target(str(target))[0].model.embed_tokens
    (tmp_path / "config.json").write_text((eagle_folder / "config.json").read_text())
    tensors = load_file(eagle_folder / "model.safetensors")
    missing = {k: v for k, v in tensors.items() if k != "layers.0.self_attn.k_proj.weight"}
    save_file(missing, tmp_path / "model.safetensors")
    with pytest.raises(HeadCheckpointError, match=r"model.safetensors: missing tensor "
                                                  r"'layers.0.self_attn.k_proj.weight'"):
        load_eagle(tmp_path, TorchAttentionBackend, embed, HIDDEN)
    save_file({**tensors, "fc.weight": torch.zeros(HIDDEN, 3 * HIDDEN)},
              tmp_path / "model.safetensors")
    with pytest.raises(HeadCheckpointError, match=r"tensor 'fc.weight': .*shape"):
        load_eagle(tmp_path, TorchAttentionBackend, embed, HIDDEN)
    save_file({"midlayer.hidden_norm.weight": torch.ones(HIDDEN)}, tmp_path / "model.safetensors")
    with pytest.raises(HeadCheckpointError, match="EAGLE-3"):
        load_eagle(tmp_path, TorchAttentionBackend, embed, HIDDEN)


# -- in the engine ----------------------------------------------------------------------

def greedy_outputs(target: Path, seed: int, spec: dict | None) -> tuple[list[list[int]], LLM]:
    rng = np.random.default_rng(seed)
    prompts = [{"prompt_token_ids": rng.integers(0, 256, int(n)).tolist()}
               for n in rng.integers(5, 60, 6)]
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                             logprobs=1 if i % 3 == 2 else None)  # these do not speculate
              for i in range(len(prompts))]
    llm = LLM(model=str(target), dtype="float32", max_num_batched_tokens=64,
              kv_cache_memory=8 * 2**20, speculative_config=spec)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], llm


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_heads_keep_greedy_outputs_identical(method: str, target: Path, medusa_folder: Path,
                                             eagle_folder: Path, seed: int) -> None:
    folder = medusa_folder if method == "medusa" else eagle_folder
    expected, _ = greedy_outputs(target, seed, None)
    spec = {"method": method, "model": str(folder), "num_speculative_tokens": 3}
    actual, llm = greedy_outputs(target, seed, spec)
    assert actual == expected, f"seed {seed}"
    stats = llm.llm_engine.core.scheduler.spec.snapshot()
    assert stats.num_drafts > 0 and stats.num_draft_tokens > 0, f"no drafts (seed {seed})"


def test_eagle_head_on_the_cpu_kernels_matches_the_portable_head(eagle_folder: Path,
                                                                 target: Path,
                                                                 seed: int) -> None:
    """In bf16 the proposer switches the head onto the CPU GEMMs and fused layers, as
    ``build_model`` does for the target; its predicted features stay the portable head's
    up to bf16 rounding."""
    if cpu.library() is None or not cpu_gemm_supported(torch.bfloat16, torch.device("cpu")):
        pytest.skip("no CPU kernels on this machine")
    model = load_target(str(target))[0]
    portable = load_eagle(eagle_folder, DenseCausalBackend, model.model.embed_tokens, HIDDEN)
    generator = torch.Generator().manual_seed(seed)
    for param in portable.parameters():  # weights large enough to move the features
        param.data.normal_(0.0, 0.15, generator=generator)
    portable = portable.to(torch.bfloat16).eval()
    fast = copy.deepcopy(portable)
    CpuPlatform.prepare_model(fast, torch.bfloat16)
    assert all(m.cpu_gemm is not None for m in fast.modules() if hasattr(m, "cpu_gemm"))
    lengths = [7, 12]
    features = torch.randn(sum(lengths), HIDDEN, generator=generator).to(torch.bfloat16)
    tokens = torch.randint(0, 256, (sum(lengths),), generator=generator)
    positions = torch.cat([torch.arange(n) for n in lengths])
    metadata = full_sequence_metadata(lengths, torch.device("cpu"))
    with torch.inference_mode():
        expected = portable(features, tokens, positions, [torch.empty(0)], metadata).float()
        actual = fast(features, tokens, positions, [torch.empty(0)], metadata).float()
    scale = expected.abs().max()
    assert (actual - expected).abs().max() <= 0.03 * scale, f"seed {seed}"
