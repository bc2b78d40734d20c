"""Random inputs of the ragged paged attention kernel and the interpret-mode settings the
kernel tests run under (race detection on)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax._src.pallas.mosaic.interpret import interpret_pallas_call  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

# Every kernel test runs the kernel on the simulated TPU with the race detector on.
RACE_CHECKED = pltpu.InterpretParams(detect_races=True)


def races_found() -> bool:
    """Whether the interpreter's happens-before race detector saw a race since it started
    (JAX keeps the flag in a module global only: there is no public accessor)."""
    state = interpret_pallas_call.races
    return bool(state is not None and state.races_found)


@dataclass
class AttentionInputs:
    """The kernel's positional arguments, plus what the tests need to know about them."""

    q: jax.Array
    kv_cache: jax.Array
    kv_lens: jax.Array
    page_indices: jax.Array
    cu_q_lens: jax.Array
    num_seqs: jax.Array
    num_real_tokens: int
    used_pages: list[list[int]]  # pool page ids each sequence's context occupies, in order

    def args(self) -> tuple[jax.Array, ...]:
        return (self.q, self.kv_cache, self.kv_lens, self.page_indices, self.cu_q_lens,
                self.num_seqs)


def make_inputs(rng: np.random.Generator, q_lens: list[int], kv_lens: list[int], *,
                num_kv_heads: int, group: int, head_dim: int, dtype: str,
                page_size: int = 16, pages_per_seq: int = 8, max_num_seqs: int = 6,
                num_tokens: int = 48) -> AttentionInputs:
    """Fresh N(0, 1) q and cache; each sequence's pages drawn at random, out of order, from a
    pool with spare pages; page-table tails, padding sequences and padding tokens hold junk.
    Fixed padded sizes, as the runner's buckets, let cases share one compiled kernel."""
    assert all(0 < q <= kv for q, kv in zip(q_lens, kv_lens))
    num_seqs = len(q_lens)
    assert num_seqs < max_num_seqs and sum(q_lens) < num_tokens
    num_pages = max_num_seqs * pages_per_seq + 3
    pool = rng.permutation(num_pages)
    page_indices = pool[:max_num_seqs * pages_per_seq].reshape(max_num_seqs, pages_per_seq)
    used = [list(page_indices[s, :-(-kv // page_size)]) for s, kv in enumerate(kv_lens)]
    cu = np.zeros(max_num_seqs + 1, np.int64)
    cu[1:num_seqs + 1] = np.cumsum(q_lens)
    cu[num_seqs + 1:] = cu[num_seqs]  # padding sequences own no queries
    lens = np.zeros(max_num_seqs, np.int64)
    lens[:num_seqs] = kv_lens
    q = rng.standard_normal((num_tokens, num_kv_heads * group, head_dim))
    kv = rng.standard_normal((num_pages, page_size, 2 * num_kv_heads, head_dim))
    return AttentionInputs(
        q=jnp.asarray(q, dtype), kv_cache=jnp.asarray(kv, dtype),
        kv_lens=jnp.asarray(lens, jnp.int32), page_indices=jnp.asarray(page_indices, jnp.int32),
        cu_q_lens=jnp.asarray(cu, jnp.int32), num_seqs=jnp.asarray([num_seqs], jnp.int32),
        num_real_tokens=int(cu[num_seqs]), used_pages=used)


def naive_attention(inputs: AttentionInputs, *, sm_scale: float, sliding_window: int | None,
                    soft_cap: float | None) -> np.ndarray:
    """Per-token, per-head float64 loop over the spec's semantics: the oracle of the oracle."""
    q = np.asarray(inputs.q, np.float64)
    kv = np.asarray(inputs.kv_cache, np.float64)
    cu = np.asarray(inputs.cu_q_lens)
    num_q_heads = q.shape[1]
    num_kv_heads = kv.shape[2] // 2
    page_size = kv.shape[1]
    out = np.zeros((inputs.num_real_tokens, num_q_heads, q.shape[2]))
    for s in range(int(inputs.num_seqs[0])):
        kv_len = int(inputs.kv_lens[s])
        q_len = int(cu[s + 1] - cu[s])
        pages = np.asarray(inputs.page_indices[s])
        for i in range(q_len):
            t, pos = int(cu[s]) + i, kv_len - q_len + i
            for h in range(num_q_heads):
                kvh = h // (num_q_heads // num_kv_heads)
                keys = [p for p in range(pos + 1)
                        if sliding_window is None or p > pos - sliding_window]
                k = np.stack([kv[pages[p // page_size], p % page_size, 2 * kvh] for p in keys])
                v = np.stack([kv[pages[p // page_size], p % page_size, 2 * kvh + 1]
                              for p in keys])
                logits = k @ q[t, h] * sm_scale
                if soft_cap is not None:
                    logits = soft_cap * np.tanh(logits / soft_cap)
                weights = np.exp(logits - logits.max())
                out[t, h] = weights @ v / weights.sum()
    return out
