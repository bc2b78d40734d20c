"""Sharding of the MoE layer over a tensor group, and its expert kernels, in one process.

Each simulated rank of tp=2 and tp=4 is built under its own ``ParallelState`` whose
communicator hands the partial output back unchanged; the test sums the ranks' partials
(the all-reduce, by hand) and compares them with the unsharded layer and with a dense
per-token reference written here. Both ways of sharding are covered: whole experts per
rank (expert parallelism) and every expert's intermediate dim sliced (tensor parallelism).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.distributed.state import ParallelState, RankInfo, parallel_state
from octavo.models.build import build_model
from octavo.models.layers.activation import SiluAndMul
from octavo.models.layers.moe import (
    FusedMoE,
    expert_kernel,
    grouped_experts,
    grouped_mm_fits,
    loop_experts,
    route_to_experts,
    select_experts,
)
from octavo.models.loader import ModelLoadError, load_model_files
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model

pytestmark = pytest.mark.usefixtures("single_thread")

NUM_EXPERTS, HIDDEN, INTERMEDIATE = 8, 32, 48  # 48 / 4 ranks: 12 fp32 (48 bytes), aligned
HFWeights = dict[tuple[int, str], torch.Tensor]


class PassThroughCommunicator:
    """A tensor group of one simulated rank: the partial comes back as it is (the test sums
    the ranks' partials itself); counts the all-reduces so the test sees the layer ask."""

    def __init__(self) -> None:
        self.all_reduces = 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.all_reduces += 1
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        raise AssertionError("the MoE layer gathers nothing")


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(draw_seed())


def hf_expert_weights(gen: torch.Generator, num_experts: int = NUM_EXPERTS,
                      hidden: int = HIDDEN, intermediate: int = INTERMEDIATE) -> HFWeights:
    """Random ``experts.{e}.w1/w3 [I, H]`` and ``w2 [H, I]``, scaled to O(1) outputs."""
    shapes = {"w1": (intermediate, hidden), "w3": (intermediate, hidden),
              "w2": (hidden, intermediate)}
    return {(expert, which): torch.randn(shape, generator=gen) * shape[1] ** -0.5
            for expert in range(num_experts) for which, shape in shapes.items()}


def load(moe: FusedMoE, weights: HFWeights) -> FusedMoE:
    """Feed every HF expert tensor to the layer's loader, as the model's load_weights does."""
    for (expert, which), tensor in weights.items():
        param = moe.w2_weight if which == "w2" else moe.w13_weight
        param.weight_loader(param, tensor, (expert, which))
    return moe


def dense_reference(x: torch.Tensor, weights: HFWeights, routing: torch.Tensor,
                    expert_ids: torch.Tensor) -> torch.Tensor:
    """Token by token, slot by slot: the routed experts' SiLU-gated MLPs, weighted."""
    output = torch.zeros(x.shape, dtype=torch.float64)
    x = x.double()
    for token, slot in torch.cartesian_prod(torch.arange(x.shape[0]),
                                            torch.arange(expert_ids.shape[1])).tolist():
        expert = expert_ids[token, slot].item()
        w1, w3, w2 = (weights[expert, which].double() for which in ("w1", "w3", "w2"))
        hidden = F.silu(x[token] @ w1.T) * (x[token] @ w3.T)
        output[token] += routing[token, slot].double() * (hidden @ w2.T)
    return output


def random_routing(gen: torch.Generator, num_tokens: int, top_k: int,
                   allowed: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing of random router logits; only the ``allowed`` experts get tokens if given."""
    logits = torch.randn(num_tokens, NUM_EXPERTS, generator=gen)
    if allowed is not None:
        blocked = [e for e in range(NUM_EXPERTS) if e not in allowed]
        logits[:, blocked] = float("-inf")
    return select_experts(logits, top_k)


def simulated_rank(rank: int, tp_size: int, expert_parallel: bool) -> ParallelState:
    return ParallelState(info=RankInfo(tp_rank=rank, tp_size=tp_size),
                         tp=PassThroughCommunicator(), enable_expert_parallel=expert_parallel)


@pytest.mark.parametrize("expert_parallel", [True, False], ids=["ep", "tp"])
@pytest.mark.parametrize("tp_size", [2, 4])
def test_rank_partials_sum_to_the_unsharded_layer(gen, tp_size, expert_parallel):
    weights = hf_expert_weights(gen)
    x = torch.randn(13, HIDDEN, generator=gen)
    routing, expert_ids = random_routing(gen, 13, top_k=2)
    unsharded = load(FusedMoE(NUM_EXPERTS, HIDDEN, INTERMEDIATE), weights)
    expected = unsharded(x, routing, expert_ids)
    assert torch.allclose(expected.double(), dense_reference(x, weights, routing, expert_ids),
                          atol=1e-5, rtol=1e-5)
    partials = []
    for rank in range(tp_size):
        with parallel_state(simulated_rank(rank, tp_size, expert_parallel)) as state:
            moe = load(FusedMoE(NUM_EXPERTS, HIDDEN, INTERMEDIATE), weights)
            partials.append(moe(x, routing, expert_ids))
        assert state.tp.all_reduces == 1
        check_rank_holds(moe, weights, rank, tp_size, expert_parallel)
    assert torch.allclose(sum(partials), expected, atol=1e-5, rtol=1e-5)


def check_rank_holds(moe: FusedMoE, weights: HFWeights, rank: int, tp_size: int,
                     expert_parallel: bool) -> None:
    """Whole experts [r E/tp, (r+1) E/tp) with EP; every expert's r-th slice of I without."""
    if expert_parallel:
        per_rank = NUM_EXPERTS // tp_size
        assert moe.local_experts == range(rank * per_rank, (rank + 1) * per_rank)

        def shard(tensor: torch.Tensor, dim: int) -> torch.Tensor:
            return tensor
    else:
        assert moe.local_experts == range(NUM_EXPERTS)

        def shard(tensor: torch.Tensor, dim: int) -> torch.Tensor:
            return tensor.chunk(tp_size, dim)[rank]
    assert moe.w13_weight.shape[0] == moe.w2_weight.shape[0] == len(moe.local_experts)
    for index, expert in enumerate(moe.local_experts):
        w13 = torch.cat([shard(weights[expert, "w1"], 0), shard(weights[expert, "w3"], 0)])
        assert torch.equal(moe.w13_weight[index], w13)
        assert torch.equal(moe.w2_weight[index], shard(weights[expert, "w2"], 1))


def test_expert_parallel_needs_divisible_experts_and_follows_the_state():
    with pytest.raises(ValueError, match=r"experts .*\(6\) is not divisible .* size \(4\)"):
        FusedMoE(6, HIDDEN, INTERMEDIATE, tp_rank=1, tp_size=4, enable_expert_parallel=True)
    with parallel_state(simulated_rank(1, 2, expert_parallel=True)):
        assert FusedMoE(NUM_EXPERTS, HIDDEN, INTERMEDIATE).local_experts == range(4, 8)
        sliced = FusedMoE(NUM_EXPERTS, HIDDEN, INTERMEDIATE, enable_expert_parallel=False)
        assert (sliced.local_experts, sliced.local_intermediate) == (range(8), 24)
    one_rank = FusedMoE(NUM_EXPERTS, HIDDEN, INTERMEDIATE, enable_expert_parallel=True)
    assert (one_rank.local_experts, one_rank.local_intermediate) == (range(8), INTERMEDIATE)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)],
                         ids=["fp32", "bf16"])
