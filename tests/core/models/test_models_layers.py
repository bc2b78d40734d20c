"""Layer pieces the model-parity tests cannot reach: RoPE frequencies of every scaling type
against HF's own functions, and the tensor-parallel sharding of the weight loaders (each
rank's slice, checked with tp_size=2 without any process group)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from octavo.models.config import ArchConfig
from octavo.models.layers.embedding import VocabParallelEmbedding
from octavo.models.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.models.layers.moe import FusedMoE
from octavo.models.layers.rotary import rope_attention_factor, rope_inv_freq, rotary_embedding
from octavo.models.layers.weights import WeightShapeError
from octavo.testing.seeds import draw_seed

TP = 2


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(draw_seed())


@pytest.mark.parametrize("rope_scaling", [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 256},
])
def test_rope_inv_freq_matches_hf(rope_scaling):
    hf = LlamaConfig(hidden_size=256, num_attention_heads=2, rope_theta=500000.0,
                     rope_scaling=rope_scaling)
    ours = rope_inv_freq(128, ArchConfig.from_hf(hf.to_dict()).rope)
    rope_type = hf.rope_parameters["rope_type"]
    if rope_type == "default":
        expected = 1.0 / (500000.0 ** (torch.arange(0, 128, 2).float() / 128))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[rope_type](hf)
    assert torch.equal(ours, expected)


LONGROPE = {"rope_type": "longrope", "short_factor": [1.0 + i / 64 for i in range(64)],
            "long_factor": [2.0 + i / 8 for i in range(64)],
            "original_max_position_embeddings": 1024}


@pytest.mark.parametrize(("rope_scaling", "seq_len"), [
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, None),
    ({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 100,
      "beta_fast": 16, "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 0.707}, None),
    ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
      "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False}, None),
    (LONGROPE, None),
    (LONGROPE, 1025),
    ({**LONGROPE, "attention_factor": 1.25}, 1025),
    ({"rope_type": "dynamic", "factor": 2.0}, None),
    ({"rope_type": "dynamic", "factor": 2.0}, 6000),
])
def test_scaled_rope_matches_hf(rope_scaling, seq_len):
    """yarn, longrope (short and long factors) and dynamic NTK (within and past the
    context): the frequencies HF's functions give at that sequence length, and the factor
    cos/sin are multiplied by."""
    hf = LlamaConfig(hidden_size=256, num_attention_heads=2, rope_theta=500000.0,
                     max_position_embeddings=4096, rope_scaling=rope_scaling)
    rope = ArchConfig.from_hf(hf.to_dict()).rope
    expected, attention_factor = ROPE_INIT_FUNCTIONS[rope_scaling["rope_type"]](
        hf, seq_len=None if seq_len is None else torch.tensor(seq_len))
    assert torch.equal(rope_inv_freq(128, rope, seq_len), expected)
    assert rope_attention_factor(rope) == attention_factor


def test_length_dependent_rope_uses_each_tokens_length():
    """One step mixing tokens of a short and a long sequence: each rotated as HF rotates a
    sequence of its length (the long one with longrope's long factors)."""
    hf = LlamaConfig(hidden_size=256, num_attention_heads=2, max_position_embeddings=4096,
                     rope_scaling=LONGROPE)
    rope = ArchConfig.from_hf(hf.to_dict()).rope
    rotary = rotary_embedding(128, rope)
    positions, lengths = torch.tensor([3, 700, 1500]), torch.tensor([10, 1024, 1600])
    q = torch.randn(3, 2, 128)
    got, _ = rotary(positions, q, q[:, :1], lengths)
    for i in range(3):
        inv_freq, factor = ROPE_INIT_FUNCTIONS["longrope"](hf, seq_len=int(lengths[i]))
        angles = torch.cat([positions[i] * inv_freq] * 2)
        half = torch.cat([-q[i, :, 64:], q[i, :, :64]], dim=-1)
        expected = q[i] * angles.cos() * factor + half * angles.sin() * factor
        assert torch.allclose(got[i], expected, atol=1e-5), i
    with pytest.raises(ValueError, match="needs each token's sequence length"):
        rotary(positions.clone(), q, q[:, :1])


def test_partial_rotary_rotates_the_leading_dims():
    """partial_rotary_factor 0.5: the first half of each head rotated by its own
    frequencies, the second half passed through."""
    rope = ArchConfig.from_hf({**SMALL, "partial_rotary_factor": 0.5}).rope
    rotary = rotary_embedding(16, rope)
    full = rotary_embedding(8, ArchConfig.from_hf(SMALL).rope)
    positions, q = torch.tensor([0, 5, 9]), torch.randn(3, 2, 16)
    got, _ = rotary(positions, q, q)
    expected, _ = full(positions, q[..., :8].contiguous(), q[..., :8].contiguous())
    assert torch.equal(got[..., 8:], q[..., 8:])
    assert torch.allclose(got[..., :8], expected)


SMALL = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
         "vocab_size": 8, "intermediate_size": 8, "rope_theta": 1234.0}


def test_old_style_rope_config_is_read():
    hf = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
          "vocab_size": 8, "intermediate_size": 8, "rope_theta": 1234.0,
          "rope_scaling": {"type": "linear", "factor": 2.0}}
    rope = ArchConfig.from_hf(hf).rope
    assert (rope.theta, rope.rope_type, rope.factor) == (1234.0, "linear", 2.0)


