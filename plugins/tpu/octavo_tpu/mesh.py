"""Where arrays live: one device, or a tensor-parallel mesh of several in one process.

With ``-tp N`` the worker is a single controller: one process, one ``jax.sharding.Mesh``
of N devices with a ``model`` axis. Attention and MLP weights are split by heads /
features over that axis (q/k/v, gate/up by output columns; o/down by input rows, so XLA
adds the all-reduce after them), the KV caches by KV heads (axis 2, K and V of a head
adjacent), everything else replicated. The attention kernels run per device under
``shard_map`` on their shard of heads; jit keeps the step's outputs on the same shardings
so that no step sees a new input layout (which would compile a new program).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from octavo_tpu.model import Params

AXIS = "model"
COLUMN = ("q_w", "k_w", "v_w", "gate_w", "up_w")  # split by output features
COLUMN_BIAS = ("q_b", "k_b", "v_b", "gate_b", "up_b")
ROW = ("o_w", "down_w")  # split by input features


def _leaf_spec(name: str) -> P:
    if name in COLUMN:
        return P(None, AXIS)
    if name in COLUMN_BIAS:
        return P(AXIS)
    if name in ROW:
        return P(AXIS, None)
    return P()


class Placement:
    """The devices of one worker and how each kind of array is laid out on them."""

    def __init__(self, devices: list[Any], attention: Callable[..., jax.Array],
                 write_kv: Callable[..., jax.Array], interpret: object) -> None:
        self.mesh = Mesh(np.array(devices), (AXIS,))
        self.tp = len(devices)
        self.replicated = NamedSharding(self.mesh, P())
        self.kv_sharding = NamedSharding(self.mesh, P(None, None, AXIS, None))
        kernels = (partial(attention, interpret=interpret), partial(write_kv, interpret=interpret))
        self.attention, self.write_kv = kernels if self.tp == 1 else self._sharded(*kernels)

    def _sharded(self, attention: Callable[..., jax.Array], write_kv: Callable[..., jax.Array],
                 ) -> tuple[Callable[..., jax.Array], Callable[..., jax.Array]]:
        """The kernels per device on its heads: q/k/v by heads, caches by KV heads."""
        heads, cache, same = P(None, AXIS, None), P(None, None, AXIS, None), P()

        def sharded_attention(q, kv_cache, kv_lens, page_indices, cu_q_lens, num_seqs,
                              **static):
            body = partial(attention, **static)
            return jax.shard_map(body, mesh=self.mesh,
                                 in_specs=(heads, cache, same, same, same, same),
                                 out_specs=heads, check_vma=False)(
                q, kv_cache, kv_lens, page_indices, cu_q_lens, num_seqs)

        def sharded_write(kv_cache, k, v, slot_mapping, num_tokens):
            return jax.shard_map(write_kv, mesh=self.mesh,
                                 in_specs=(cache, heads, heads, same, same),
                                 out_specs=cache, check_vma=False)(
                kv_cache, k, v, slot_mapping, num_tokens)

        return sharded_attention, sharded_write

    def put_params(self, params: Params) -> Params:
        def place(path: tuple[Any, ...], leaf: jax.Array) -> jax.Array:
            name = getattr(path[-1], "key", "")
            return jax.device_put(leaf, NamedSharding(self.mesh, _leaf_spec(name)))

        return jax.tree_util.tree_map_with_path(place, params)

    def put_input(self, array: np.ndarray) -> jax.Array:
        return jax.device_put(array, self.replicated)

    def zeros(self, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
        return jax.jit(partial(jnp.zeros, shape, dtype), out_shardings=self.kv_sharding)()

    def step_out_shardings(self, num_layers: int) -> tuple[list[NamedSharding], NamedSharding]:
        """The step's (caches, logits) layouts: the caches' own, logits replicated."""
        return [self.kv_sharding] * num_layers, self.replicated

    def check_model(self, num_heads: int, num_kv_heads: int, intermediate: int) -> None:
        """Each device must hold whole heads; name the dimension that does not split."""
        problems = [f"{count} {what}" for count, what in (
            (num_heads, "attention heads"), (num_kv_heads, "key/value heads"),
            (intermediate, "MLP features")) if count % self.tp]
        if problems:
            raise ValueError(f"the tpu backend splits heads over tensor_parallel_size="
                             f"{self.tp} devices: {', '.join(problems)} do not divide by it")
