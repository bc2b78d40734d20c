"""``AttentionBackendContract``: an attention backend against a dense fp64 reference, case by
case, each case named for the part of the contract (``octavo.plugin_api.AttentionBackend``)
that it checks.

A plugin runs it by subclassing it in its own tests::

    class TestMyBackend(AttentionBackendContract):
        backend = MyAttentionBackend

and tunes it with class attributes (``dtype``, ``device``, ``atol``, the shapes tried). The
cases go from simple to hard so that a failure points at one rule: a single request with its
blocks in order first, then the same request with its blocks out of order (blamed on the block
table only when the ordered one passes), then mixed batches, GQA, sliding windows, the scale,
the writes into the cache and padding.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from octavo.plugin_api import AttentionBackend, AttentionImpl, get_registries
from octavo.testing.attention_cases import (
    Shape,
    Step,
    build_step,
    dense_reference,
    with_padding,
    worst_error,
)
from octavo.testing.contract import SeededContract, Verdict

# Absolute tolerances of outputs (~unit scale) against the fp64 reference, by dtype.
DEFAULT_ATOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 5e-3,
                torch.bfloat16: 3e-2}

# One request each: (cached prefix, new tokens), and the rule it checks.
SINGLE_REQUESTS = {
    "fresh prompt": ((0, 37), "causal attention over a fresh prompt"),
    "chunk": ((50, 20), "a prompt chunk attends its cached prefix and itself, causally"),
    "decode": ((63, 1), "a decode token attends its whole cached context"),
}
# Fresh prompts, chunks over a cached prefix, single and few-token decodes; lengths that
# cross block boundaries or end on them.
MIXED_BATCH = [(0, 37), (50, 20), (33, 1), (70, 1), (0, 1), (16, 16), (5, 3)]
BLOCK_TABLE = "reads K/V through the block table"
OUTPUT_FORMAT = "returns one output row per query token, in the query's dtype and device"
WRITES = "writes the new K/V into their slots"
WRITES_NOTHING_ELSE = "writes no cache slot but the new tokens'"


class AttentionBackendContract(SeededContract):
    """Subclass it and set ``backend``; the other attributes have defaults."""

    contract_kind = "attention"
    backend: ClassVar[type[AttentionBackend]]
    dtype: ClassVar[torch.dtype] = torch.float32  # of queries, keys, values and the cache
    device: ClassVar[str] = "cpu"
    atol: ClassVar[float | None] = None  # None: DEFAULT_ATOL of the dtype
    num_kv_heads: ClassVar[int] = 2
    gqa_ratios: ClassVar[tuple[int, ...]] = (1, 3, 8)  # query heads per KV head
    # Tried where the backend supports them (else its first supported ones), paired so that
    # each appears at least once.
    head_dims: ClassVar[tuple[int, ...]] = (64, 128)
    block_sizes: ClassVar[tuple[int, ...]] = (16, 32)
    # Windows tried with AttentionImpl.sliding_window; () for a backend without them.
    sliding_windows: ClassVar[tuple[int, ...]] = (1, 7, 20)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize from the subclass's attributes."""
        if "gqa_ratio" in metafunc.fixturenames:
            metafunc.parametrize("gqa_ratio", self.gqa_ratios, ids=lambda r: f"gqa{r}")
        if "dims" in metafunc.fixturenames:
            metafunc.parametrize("dims", self._dims(), ids=lambda d: f"d{d[0]}-b{d[1]}")
        if "window" in metafunc.fixturenames:
            metafunc.parametrize("window", self.sliding_windows or (None,),
                                 ids=lambda w: f"window{w}")

    # -- the declared interface --------------------------------------------------------
    def test_declares_its_name_and_shapes(self, verdict: Verdict) -> None:
        backend, contract = self.backend, "declares its name and supported shapes"
        verdict.check(isinstance(getattr(backend, "name", None), str) and bool(backend.name),
                      contract, f"name is {getattr(backend, 'name', None)!r}")
        for attr in ("supported_head_dims", "supported_block_sizes"):
            value = getattr(backend, attr)
            verdict.check(value is None or (isinstance(value, tuple) and len(value) > 0 and all(
                isinstance(v, int) and v > 0 for v in value)), contract,
                f"{attr} is {value!r}: None (any) or a non-empty tuple of positive ints")
        verdict.check(isinstance(backend.supports_token_trees, bool), contract,
                      f"supports_token_trees is {backend.supports_token_trees!r}")

    def test_registered_under_its_name(self, verdict: Verdict) -> None:
        registry = get_registries().attention_backends
        found = registry.get(self.backend.name) if self.backend.name in registry else None
        verdict.check(found is self.backend, "registered under its name",
                      f"the attention-backend registry holds {found!r} under "
                      f"{self.backend.name!r} (registered: {registry.names()}); register it "
                      "in the plugin's octavo_register_attention_backends hook")

    def test_kv_cache_layout(self, verdict: Verdict) -> None:
        for num_blocks, block_size in ((7, self._dims()[0][1]), (1, self._dims()[-1][1])):
            shape = tuple(self.backend.kv_cache_shape(num_blocks, block_size, 3, 64))
            verdict.check(shape == (2, num_blocks, block_size, 3, 64),
                          "uses the KV cache layout [2, num_blocks, block_size, num_kv_heads, "
                          "head_dim]",
                          f"kv_cache_shape({num_blocks}, {block_size}, 3, 64) is {shape}; KV "
                          "connectors and move_kv read the cache in this layout")

    def test_make_impl(self, verdict: Verdict) -> None:
        contract = "make_impl builds an AttentionImpl for the layer"
        head_dim, window = self._dims()[0][0], (self.sliding_windows or (None,))[0]
        impl = self._impl(Shape(6, 2, head_dim, 16), scale=0.3, sliding_window=window)
        verdict.check(isinstance(impl, AttentionImpl), contract, f"it built {impl!r}")
        got = (impl.num_heads, impl.head_dim, impl.scale, impl.num_kv_heads, impl.sliding_window)
        verdict.check(got == (6, head_dim, 0.3, 2, window), contract,
                      f"make_impl(6, {head_dim}, 0.3, 2, {window}) built an impl with "
                      f"(num_heads, head_dim, scale, num_kv_heads, sliding_window) = {got}")

    # -- attention ---------------------------------------------------------------------
    @pytest.mark.parametrize("kind", list(SINGLE_REQUESTS))
    def test_single_request(self, kind: str, verdict: Verdict) -> None:
        request, contract = SINGLE_REQUESTS[kind]
        self._check_attention(self._step([request], verdict.seed, shuffled=False), verdict,
                              contract)

    @pytest.mark.parametrize("kind", list(SINGLE_REQUESTS))
    def test_reads_through_the_block_table(self, kind: str, verdict: Verdict) -> None:
        """The same request with its blocks in order, then out of order among noise blocks:
        only the second failing means the block table is not followed."""
        request, contract = SINGLE_REQUESTS[kind]
        self._check_attention(self._step([request], verdict.seed, shuffled=False), verdict,
                              contract)
        self._check_attention(self._step([request], verdict.seed, shuffled=True), verdict,
                              BLOCK_TABLE, note="blocks out of order, noise in unused blocks")

    def test_mixed_batch(self, gqa_ratio: int, dims: tuple[int, int], verdict: Verdict) -> None:
        step = self._step(MIXED_BATCH, verdict.seed, gqa_ratio=gqa_ratio, dims=dims)
        self._check_attention(step, verdict, self._mixed_contract(gqa_ratio))

    def test_sliding_window(self, window: int | None, verdict: Verdict) -> None:
        if window is None:
            pytest.skip(f"{self.backend.name}: no sliding windows (sliding_windows = ())")
        step = self._step(MIXED_BATCH + [(0, 30), (100, 1)], verdict.seed, gqa_ratio=2)
        self._check_attention(step, verdict, f"a sliding window of {window} tokens",
                              window=window)

    def test_applies_the_scale(self, verdict: Verdict) -> None:
        step = self._step(MIXED_BATCH, verdict.seed, gqa_ratio=2)
        self._check_attention(step, verdict, self._mixed_contract(2))
        self._check_attention(step, verdict, "applies the impl's scale, not head_dim**-0.5",
                              scale=0.37 * step.shape.head_dim**-0.5)

    def test_reads_kv_written_in_the_same_step(self, verdict: Verdict) -> None:
        """Request 1's cached prefix is two blocks that request 0 fills in this step (the
        prefix cache shares them within a burst)."""
        block_size = self._dims()[0][1]
        step = self._step([(0, 2 * block_size + 8), (2 * block_size, 5)], verdict.seed,
                          gqa_ratio=2, shared_blocks=2)
        self._check_attention(step, verdict, "writes all of the step's K/V before any request "
                              "reads the cache", note="request 1 reads blocks request 0 fills")

    def test_many_requests_sharing_a_cached_prefix(self, verdict: Verdict) -> None:
        """Ten decode tokens and two prompt chunks whose contexts all start with the same 20
        cached blocks (one system prompt), each after tokens of its own: the case a backend
        may attend once for all of them (cascade attention)."""
        block_size = self._dims()[0][1]
        prefix = 20 * block_size
        requests = [(prefix + extra, 1) for extra in (0, 1, 5, 16, 17, 30, 31, 33, 47, 64)]
        requests += [(prefix, 24), (prefix + 3, 9)]
        step = self._step(requests, verdict.seed, gqa_ratio=3, prefix_blocks=20)
        self._check_attention(step, verdict, "reads a cached prefix that many requests share",
                              note=f"a {prefix}-token prefix shared by {len(requests)} "
                              "requests")

    def test_ignores_padding_tokens(self, verdict: Verdict) -> None:
        step = self._step(MIXED_BATCH, verdict.seed, gqa_ratio=2)
        contract = "ignores padding tokens past num_actual_tokens"
        before = step.kv_cache.clone()
        self._check_attention(with_padding(step, 5, verdict.seed), verdict, contract,
                              note="5 padding tokens")
        changed = self._changed_slots(before, step.kv_cache)
        allowed = set(step.metadata.slot_mapping.tolist())
        verdict.check(changed <= allowed, contract,
                      f"slots {sorted(changed - allowed)[:8]} changed: a padding token's K/V "
                      "was written")

    # -- writes ------------------------------------------------------------------------
    def test_writes_the_new_kv_into_their_slots(self, verdict: Verdict) -> None:
        step = self._step(MIXED_BATCH, verdict.seed, gqa_ratio=2)
        self._forward(step, verdict)
        rows = step.kv_cache.view(2, -1, step.shape.num_kv_heads, step.shape.head_dim)
        slots = step.metadata.slot_mapping
        for index, (name, new) in enumerate((("keys", step.key), ("values", step.value))):
            written = rows[index, slots].cpu()
            wrong = (written != new.cpu()).flatten(1).any(1).nonzero().flatten().tolist()
            verdict.check(not wrong, WRITES,
                          f"after forward, the {name} of tokens {wrong[:8]} (of "
                          f"{step.num_tokens}) are not in their slots "
                          f"{slots[wrong[:8]].tolist()} (slot s = block s // block_size, "
                          "offset s % block_size)")

    def test_writes_no_other_slot(self, verdict: Verdict) -> None:
        step = self._step(MIXED_BATCH, verdict.seed, gqa_ratio=2)
        before = step.kv_cache.clone()
        self._forward(step, verdict)
        changed = self._changed_slots(before, step.kv_cache)
        allowed = set(step.metadata.slot_mapping.tolist())
        verdict.check(changed <= allowed, WRITES_NOTHING_ELSE,
                      f"slots {sorted(changed - allowed)[:8]} changed; only the "
                      f"{step.num_tokens} slots of slot_mapping may")

    def test_move_kv(self, verdict: Verdict) -> None:
        """Overlapping sources and destinations: every source must be read first."""
        step = self._step([(40, 1)], verdict.seed)
        cache = step.kv_cache
        src = torch.arange(3, 11, device=cache.device)
        dst = src + 2
        before = cache.clone()
        self.backend.move_kv(cache, src, dst)
        rows_before = before.view(2, -1, step.shape.num_kv_heads, step.shape.head_dim)
        rows = cache.view(2, -1, step.shape.num_kv_heads, step.shape.head_dim)
        contract = "move_kv copies K/V between slots, reading every source first"
        verdict.check(torch.equal(rows[:, dst], rows_before[:, src]), contract,
                      f"after move_kv(src={src.tolist()}, dst={dst.tolist()}) the destinations "
                      "do not hold the sources' old K/V")
        others = self._changed_slots(before, cache) - set(dst.tolist())
        verdict.check(not others, contract, f"slots {sorted(others)[:8]} changed too")

    # -- helpers -----------------------------------------------------------------------
    def _dims(self) -> list[tuple[int, int]]:
        """(head_dim, block_size) pairs to try, each supported one at least once."""
        heads = _supported(self.head_dims, self.backend.supported_head_dims)
        blocks = _supported(self.block_sizes, self.backend.supported_block_sizes)
        return [(heads[i % len(heads)], blocks[i % len(blocks)])
                for i in range(max(len(heads), len(blocks)))]

    def _step(self, requests: list[tuple[int, int]], seed: int, gqa_ratio: int = 1,
              dims: tuple[int, int] | None = None, shuffled: bool = True,
              shared_blocks: int = 0, prefix_blocks: int = 0) -> Step:
        head_dim, block_size = dims or self._dims()[0]
        shape = Shape(gqa_ratio * self.num_kv_heads, self.num_kv_heads, head_dim, block_size)
        return build_step(requests, shape, self.dtype, seed, shuffled, shared_blocks,
                          prefix_blocks).to(self.device)

    def _impl(self, shape: Shape, scale: float, sliding_window: int | None) -> AttentionImpl:
        """Built under the device, as models are."""
        with torch.device(self.device):
            return self.backend.make_impl(shape.num_heads, shape.head_dim, scale,
                                          shape.num_kv_heads, sliding_window)

    def _forward(self, step: Step, verdict: Verdict, scale: float | None = None,
                 window: int | None = None) -> torch.Tensor:
        scale = step.shape.head_dim**-0.5 if scale is None else scale
        impl = self._impl(step.shape, scale, window)
        try:
            output = impl.forward(step.query, step.key, step.value, step.kv_cache,
                                  step.metadata)
        except Exception as exc:
            verdict.broken("forward runs on every valid step",
                           f"forward raised {exc!r} on requests (cached, new) {step.requests}, "
                           f"{step.shape.describe()}, dtype {self.dtype}", traceback=True)
        verdict.check(isinstance(output, torch.Tensor) and output.shape == step.query.shape
                      and output.dtype == step.query.dtype
                      and output.device == step.query.device, OUTPUT_FORMAT,
                      f"got {_describe(output)} for a query of {_describe(step.query)}")
        return output

    def _check_attention(self, step: Step, verdict: Verdict, contract: str,
                         scale: float | None = None, window: int | None = None,
                         note: str = "") -> None:
        output = self._forward(step, verdict, scale, window)
        scale = step.shape.head_dim**-0.5 if scale is None else scale
        error, where = worst_error(output, dense_reference(step, scale, window), step)
        atol = self.atol if self.atol is not None else DEFAULT_ATOL[self.dtype]
        verdict.check(error <= atol, contract,
                      f"max |output - dense fp64 reference| = {error:.3g} > atol {atol:g} at "
                      f"{where}; requests (cached, new) {step.requests}, "
                      f"{step.shape.describe()}, dtype {self.dtype}"
                      + (f", window {window}" if window else "") + (f"; {note}" if note else ""))

    @staticmethod
    def _mixed_contract(gqa_ratio: int) -> str:
        heads = "1 query head" if gqa_ratio == 1 else f"{gqa_ratio} query heads"
        return f"a mixed batch of prompts, chunks and decodes, {heads} per KV head"

    @staticmethod
    def _changed_slots(before: torch.Tensor, after: torch.Tensor) -> set[int]:
        num_slots = before.shape[1] * before.shape[2]
        diff = (before.view(2, num_slots, -1) != after.view(2, num_slots, -1)).any(-1).any(0)
        return set(diff.nonzero().flatten().tolist())


def _supported(wanted: tuple[int, ...], supported: tuple[int, ...] | None) -> list[int]:
    if supported is None:
        return list(wanted)
    return [v for v in wanted if v in supported] or [supported[0]]


def _describe(t: object) -> str:
    if not isinstance(t, torch.Tensor):
        return repr(type(t))
    return f"{list(t.shape)} {t.dtype} on {t.device}"
