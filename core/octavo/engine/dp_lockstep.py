"""``DPLockstep``: data-parallel engines that share an expert group step together.

With ``-dp N --enable-expert-parallel`` every MoE layer of a step is a collective over
every engine's workers (``octavo.models.layers.expert_dispatch``): an engine that did not
step would leave the others waiting in their first MoE layer. So, as in vLLM, the engines
agree before each step whether any of them has work (an all-reduce of two flags over a
gloo group of the engine core processes); if one has, all step, and an engine with nothing
scheduled runs a dummy batch (``octavo.models.layers.moe.execute_dummy_batch``), which
takes part in each MoE layer's collectives with no tokens. Nothing else is kept in step:
the engines' schedules, batches and step counts are their own.

An idle group polls: each engine waits up to ``IDLE_POLL_S`` for a request before the next
agreement, so a request that arrives at an idle engine starts within that time.

A dead engine breaks the group: the others' next collective fails at once (gloo's
connections to the dead process close), they end with ``EngineGroupBroken`` naming it,
and the front end reports them dead - no engine is left waiting.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from octavo.config import ParallelConfig
from octavo.distributed.engine_group import engine_store, new_group

# A busy engine's step may take long (a long prefill on a CPU): the others wait that long.
LOCKSTEP_TIMEOUT_S = 600.0


class EngineGroupBroken(RuntimeError):
    """Another engine of the expert group is gone: this engine cannot step again."""


class DPLockstep:
    idle_poll_s = 0.05  # an idle engine's wait for a request between agreements

    def __init__(self, parallel: ParallelConfig) -> None:
        """Join the engines' lockstep group (every engine core calls it at start; engine 0
        serves the store the workers' expert group meets on too)."""
        assert parallel.data_parallel_master_port is not None, "set by the launch"
        self.engine_index = parallel.engine_index
        self.store = engine_store(parallel.data_parallel_address,
                                  parallel.data_parallel_master_port,
                                  serve=parallel.engine_index == 0,
                                  timeout_s=LOCKSTEP_TIMEOUT_S)
        self.group = new_group(self.store, "lockstep/", parallel.engine_index,
                               parallel.data_parallel_size, "gloo", LOCKSTEP_TIMEOUT_S)

    def agree(self, has_work: bool, stopping: bool) -> tuple[bool, bool]:
        """(whether any engine has work, whether any is stopping); every engine calls it
        once per turn of its busy loop."""
        flags = torch.tensor([int(has_work), int(stopping)])
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
        try:
            self.group.allreduce([flags], options).wait()
        except RuntimeError as exc:
            raise EngineGroupBroken(
                f"data-parallel engine {self.engine_index}: the engines' expert group is "
                f"broken (another engine died?): {exc}") from exc
        return bool(flags[0]), bool(flags[1])
