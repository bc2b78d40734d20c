"""How many KV blocks a worker allocates: one rule for every worker, the plugins' too.

``--kv-cache-memory`` gives the budget in bytes when set. Otherwise a worker on host memory
(the CPU, or an accelerator emulated on it) takes the smaller of 1 GiB and 40% of the RAM
available at start-up; a device worker takes ``--gpu-memory-utilization`` of its memory less
what is already in use (its own rule: the GPU worker profiles a step first). The cache is
written when allocated, so all of it is resident from the start (a long-running server would
come to touch all of it anyway: freed blocks stay in the prefix cache, and the free queue
hands out never-used blocks before evicting cached ones). 1 GiB holds 46k tokens of
SmolLM2-135M in bf16 (23k in fp32). vLLM's CPU default is 4 GiB (``--kv-cache-memory 4GiB``).

The pooling runner's requests end in the step that completes their prompt, so it needs far
less: an encoder holds no KV cache at all (``bookkeeping_blocks``: blocks that only count a
step's tokens), and a pooling decoder's default is one step's blocks and one whole prompt's
(``pooling_blocks``).
"""

from __future__ import annotations

from octavo.config import EngineConfig
from octavo.platforms import Platform

HOST_DEFAULT_KV_BYTES = 1 * 2**30
HOST_DEFAULT_KV_FRACTION = 0.4  # of the RAM available at start-up


def host_kv_budget(config: EngineConfig, platform: type[Platform]) -> int:
    """Bytes for the KV cache of a worker on host memory (see the module's docstring)."""
    if config.cache.kv_cache_memory is not None:
        return config.cache.kv_cache_memory
    return min(HOST_DEFAULT_KV_BYTES, int(platform.free_memory() * HOST_DEFAULT_KV_FRACTION))


def device_kv_budget(config: EngineConfig, platform: type[Platform]) -> int:
    """Bytes for the KV cache of a device worker that does not profile a step:
    ``--kv-cache-memory``, else ``--gpu-memory-utilization`` of the device's memory less
    what is in use now (the weights, once loaded)."""
    if config.cache.kv_cache_memory is not None:
        return config.cache.kv_cache_memory
    total, free = platform.total_memory(), platform.free_memory()
    return int(total * config.cache.gpu_memory_utilization) - (total - free)


def num_kv_blocks(budget: int, bytes_per_block: int, flag: str = "--kv-cache-memory") -> int:
    """Whole blocks that fit ``budget``; ``ValueError`` naming the ``flag`` to raise when
    not even one does."""
    blocks = budget // bytes_per_block
    if blocks < 1:
        raise ValueError(f"a KV budget of {budget} bytes holds no block of {bytes_per_block} "
                         f"bytes; raise {flag}")
    return blocks


def less_ssm_states(budget: int, state_bytes: int, config: EngineConfig,
                    flag: str = "--kv-cache-memory") -> int:
    """What ``budget`` leaves for KV blocks once the SSM layers' per-request states are
    paid (``state_bytes``: a slot per ``max_num_seqs``, ``ModelRunner.ssm_state_bytes``);
    ``ValueError`` with the numbers when they take all of it."""
    if state_bytes >= budget:
        raise ValueError(f"the SSM layers' state of {config.scheduler.max_num_seqs} requests "
                         f"(max_num_seqs) takes {state_bytes} bytes, the whole KV budget of "
                         f"{budget} bytes; raise {flag} or lower --max-num-seqs")
    return budget - state_bytes


def bookkeeping_blocks(config: EngineConfig) -> int:
    """The blocks of a model with no KV cache (an encoder): no memory behind them, only
    the scheduler's count of the tokens in flight, and its requests finish in the step
    that computes them, so one step's worth is enough - the token budget in blocks, plus
    one partial block per request."""
    tokens = config.scheduler.max_num_batched_tokens
    return -(-tokens // config.cache.block_size) + config.scheduler.max_num_seqs


def pooling_blocks(config: EngineConfig) -> int:
    """A pooling decoder's default KV cache: a prompt's keys and values live only until
    its last chunk is computed, so one step's worth of blocks (``bookkeeping_blocks``) and
    the blocks of one whole prompt, for the one a step leaves half-computed, are enough
    (more only keeps more prefixes cached: ``--kv-cache-memory``)."""
    assert config.model.max_model_len is not None
    return bookkeeping_blocks(config) + -(-config.model.max_model_len // config.cache.block_size)