def test_qkv_shards_split_heads(gen):
    hidden, head_dim, heads, kv_heads = 32, 8, 4, 2
    full = {name: (torch.randn(size * head_dim, hidden, generator=gen),
                   torch.randn(size * head_dim, generator=gen))
            for name, size in (("q", heads), ("k", kv_heads), ("v", kv_heads))}
    x = torch.randn(5, hidden, generator=gen)
    for rank in range(TP):
        layer = QKVParallelLinear(hidden, head_dim, heads, kv_heads, bias=True, tp_rank=rank,
                                  tp_size=TP)
        for shard, (weight, bias) in full.items():
            layer.weight.weight_loader(layer.weight, weight, shard)
            layer.bias.weight_loader(layer.bias, bias, shard)
        q, k, v = layer(x).split([heads // TP * head_dim, kv_heads // TP * head_dim,
                                  kv_heads // TP * head_dim], dim=-1)
        for shard, out in zip("qkv", (q, k, v)):
            expected = F.linear(x, *full[shard]).chunk(TP, dim=-1)[rank]
            assert torch.allclose(out, expected, atol=1e-5), (rank, shard)


def test_fused_checkpoint_tensors_load_whole(gen):
    """Phi-3's checkpoints hold q/k/v and gate/up fused (shard id None): each rank takes
    its slice of every projection, as from the separate tensors."""
    q, k, v = (torch.randn(n * 8, 32, generator=gen) for n in (4, 2, 2))
    for rank in range(TP):
        fused = QKVParallelLinear(32, 8, 4, 2, tp_rank=rank, tp_size=TP)
        fused.weight.weight_loader(fused.weight, torch.cat([q, k, v]), None)
        parts = QKVParallelLinear(32, 8, 4, 2, tp_rank=rank, tp_size=TP)
        for shard, tensor in zip("qkv", (q, k, v)):
            parts.weight.weight_loader(parts.weight, tensor, shard)
        assert torch.equal(fused.weight, parts.weight)
        with pytest.raises(WeightShapeError):
            fused.weight.weight_loader(fused.weight, torch.cat([q, k]), None)


def test_merged_column_shards_each_projection(gen):
    gate, up = torch.randn(12, 6, generator=gen), torch.randn(12, 6, generator=gen)
    for rank in range(TP):
        layer = MergedColumnParallelLinear(6, [12, 12], tp_rank=rank, tp_size=TP)
        layer.weight.weight_loader(layer.weight, gate, 0)
        layer.weight.weight_loader(layer.weight, up, 1)
        expected = torch.cat([gate.chunk(TP)[rank], up.chunk(TP)[rank]])
        assert torch.equal(layer.weight, expected)


def test_row_parallel_partials_sum_to_full_output(gen):
    weight, bias = torch.randn(7, 10, generator=gen), torch.randn(7, generator=gen)
    x = torch.randn(3, 10, generator=gen)
    partials = []
    for rank in range(TP):
        layer = RowParallelLinear(10, 7, bias=True, tp_rank=rank, tp_size=TP)
        layer.weight.weight_loader(layer.weight, weight)
        layer.bias.weight_loader(layer.bias, bias)
        assert torch.equal(layer.bias, bias)  # whole on every rank, added after the reduce
        partials.append(F.linear(x.chunk(TP, dim=-1)[rank], layer.weight))
    assert torch.allclose(sum(partials) + bias, F.linear(x, weight, bias), atol=1e-5)


def test_vocab_embedding_rows_per_rank(gen):
    table = torch.randn(10, 4, generator=gen)
    for rank in range(TP):
        layer = VocabParallelEmbedding(10, 4, tp_rank=rank, tp_size=TP)
        layer.weight.weight_loader(layer.weight, table)
        assert torch.equal(layer.weight, table[rank * 5:(rank + 1) * 5])


def test_fused_moe_shards_experts_intermediate(gen):
    experts, hidden, inter = 3, 4, 6
    w1, w3 = torch.randn(inter, hidden, generator=gen), torch.randn(inter, hidden, generator=gen)
    w2 = torch.randn(hidden, inter, generator=gen)
    for rank in range(TP):
        moe = FusedMoE(experts, hidden, inter, tp_rank=rank, tp_size=TP)
        for part, tensor in (("w1", w1), ("w3", w3)):
            moe.w13_weight.weight_loader(moe.w13_weight, tensor, (2, part))
        moe.w2_weight.weight_loader(moe.w2_weight, w2, (2, "w2"))
        assert torch.equal(moe.w13_weight[2], torch.cat([w1.chunk(TP)[rank],
                                                         w3.chunk(TP)[rank]]))
        assert torch.equal(moe.w2_weight[2], w2.chunk(TP, dim=1)[rank])


def test_loaders_reject_wrong_shapes_and_shards():
    layer = QKVParallelLinear(32, 8, 4, 2)
    with pytest.raises(WeightShapeError, match=r"expects \(16, 32\).* has \(8, 32\)"):
        layer.weight.weight_loader(layer.weight, torch.randn(8, 32), "k")
    with pytest.raises(ValueError, match="shard id 'o'"):
        layer.weight.weight_loader(layer.weight, torch.randn(16, 32), "o")
    moe = FusedMoE(2, 4, 6)
    with pytest.raises(ValueError, match="expert 2 does not exist"):
        moe.w2_weight.weight_loader(moe.w2_weight, torch.randn(4, 6), (2, "w2"))


def test_layers_that_cannot_split_evenly_say_why():
    with pytest.raises(ValueError, match=r"key/value heads \(3\) .* tensor-parallel size \(2\)"):
        QKVParallelLinear(64, 16, 4, 3, tp_size=2)
