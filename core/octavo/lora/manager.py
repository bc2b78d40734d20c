"""The worker's adapters: which layers carry LoRA, which adapters sit in the slots, and
each step's token -> slot map.

``install_lora`` wraps the method of every attention and MLP projection of the model
(``LoRALinearMethod``); ``WorkerLoRAManager.prepare_step`` then, once per step, puts the
step's adapters in slots (``--max-loras`` of them: the scheduler never schedules more
distinct adapters in one step) and builds the map and its tokens grouped by slot, which
every wrapped layer's kernels of the step read. Adapters are read from disk once and
kept in a least-recently-used cache of ``--max-cpu-loras`` entries, keyed by their content
digest: an adapter re-loaded with new weights is a new entry, never the old weights.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from octavo.config.lora import LoRAConfig
from octavo.lora.adapter import SUPPORTED_MODULES, LoRAAdapter, load_adapter
from octavo.lora.layers import LoRABatch, LoRALinearMethod, layer_slices
from octavo.lora.ops import BindDelta, Expand, Shrink
from octavo.lora_request import LoRAAdapterRef
from octavo.models.base import CausalLM
from octavo.models.layers.linear import LinearBase

# Octavo's module names of the projections LoRA wraps (fused or not).
_WRAPPED = frozenset(SUPPORTED_MODULES) | {"qkv_proj", "gate_up_proj"}


class WorkerLoRAManager:
    """The slots of one worker (see the module docstring)."""

    def __init__(self, layers: list[LoRALinearMethod], batch: LoRABatch,
                 config: LoRAConfig) -> None:
        assert config.max_cpu_loras is not None  # settled by LoRAConfig
        self.layers = layers
        self.batch = batch
        self.max_rank = config.max_lora_rank
        self.max_cpu_loras = config.max_cpu_loras
        self.slots: list[str | None] = [None] * config.max_loras  # digest per slot
        self.cache: OrderedDict[str, LoRAAdapter] = OrderedDict()

    def prepare_step(self, adapters: Sequence[LoRAAdapterRef | None],
                     num_tokens: Sequence[int], total: int) -> None:
        """Slot the step's adapters (one per scheduled request, in step order) and set the
        token -> slot map (each request's ``num_tokens`` tokens; padding up to ``total``
        tokens runs without an adapter)."""
        wanted = {ref.digest: ref for ref in adapters if ref is not None}
        if not wanted:
            self.batch.set_map(None)
            return
        if len(wanted) > len(self.slots):
            raise RuntimeError(f"{len(wanted)} adapters in one step, {len(self.slots)} slots "
                               f"(max_loras): the scheduler must cap them")
        slot_of = self._place(wanted)
        per_request = [-1 if ref is None else slot_of[ref.digest] for ref in adapters]
        token_lora = np.full(total, -1, dtype=np.int32)
        mapped = np.repeat(np.asarray(per_request, dtype=np.int32), num_tokens)
        token_lora[:len(mapped)] = mapped
        self.batch.set_map(torch.from_numpy(token_lora))

    def _place(self, wanted: dict[str, LoRAAdapterRef]) -> dict[str, int]:
        """Each wanted digest's slot, loading the ones not in a slot into slots that hold
        none of the step's adapters."""
        free = [i for i, digest in enumerate(self.slots) if digest not in wanted]
        slot_of = {}
        for digest, ref in wanted.items():
            if digest in self.slots:
                slot_of[digest] = self.slots.index(digest)
                continue
            slot = free.pop(0)
            adapter = self._adapter(ref)
            for layer in self.layers:
                layer.set_slot(slot, adapter)
            self.slots[slot] = digest
            slot_of[digest] = slot
        return slot_of

    def _adapter(self, ref: LoRAAdapterRef) -> LoRAAdapter:
        """The adapter from the cache (now most recently used), or read from its path."""
        adapter = self.cache.pop(ref.digest, None)
        if adapter is None:
            adapter = load_adapter(ref.path, self.max_rank)
        self.cache[ref.digest] = adapter
        while len(self.cache) > self.max_cpu_loras:
            self.cache.popitem(last=False)
        return adapter


def install_lora(model: CausalLM, config: LoRAConfig, dtype: torch.dtype,
                 kernels: tuple[Shrink, Expand] | None = None,
                 bind: BindDelta | None = None) -> WorkerLoRAManager:
    """Wrap ``model``'s attention and MLP projections in ``LoRALinearMethod`` (call it
    after loading, before the platform prepares the model); ``kernels``: the platform's
    shrink/expand (None: the portable ones of ``octavo.lora.ops``); ``bind``: its one-call
    layer delta (None: shrink/expand slice by slice)."""
    batch = (LoRABatch(config.max_loras, bind=bind) if kernels is None
             else LoRABatch(config.max_loras, *kernels, bind=bind))
    layers = []
    for name, module in model.named_modules():
        if isinstance(module, LinearBase) and name.rsplit(".", 1)[-1] in _WRAPPED:
            method = LoRALinearMethod(module.quant_method, module,
                                      layer_slices(module, name, model.stacked_params),
                                      batch, config.max_loras, config.max_lora_rank, dtype)
            module.quant_method = method
            layers.append(method)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no projection LoRA can wrap "
                         f"({', '.join(sorted(_WRAPPED))})")
    return WorkerLoRAManager(layers, batch, config)