@pytest.mark.parametrize("top_k", [1, 2])
def test_grouped_kernel_matches_the_loop(gen, dtype, tolerance, top_k):
    """Experts 0, 1, 4 and 7 get no tokens (first, last, and runs of them)."""
    weights = hf_expert_weights(gen)
    x = torch.randn(37, HIDDEN, generator=gen).to(dtype)
    routing, expert_ids = random_routing(gen, 37, top_k, allowed=[2, 3, 5, 6])
    moe = load(FusedMoE(NUM_EXPERTS, HIDDEN, INTERMEDIATE).to(dtype), weights)
    routes = route_to_experts(routing, expert_ids, 0, NUM_EXPERTS)
    assert routes.counts[[0, 1, 4, 7]].tolist() == [0, 0, 0, 0]
    assert routes.counts.sum() == 37 * top_k
    args = (x[routes.tokens], moe.w13_weight, moe.w2_weight, routes.counts, SiluAndMul())
    assert expert_kernel(*args[:3]) is grouped_experts
    grouped, loop = grouped_experts(*args).float(), loop_experts(*args).float()
    assert torch.allclose(grouped, loop, atol=tolerance, rtol=tolerance)
    reference = dense_reference(x, weights, routing, expert_ids).float()
    scale = reference.abs().max()
    assert (moe(x, routing, expert_ids).float() - reference).abs().max() <= tolerance * 4 * scale
    assert moe(x[:0], routing[:0], expert_ids[:0]).shape == (0, HIDDEN)


