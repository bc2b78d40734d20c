"""``SchedulerConfig``: the knobs of the scheduler and of the KV cache it hands out.

Field names follow vLLM's CLI flags (``--max-num-seqs``, ``--max-num-batched-tokens``,
``--max-model-len``, ``--scheduling-policy``, ``--block-size``,
``--enable-prefix-caching``). ``num_blocks`` comes from KV-cache sizing (a memory budget
divided by the bytes of one block), so it has no default.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.kv_transfer.config import KVTransferConfig


@dataclass
class SchedulerConfig:
    num_blocks: int
    max_model_len: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: str = "fcfs"  # a name in the scheduling_policies registry
    enable_prefix_caching: bool = True
    kv_manager: str = "default"  # a name in the kv_managers registry
    kv_transfer: KVTransferConfig | None = None  # a KV connector to load/save prompt KV
    num_speculative_tokens: int = 0  # k of speculative decoding; 0 = off

    def __post_init__(self) -> None:
        for name in ("num_blocks", "max_model_len", "block_size", "max_num_seqs",
                     "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SchedulerConfig.{name} must be a positive integer, "
                                 f"got {value!r}")
        needed_blocks = -(-self.max_model_len // self.block_size)
        if self.num_blocks < needed_blocks:
            # Otherwise a single long request could never fit, even with every other
            # request preempted, and would wait or be preempted forever.
            raise ValueError(
                f"the KV cache has {self.num_blocks} blocks of {self.block_size} tokens "
                f"({self.num_blocks * self.block_size} tokens), but one request of "
                f"max_model_len ({self.max_model_len}) tokens needs {needed_blocks} blocks: "
                "raise --kv-cache-memory or lower --max-model-len"
            )
