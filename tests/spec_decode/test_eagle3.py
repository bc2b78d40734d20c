"""EAGLE-3 heads (``method: eagle3``): the target's aux hidden states against HF's, the head
against a dense reference built from the published tensors, the published layout and its
errors, and in the engine - with chunked prefill - greedy outputs token-identical to no
speculation while every draft is the one a dense re-run of the chain makes; then
``octavo spec train --method eagle3`` end to end. Tiny random models."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from octavo import LLM, SamplingParams
from octavo.attention.torch_backend import TorchAttentionBackend
from octavo_spec_decode.eagle import save_eagle
from octavo_spec_decode.eagle3 import (
    AUX_LAYERS_KEY,
    Eagle3Head,
    default_aux_layers,
    load_eagle3,
    save_eagle3,
)
from octavo_spec_decode.heads_io import HeadCheckpointError
from octavo_spec_decode.train.data import Sequence, add_features, load_data, load_target, save_data
from octavo_spec_decode.train.dense_attention import DenseCausalBackend, full_sequence_metadata
from octavo_spec_decode.train.eagle3_train import (
    STEP_WEIGHT,
    Eagle3Batch,
    new_eagle3_head,
    train_eagle3,
)
from octavo_spec_decode.train.eagle_train import new_eagle_head
from octavo_spec_decode.train.run import TrainOptions, training_data
from octavo_spec_decode.train.targets import TokenSubset
from octavo_spec_decode.train.ttt_attention import TrainingTimeTestBackend
from tests.core.tiny_models import VOCAB_SIZE, save_tiny_model, tiny_config
from tests.helpers import run_octavo

HIDDEN = 64  # the tiny models' hidden size
NUM_LAYERS = 8  # vLLM's default aux layers (2, 4, 5) are distinct from 7 layers on
AUX_LAYERS = default_aux_layers(NUM_LAYERS)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small tensors run far faster on one thread than on two that contend for a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target8(tmp_path_factory: pytest.TempPathFactory, seed: int) -> Path:
    folder = tmp_path_factory.mktemp("target8")
    save_tiny_model("llama", folder, seed=seed, num_hidden_layers=NUM_LAYERS)
    return folder


def random_head(target: Path, seed: int, std: float = 0.3) -> tuple[Eagle3Head, dict]:
    """A head with weights large enough that its drafts vary, over a random half of the
    vocabulary, and the target's HF config."""
    torch.manual_seed(seed)
    model, hf_config = load_target(str(target))
    draft_ids = torch.randperm(VOCAB_SIZE)[: VOCAB_SIZE // 2].sort().values
    head = new_eagle3_head(model, draft_ids, TorchAttentionBackend)
    with torch.no_grad():
        for name, param in head.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name != "lm_head.weight":
                param.normal_(0.0, std)
    return head, hf_config


@pytest.fixture(scope="module")
def eagle3_folder(tmp_path_factory: pytest.TempPathFactory, target8: Path, seed: int) -> Path:
    folder = tmp_path_factory.mktemp("eagle3")
    head, hf_config = random_head(target8, seed)
    save_eagle3(head, folder, hf_config, AUX_LAYERS)
    return folder


# -- the target's aux hidden states ------------------------------------------------------

def test_aux_hidden_states_are_hfs_hidden_states_entering_the_layers(tmp_path: Path,
                                                                     seed: int) -> None:
    hf = save_tiny_model("llama", tmp_path, seed=seed, num_hidden_layers=NUM_LAYERS)
    model, _ = load_target(str(tmp_path))
    ids = torch.randint(0, 256, (37,), generator=torch.Generator().manual_seed(seed))
    metadata = full_sequence_metadata([len(ids)], ids.device)
    with torch.inference_mode():
        model(ids, torch.arange(len(ids)), [torch.empty(0)] * NUM_LAYERS, metadata)
        assert model.model.aux_hidden_states == []  # off: nothing kept
        model.model.aux_hidden_state_layers = frozenset({5, 0, 3})
        model(ids, torch.arange(len(ids)), [torch.empty(0)] * NUM_LAYERS, metadata)
        reference = hf(ids[None], output_hidden_states=True).hidden_states
    kept = model.model.aux_hidden_states
    assert len(kept) == 3
    for layer, states in zip((0, 3, 5), kept):  # layer order; HF's [i] enters layer i
        torch.testing.assert_close(states, reference[layer][0], msg=f"layer {layer}, "
                                                                    f"seed {seed}")


# -- the head against a dense reference ------------------------------------------------------

def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def reference_midlayer(t: dict[str, torch.Tensor], embeds: torch.Tensor,
                       hidden: torch.Tensor, norm_before_residual: bool) -> torch.Tensor:
    """EAGLE-3's midlayer over one sequence, causal, from the published tensors and HF's
    rotary embedding (vLLM's Eagle3 LlamaDecoderLayer, written out)."""
    config = tiny_config("llama", num_hidden_layers=NUM_LAYERS)
    eps, n = config.rms_norm_eps, len(hidden)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = HIDDEN // heads
    normed = rms(hidden, t["midlayer.hidden_norm.weight"], eps)
    residual = normed if norm_before_residual else hidden
    x = torch.cat([rms(embeds, t["midlayer.input_layernorm.weight"], eps), normed], dim=-1)

    def project(name: str, count: int) -> torch.Tensor:
        weight = t[f"midlayer.self_attn.{name}_proj.weight"]
        return (x @ weight.T).view(n, count, head_dim).transpose(0, 1)[None]

    q, k, v = project("q", heads), project("k", kv_heads), project("v", kv_heads)
    cos, sin = LlamaRotaryEmbedding(config)(v, torch.arange(n)[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = (z.repeat_interleave(heads // kv_heads, dim=1) for z in (k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    attn = (torch.softmax(scores, dim=-1) @ v)[0].transpose(0, 1).reshape(n, heads * head_dim)
    x = attn @ t["midlayer.self_attn.o_proj.weight"].T + residual
    h = rms(x, t["midlayer.post_attention_layernorm.weight"], eps)
    gate, up = (h @ t[f"midlayer.mlp.{name}_proj.weight"].T for name in ("gate", "up"))
    return (F.silu(gate) * up) @ t["midlayer.mlp.down_proj.weight"].T + x


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_head_matches_a_dense_reference(eagle3_folder: Path, target8: Path, tmp_path: Path,
                                        seed: int, norm_before_residual: bool) -> None:
    config = json.loads((eagle3_folder / "config.json").read_text())
    config["norm_before_residual"] = norm_before_residual
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = load_file(eagle3_folder / "model.safetensors")
    save_file(tensors, tmp_path / "model.safetensors")
    model, _ = load_target(str(target8))
    embed = model.model.embed_tokens
    head, aux_layers = load_eagle3(tmp_path, DenseCausalBackend, embed, model.config)
    assert aux_layers == AUX_LAYERS
    generator = torch.Generator().manual_seed(seed)
    n = 23
    aux = [torch.randn(n, HIDDEN, generator=generator) for _ in range(3)]
    tokens = torch.randint(0, 256, (n,), generator=generator)
    with torch.inference_mode():
        hidden = head.combine(aux)
        actual = head(hidden, tokens, torch.arange(n), [torch.empty(0)],
                      full_sequence_metadata([n], hidden.device))
        logits = head.logits(actual)
        fused = torch.cat(aux, dim=-1) @ tensors["fc.weight"].T
        expected = reference_midlayer(tensors, embed(tokens), fused, norm_before_residual)
    torch.testing.assert_close(hidden, fused, msg=f"seed {seed}")
    torch.testing.assert_close(actual, expected, msg=f"seed {seed}")
    eps = model.config.rms_norm_eps
    torch.testing.assert_close(logits, rms(expected, tensors["norm.weight"], eps)
                               @ tensors["lm_head.weight"].T, msg=f"seed {seed}")


# -- the published layout -----------------------------------------------------------------

def test_published_layout_round_trips(eagle3_folder: Path, target8: Path, tmp_path: Path,
                                      seed: int) -> None:
    model, _ = load_target(str(target8))
    tensors = load_file(eagle3_folder / "model.safetensors")
    assert tensors["fc.weight"].shape == (HIDDEN, 3 * HIDDEN) and "fc.bias" not in tensors
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (HIDDEN, 2 * HIDDEN)
    assert tensors["lm_head.weight"].shape == (VOCAB_SIZE // 2, HIDDEN)
    assert tensors["t2d"].dtype == torch.bool and int(tensors["t2d"].sum()) == VOCAB_SIZE // 2
    config = json.loads((eagle3_folder / "config.json").read_text())
    assert config["draft_vocab_size"] == VOCAB_SIZE // 2
    assert config[AUX_LAYERS_KEY] == list(AUX_LAYERS) and config["num_hidden_layers"] == 1
    embed = model.model.embed_tokens
    head, _ = load_eagle3(eagle3_folder, TorchAttentionBackend, embed, model.config)
    for name, tensor in head.published_tensors().items():
        assert torch.equal(tensor, tensors[name]), f"{name} (seed {seed})"
    assert torch.equal(head.draft_token_ids, torch.arange(VOCAB_SIZE // 2) + tensors["d2t"])
    # pytorch_model.bin, with the optional embedding copy and without t2d, loads the same.
    del tensors["t2d"]
    torch.save({**tensors, "embed_tokens.weight": embed.weight.detach().clone()},
               tmp_path / "pytorch_model.bin")
    del config[AUX_LAYERS_KEY]  # vLLM's default layers for 8 layers are the same
    (tmp_path / "config.json").write_text(json.dumps(config))
    again, aux_layers = load_eagle3(tmp_path, TorchAttentionBackend, embed, model.config)
    assert aux_layers == AUX_LAYERS
    for name, tensor in tensors.items():
        assert torch.equal(again.published_tensors()[name], tensor), name


def write_variant(source: Path, folder: Path, tensors: dict[str, torch.Tensor] | None = None,
                  **config: object) -> Path:
    folder.mkdir(exist_ok=True)
    hf_config = {**json.loads((source / "config.json").read_text()), **config}
    (folder / "config.json").write_text(json.dumps(hf_config))
    save_file(tensors if tensors is not None else load_file(source / "model.safetensors"),
              folder / "model.safetensors")
    return folder


def test_malformed_heads_get_clear_errors(eagle3_folder: Path, target8: Path,
                                          tmp_path: Path, seed: int) -> None:
    model, hf_config = load_target(str(target8))
    embed, config = model.model.embed_tokens, model.config
    tensors = load_file(eagle3_folder / "model.safetensors")

    def fails(folder: Path, match: str) -> None:
        with pytest.raises(HeadCheckpointError, match=match):
            load_eagle3(folder, TorchAttentionBackend, embed, config)

    narrow = write_variant(eagle3_folder, tmp_path / "narrow",
                           {**tensors, "fc.weight": torch.randn(HIDDEN, 2 * HIDDEN)})
    fails(narrow, r"model.safetensors: tensor 'fc.weight' has shape \(64, 128\), "
                  r"expected \(64, 192\)")
    no_d2t = write_variant(eagle3_folder, tmp_path / "no_d2t",
                           {k: v for k, v in tensors.items() if k != "d2t"})
    fails(no_d2t, r"model.safetensors: missing tensor 'd2t'")
    t2d = tensors["t2d"].clone()
    t2d[int(torch.nonzero(~t2d)[0])] = True
    fails(write_variant(eagle3_folder, tmp_path / "t2d", {**tensors, "t2d": t2d}),
          r"tensor 't2d' does not mark the draft vocabulary")
    fails(write_variant(eagle3_folder, tmp_path / "layers", **{AUX_LAYERS_KEY: [1, 1, 2]}),
          r"config.json: eagle_aux_hidden_state_layer_ids \[1, 1, 2\]: EAGLE-3 needs 3 "
          r"distinct layer indices of the target, each in 0..7")
    fails(write_variant(eagle3_folder, tmp_path / "vocab", draft_vocab_size=VOCAB_SIZE),
          r"tensor 'lm_head.weight' has shape \(160, 64\), expected \(320, 64\)")
    eagle1 = tmp_path / "eagle1"
    save_eagle(new_eagle_head(model), eagle1, hf_config)
    fails(eagle1, r"no 'midlayer.\*' tensors: not an EAGLE-3 head")
    # The same error reaches the user building an engine.
    with pytest.raises(HeadCheckpointError, match=r"missing tensor 'd2t'"):
        LLM(model=str(target8), dtype="float32", kv_cache_memory=8 * 2**20,
            speculative_config={"method": "eagle3", "model": str(no_d2t),
                                "num_speculative_tokens": 2})


# -- in the engine ---------------------------------------------------------------------

def prompts_and_params(seed: int) -> tuple[list[dict], list[SamplingParams]]:
    rng = np.random.default_rng(seed)
    prompts = [{"prompt_token_ids": rng.integers(0, 256, int(n)).tolist()}
               for n in rng.integers(5, 70, 6)]
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True,
                             logprobs=1 if i % 3 == 2 else None)  # these do not speculate
              for i in range(len(prompts))]
    return prompts, params


def engine(target: Path, spec: dict | None) -> LLM:
    # A 32-token budget: the longer prompts prefill in chunks, mixed with decodes.
    return LLM(model=str(target), dtype="float32", max_num_batched_tokens=32,
               kv_cache_memory=8 * 2**20, speculative_config=spec)


@pytest.fixture(scope="module")
def plain_outputs(target8: Path, seed: int) -> list[list[int]]:
    outputs = engine(target8, None).generate(*prompts_and_params(seed), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def reference_drafts(head: Eagle3Head, model, tokens: list[int], k: int,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """For every entry ``p`` of a sequence (the proposer's last verified position, ``x_{p+1}``
    its newest token): the k drafts of a dense re-run of the chain - the target's aux states
    from a full forward, the head unrolled with the training-time-test attention, which lets
    step j at p see the real context 0..p and the chain's own entries - and each draft's
    margin over the runner-up logit."""
    ids = torch.tensor(tokens)
    n = len(ids) - 1
    with torch.inference_mode():
        model.model.aux_hidden_state_layers = frozenset(AUX_LAYERS)
        model(ids, torch.arange(len(ids)), [torch.empty(0)] * NUM_LAYERS,
              full_sequence_metadata([len(ids)], ids.device))
        aux = [a[:n] for a in model.model.aux_hidden_states]
        metadata = full_sequence_metadata([n], ids.device)
        hidden, step_tokens = head.combine(aux), ids[1:]
        drafts, margins = [], []
        for j in range(k):
            hidden = head(hidden, step_tokens, torch.arange(n) + j, [torch.empty(0)], metadata)
            top = head.logits(hidden).topk(2, dim=-1)
            step_tokens = head.draft_token_ids[top.indices[:, 0]]
            drafts.append(step_tokens)
            margins.append(top.values[:, 0] - top.values[:, 1])
        head.midlayer.self_attn.attn.reset()
    return torch.stack(drafts, dim=1), torch.stack(margins, dim=1)


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_outputs_identical_and_drafts_are_the_heads(
        k: int, target8: Path, eagle3_folder: Path, plain_outputs: list[list[int]],
        seed: int) -> None:
    llm = engine(target8, {"method": "eagle3", "model": str(eagle3_folder),
                           "num_speculative_tokens": k})
    proposer = llm.llm_engine.core.executor.worker.runner.spec.proposer
    assert proposer.aux_hidden_state_layers == AUX_LAYERS
    records: list[tuple[str, int, list[int]]] = []
    propose = proposer.propose

    def recording(inputs):
        drafts = propose(inputs)
        records.extend((r, int(n), d) for r, n, d in zip(inputs.req_ids, inputs.num_tokens, drafts)
                       if d)
        return drafts

    proposer.propose = recording
    outputs = llm.generate(*prompts_and_params(seed), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == plain_outputs, f"seed {seed}"
    stats = llm.llm_engine.core.scheduler.spec.snapshot()
    assert stats.num_drafts > 0 and stats.num_draft_tokens > 0, f"no drafts (seed {seed})"

    model, _ = load_target(str(target8))
    head, _ = load_eagle3(eagle3_folder, TrainingTimeTestBackend, model.model.embed_tokens,
                          model.config)
    sequences = {o.request_id: list(o.prompt_token_ids) + list(o.outputs[0].token_ids)
                 for o in outputs}
    references = {r: reference_drafts(head, model, tokens, k) for r, tokens in sequences.items()}
    assert records and {r for r, _, _ in records} <= references.keys()
    checked = 0
    for req_id, num_tokens, drafts in records:
        expected, margins = references[req_id]
        for j, draft in enumerate(drafts):
            if draft != int(expected[num_tokens - 2, j]):
                # Only a near-tie may differ (paged and dense attention round differently).
                assert margins[num_tokens - 2, j] < 1e-3, \
                    f"{req_id} at {num_tokens} tokens, draft {j} (seed {seed})"
                break
            checked += 1
    assert checked >= 0.9 * len(records), f"{checked} drafts checked (seed {seed})"


# -- training ----------------------------------------------------------------------------

def random_sequences(seed: int, count: int = 6) -> list[Sequence]:
    generator = torch.Generator().manual_seed(seed)
    return [Sequence(torch.randint(0, 256, (int(n),), generator=generator), 5)
            for n in torch.randint(20, 40, (count,), generator=generator)]


def test_a_data_file_without_aux_features_gets_them(target8: Path, tmp_path: Path,
                                                    seed: int) -> None:
    model, _ = load_target(str(target8))
    sequences = random_sequences(seed)
    add_features(model, sequences)  # as EAGLE-1 or Medusa training writes the file
    assert all(s.aux_features is None for s in sequences)
    path = tmp_path / "data.pt"
    save_data(path, str(target8), sequences)
    options = TrainOptions(method="eagle3", model=str(target8), out=str(tmp_path / "out"),
                           data=str(path))
    filled = training_data(options, model, AUX_LAYERS)
    assert load_data(path, str(target8), AUX_LAYERS)[0].aux_features is not None
    assert load_data(path, str(target8))[0].aux_features is None  # EAGLE-1 reads none
    for seq, original in zip(filled, sequences):
        assert torch.equal(seq.token_ids, original.token_ids)
        assert torch.equal(seq.features, original.features)
        assert seq.aux_features is not None
        assert seq.aux_features.shape == (len(seq.token_ids), 3 * HIDDEN)


def test_training_moves_the_heads_distributions_to_the_targets(target8: Path,
                                                                 seed: int) -> None:
    """The loss's excess over its floor - the step-weighted entropy of the target's own
    distributions, which a perfect head reaches - is the KL divergence the training lowers,
    at every unrolled step."""
    model, _ = load_target(str(target8))
    sequences = random_sequences(seed, count=8)
    add_features(model, sequences, aux_layers=AUX_LAYERS)
    batch = Eagle3Batch(sequences, num_steps=3)
    untrained = new_eagle3_head(model, TokenSubset.of(sequences, VOCAB_SIZE).token_ids)
    trained = train_eagle3(model, sequences, steps=30, seed=seed, lr=3e-3)
    lm_head = trained.lm_head.weight
    with torch.no_grad():
        floor = sum(STEP_WEIGHT ** j * torch.special.entr(torch.softmax(
            batch.features[rows] @ lm_head.T, dim=-1)).sum(-1).mean()
            for j, rows in enumerate(batch.rows)).item()
        before = batch.loss(untrained, lm_head).item() - floor
        after = batch.loss(trained, lm_head).item() - floor
    assert 0 <= after < 0.5 * before, f"KL {before:.4f} -> {after:.4f} (seed {seed})"


def test_spec_train_cli_writes_an_eagle3_head_that_runs(
        target8: Path, tmp_path: Path, plain_outputs: list[list[int]], seed: int) -> None:
    result = run_octavo("spec", "train", "--method", "eagle3", "--model", str(target8),
                        "--out", str(tmp_path), "--steps", "3", "--prompts", "4",
                        "--self-written", "0", "--max-tokens", "12", "--seed", "3",
                        "--no-eval", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "eagle3 heads written to" in result.stdout, result.stdout
    config = json.loads((tmp_path / "config.json").read_text())
    assert config[AUX_LAYERS_KEY] == list(AUX_LAYERS)
    tensors = load_file(tmp_path / "model.safetensors")
    assert len(tensors["d2t"]) == config["draft_vocab_size"] < VOCAB_SIZE  # the text's tokens
    llm = engine(target8, {"method": "eagle3", "model": str(tmp_path),
                           "num_speculative_tokens": 3})
    outputs = llm.generate(*prompts_and_params(seed), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == plain_outputs, f"seed {seed}"
    assert llm.llm_engine.core.scheduler.spec.snapshot().num_drafts > 0