def test_unaligned_shapes_and_empty_batches_use_a_kernel_that_runs(gen):
    """torch's CPU grouped GEMM needs 16-byte strides: hidden 6 (24 bytes) takes the loop."""
    weights = hf_expert_weights(gen, hidden=6, intermediate=10)
    moe = load(FusedMoE(NUM_EXPERTS, 6, 10), weights)
    x = torch.randn(9, 6, generator=gen)
    routing, expert_ids = random_routing(gen, 9, top_k=2)
    assert not grouped_mm_fits(x, moe.w13_weight, moe.w2_weight)
    assert torch.allclose(moe(x, routing, expert_ids).double(),
                          dense_reference(x, weights, routing, expert_ids), atol=1e-5)
    empty = moe(x[:0], routing[:0], expert_ids[:0])
    assert empty.shape == (0, 6)


def hf_name(layer: int, expert: int, which: str) -> str:
    return f"model.layers.{layer}.block_sparse_moe.experts.{expert}.{which}.weight"


def drop_experts(folder: Path, experts: range) -> dict[str, torch.Tensor]:
    """Remove the given experts' tensors from the checkpoint; returns the tensors before."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    kept = {name: tensor for name, tensor in tensors.items()
            if not any(f".experts.{expert}." in name for expert in experts)}
    save_file(kept, path, metadata={"format": "pt"})
    return tensors


def build_at_rank_1_of_2(folder: Path):
    with parallel_state(simulated_rank(1, 2, expert_parallel=True)):
        return build_model(load_model_files(folder), torch.float32, TorchAttentionBackend)


def test_tiny_mixtral_loads_only_its_experts_at_rank_1_of_2(tmp_path):
    """Rank 1 holds experts 2 and 3 of 4: the whole checkpoint and one without experts 0
    and 1 load the same experts; one without expert 3 is missing weights."""
    save_tiny_model("mixtral", tmp_path, seed=draw_seed())
    whole = build_at_rank_1_of_2(tmp_path)
    checkpoint = drop_experts(tmp_path, range(0, 2))
    without_rank_0 = build_at_rank_1_of_2(tmp_path)
    for model in (whole, without_rank_0):
        for index, layer in enumerate(model.model.layers):
            experts = layer.mlp.experts
            assert experts.local_experts == range(2, 4)
            for local, expert in enumerate(experts.local_experts):
                w1, w2, w3 = (checkpoint[hf_name(index, expert, which)]
                              for which in ("w1", "w2", "w3"))
                assert torch.equal(experts.w13_weight[local], torch.cat([w1, w3]))
                assert torch.equal(experts.w2_weight[local], w2)
    drop_experts(tmp_path, range(3, 4))
    with pytest.raises(ModelLoadError, match=r"missing: .*experts\.3\.w1\.weight"):
        build_at_rank_1_of_2(tmp_path)
