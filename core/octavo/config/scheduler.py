"""``SchedulerConfig``: the token budget and sequence cap of a step, the waiting-queue
policy, and which scheduler and KV-cache manager classes run (names in the plugin
registries, resolved when the engine is built)."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.config.errors import ConfigError
from octavo.config.parse import check_positive_ints


@dataclass
class SchedulerConfig:
    max_num_seqs: int = field(default=256, metadata={"help": "Most requests in one batch."})
    # vLLM's CPU default for offline use. On the CPU (SmolLM2-135M, W1) a 4096-token step
    # runs as fast as an 8192-token one and holds half the activations (peak RSS 0.08 GB less).
    max_num_batched_tokens: int = field(default=4096, metadata={
        "help": "Token budget of one step (prefill chunks + decodes)."})
    long_prefill_token_threshold: int = field(default=0, metadata={
        "help": "Most tokens one request's prefill chunk takes in a step, so a long "
                "prompt leaves room for others (0: no limit but the budget)."})
    scheduling_policy: str = field(default="fcfs", metadata={
        "help": "Waiting-queue policy: fcfs, priority, or a plugin's."})
    scheduler_cls: str = field(default="default", metadata={
        "help": "Scheduler, by its name in the schedulers registry (a plugin's, or default)."})
    kv_manager: str = field(default="default", metadata={
        "help": "KV-cache manager, by its name in the kv_managers registry "
                "(a plugin's, or default)."})
    # None until EngineConfig resolves it: on wherever it runs (vLLM's default, None too).
    async_scheduling: bool | None = field(default=None, metadata={
        "help": "Schedule step N+1 while step N runs (vLLM's flag): the worker fills in "
                "the tokens step N samples, so scheduling and output processing overlap "
                "the forward pass. Default: on with one rank or tensor parallelism (uni, "
                "mp executors) and the default scheduler, off where it does not run. "
                "See docs/architecture.md, \"Async scheduling\"."})
    # Set by the engine (vLLM's name, not a flag here): False for a pooling model whose
    # prompt must be computed whole in one step (an encoder; CLS or MEAN pooling), which
    # then needs max_num_batched_tokens >= max_model_len.
    enable_chunked_prefill: bool = field(default=True, init=False)
    # Set with async_scheduling (EngineConfig): whether it was left unset, so that the
    # engine turns it off, rather than refuse to start, for what only the model's files
    # tell (runner=auto settling on the pooling runner).
    async_scheduling_by_default: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        check_positive_ints("", max_num_seqs=self.max_num_seqs,
                            max_num_batched_tokens=self.max_num_batched_tokens)
        threshold = self.long_prefill_token_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ConfigError(f"long_prefill_token_threshold must be a non-negative integer "
                              f"(0: off), got {threshold!r}")
