"""``TpuModelRunner``: one ``SchedulerOutput`` through the jitted JAX step.

The persistent batch is the core's ``InputBatch`` (each request's token ids, block table
and computed-token count kept between steps, updated from ``NewRequestData`` and
``CachedRequestData`` as the torch runner does). Each step's inputs are built in numpy,
padded to the step's (tokens, requests) bucket and put on the device; the step itself,
``model.forward`` under ``jax.jit`` with the KV caches donated, was compiled ahead of time
for every bucket at start-up (:meth:`warm_up`, which keeps one executable per bucket), and
a ``CompileGuard`` counts any compile after it.

Sampling is the JAX sampler (``octavo_tpu.sample``) at the padded request count, in two
variants per request bucket, both compiled at start-up: without the dense [R, V] parts, and
with both of them (penalties and the logit bias that logit_bias, allowed_token_ids,
bad_words and min_tokens make), used by any step where one request needs either. Every step
also computes the top ``TOP_LOGPROBS`` logprobs, so asking for logprobs compiles nothing.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from octavo.plugin_api import (
    CachedRequestState,
    InputBatch,
    LogprobsLists,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from octavo_tpu.buckets import Buckets
from octavo_tpu.compile_watch import CompileGuard
from octavo_tpu.mesh import Placement
from octavo_tpu.model import ModelSpec, Params, forward
from octavo_tpu.platform import TOP_LOGPROBS
from octavo_tpu.sample import SampleOutput, SamplingTensors, sample

logger = logging.getLogger("octavo.tpu")


@dataclass
class HostStep:
    """One step's padded inputs in numpy, and which rows sample."""

    rows: np.ndarray  # batch rows scheduled, in flattened order
    sample_mask: np.ndarray  # bool [len(rows)]: the row's prompt is done after this step
    inputs: dict[str, np.ndarray]
    metadata: dict[str, np.ndarray]


class TpuModelRunner:
    def __init__(self, spec: ModelSpec, params: Params, placement: Placement, *,
                 block_size: int, max_num_reqs: int, max_model_len: int,
                 max_num_batched_tokens: int, dtype: jnp.dtype,
                 eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.spec = spec
        self.placement = placement
        self.params = placement.put_params(params)
        self.block_size = block_size
        self.dtype = jnp.dtype(dtype)
        self.pages_per_seq = -(-max_model_len // block_size)
        self.batch = InputBatch(max_num_reqs, max_model_len, self.pages_per_seq)
        self.buckets = Buckets.for_limits(max_num_batched_tokens, max_num_reqs)
        self.kv_caches: list[jax.Array] = []
        self.guard = CompileGuard()
        step = partial(forward, spec, placement.attention, placement.write_kv)
        self._step = jax.jit(step, donate_argnums=(1,),
                             out_shardings=placement.step_out_shardings(spec.num_layers))
        self.num_logprobs = min(TOP_LOGPROBS, spec.vocab_size)
        self._sample = jax.jit(partial(sample, num_logprobs=self.num_logprobs))
        self.eos_token_ids = eos_token_ids
        self._rng = np.random.default_rng()
        self.startup_compile_seconds: float | None = None

    # -- KV cache ---------------------------------------------------------------------
    def kv_cache_bytes_per_block(self) -> int:
        per_layer = self.block_size * 2 * self.spec.num_kv_heads * self.spec.head_dim
        return per_layer * self.dtype.itemsize * self.spec.num_layers

    def initialize_kv_cache(self, num_blocks: int) -> None:
        shape = (num_blocks, self.block_size, 2 * self.spec.num_kv_heads, self.spec.head_dim)
        self.kv_caches = [self.placement.zeros(shape, self.dtype)
                          for _ in range(self.spec.num_layers)]

    def warm_up(self) -> float:
        """Compile the step for every bucket pair and the sampler's two variants for every
        request bucket, a few at a time (XLA compiles one program on one thread, and JAX
        releases the GIL while it does), then run each once (interpret mode's callbacks
        compile small programs on their first run); returns seconds."""
        start = time.perf_counter()
        pairs = self.buckets.pairs()
        variants = [(num_reqs, dense) for num_reqs in self.buckets.reqs
                    for dense in (False, True)]
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            steps = pool.map(self._compile_step, pairs)
            samplers = pool.map(self._compile_sampler, variants)
            self._steps = dict(zip(pairs, tqdm(steps, total=len(pairs), unit="bucket",
                                               desc="Compiling TPU step buckets")))
            self._samplers = dict(zip(variants, samplers))
        logits_of: dict[int, jax.Array] = {}  # one run each: first-run compiles happen now
        for bucket in pairs:
            self.kv_caches, logits_of[bucket[1]] = self._run(self._empty_step(*bucket))
        for (num_reqs, dense), sampler in self._samplers.items():
            tensors = self._sampling_tensors([], num_reqs, dense)
            sampler(logits_of[num_reqs], tensors).token_ids.block_until_ready()
        self.startup_compile_seconds = time.perf_counter() - start
        logger.info("tpu: compiled %d step buckets (tokens %s x requests %s) in %.1f s",
                    len(pairs), list(self.buckets.tokens), list(self.buckets.reqs),
                    self.startup_compile_seconds)
        self.guard.arm()
        return self.startup_compile_seconds

    def _compile_step(self, bucket: tuple[int, int]) -> jax.stages.Compiled:
        inputs, metadata = self._device_inputs(self._empty_step(*bucket))
        return self._step.lower(self.params, self.kv_caches, inputs, metadata).compile()

    def _compile_sampler(self, variant: tuple[int, bool]) -> jax.stages.Compiled:
        num_reqs, dense = variant
        # The step's logits: fp32, one row per request slot, replicated over the mesh.
        logits = jax.ShapeDtypeStruct((num_reqs, self.spec.vocab_size), jnp.float32,
                                      sharding=self.placement.replicated)
        return self._sample.lower(logits, self._sampling_tensors([], num_reqs, dense)).compile()

    # -- one step -----------------------------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.batch.apply(scheduler_output, self._request_state)
        if not scheduler_output.total_num_scheduled_tokens:
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[])
        host = self._prepare(scheduler_output.num_scheduled_tokens)
        self.kv_caches, logits = self._run(host)
        tensors = self._step_sampling(host)
        sampler = self._samplers[(tensors.num_rows, tensors.penalties is not None)]
        output = self._record(host, sampler(logits, tensors))
        self.guard.check(f"{host.inputs['input_ids'].shape[0]} tokens, "
                         f"{host.metadata['kv_lens'].shape[0]} requests")
        return output

    def _run(self, host: HostStep) -> tuple[list[jax.Array], jax.Array]:
        bucket = (host.inputs["input_ids"].shape[0], host.metadata["kv_lens"].shape[0])
        return self._steps[bucket](self.params, self.kv_caches, *self._device_inputs(host))

    def _device_inputs(self, host: HostStep) -> tuple[dict[str, jax.Array], ...]:
        put = self.placement.put_input
        return ({k: put(v) for k, v in host.inputs.items()},
                {k: put(v) for k, v in host.metadata.items()})

    def _prepare(self, num_scheduled: dict[str, int]) -> HostStep:
        batch = self.batch
        rows = np.sort(np.fromiter((batch.req_index[r] for r in num_scheduled), np.int64,
                                   count=len(num_scheduled)))
        counts = np.fromiter((num_scheduled[batch.req_ids[r]] for r in rows), np.int64,
                             count=len(rows))
        ends = np.cumsum(counts)
        total = int(ends[-1])
        token_req = np.repeat(np.arange(len(rows)), counts)
        computed = batch.num_computed_tokens[rows]
        positions = computed[token_req] + np.arange(total) - (ends - counts)[token_req]
        token_row = rows[token_req]
        pages = batch.block_table[token_row, positions // self.block_size].astype(np.int64)
        seq_lens = computed + counts
        host = self._empty_step(*self.buckets.pad(total, len(rows)))
        host.rows, host.sample_mask = rows, seq_lens >= batch.num_tokens[rows]
        n = len(rows)
        host.inputs["input_ids"][:total] = batch.token_ids[token_row, positions]
        host.inputs["positions"][:total] = positions
        host.inputs["slot_mapping"][:total] = pages * self.block_size + positions % self.block_size
        host.inputs["num_tokens"][0] = total
        host.inputs["logits_indices"][:n] = ends - 1
        host.metadata["kv_lens"][:n] = seq_lens
        host.metadata["page_indices"][:n] = batch.block_table[rows, : self.pages_per_seq]
        host.metadata["cu_q_lens"][1 : n + 1] = ends
        host.metadata["cu_q_lens"][n + 1 :] = total
        host.metadata["num_seqs"][0] = n
        return host

    def _empty_step(self, num_tokens: int, num_reqs: int) -> HostStep:
        """A step of the bucket's shape with no live token: all writes dropped."""
        def zeros(*shape: int) -> np.ndarray:
            return np.zeros(shape, dtype=np.int32)

        inputs = {"input_ids": zeros(num_tokens), "positions": zeros(num_tokens),
                  "slot_mapping": zeros(num_tokens), "num_tokens": zeros(1),
                  "logits_indices": zeros(num_reqs)}
        metadata = {"kv_lens": zeros(num_reqs),
                    "page_indices": zeros(num_reqs, self.pages_per_seq),
                    "cu_q_lens": zeros(num_reqs + 1), "num_seqs": zeros(1)}
        return HostStep(np.zeros(0, np.int64), np.zeros(0, bool), inputs, metadata)

    def _step_sampling(self, host: HostStep) -> SamplingTensors:
        """The settings of the rows that sample this step (not those mid-prompt)."""
        states = [self.batch.states[self.batch.req_ids[row]] if done else None
                  for row, done in zip(host.rows.tolist(), host.sample_mask.tolist())]
        return self._sampling_tensors(states, host.metadata["kv_lens"].shape[0])

    def _sampling_tensors(self, states: list[CachedRequestState | None], num_reqs: int,
                          dense: bool | None = None) -> SamplingTensors:
        """``states`` (None: a row that samples nothing) padded to ``num_reqs`` rows, with
        both dense parts or neither (``dense``; by default, whether any row needs one)."""
        params = [None if state is None else state.sampling_params for state in states]
        positions = [0 if state is None else len(state.output_token_ids) for state in states]
        if dense is None:
            dense = SamplingTensors.uses_dense(params, positions)
        return SamplingTensors.from_params(
            params, num_reqs, positions, vocab_size=self.spec.vocab_size,
            prompt_token_ids=[[] if state is None else state.prompt_token_ids
                              for state in states],
            output_token_ids=[[] if state is None else state.output_token_ids
                              for state in states],
            eos_token_ids=self.eos_token_ids, rng=self._rng,
            with_penalties=dense, with_bias=dense)

    def _record(self, host: HostStep, out: SampleOutput) -> ModelRunnerOutput:
        """Append the sampled tokens of the rows that finished their prompt; the logprobs
        asked for (of the processed logits, as the core's sampler reads them)."""
        batch = self.batch
        tokens = np.asarray(out.token_ids)
        sampled: list[list[int]] = [[] for _ in host.rows]
        logprobs: dict[str, LogprobsLists] = {}
        top: LogprobsLists | None = None
        for i, row in enumerate(host.rows.tolist()):
            if not host.sample_mask[i]:
                continue  # a prompt chunk: nothing to sample yet
            token = int(tokens[i])
            req_id = batch.req_ids[row]
            n = batch.states[req_id].sampling_params.logprobs
            batch.append_token(row, token)
            sampled[i] = [token]
            if n is None:
                continue
            if top is None:
                assert out.top is not None
                top = out.top.to_lists(len(host.rows))
            logprobs[req_id] = LogprobsLists(token_ids=top.token_ids[i : i + 1, : n + 1],
                                             logprobs=top.logprobs[i : i + 1, : n + 1],
                                             ranks=top.ranks[i : i + 1])
        return ModelRunnerOutput(req_ids=[batch.req_ids[r] for r in host.rows],
                                 sampled_token_ids=sampled, logprobs=logprobs)

    # -- persistent batch ---------------------------------------------------------------
    @staticmethod
    def _request_state(new: NewRequestData) -> CachedRequestState:
        """A new request's state: the JAX sampler draws from keys of its own, so no torch
        generator."""
        return CachedRequestState(
            req_id=new.req_id, prompt_token_ids=list(new.prompt_token_ids),
            sampling_params=new.sampling_params, output_token_ids=list(new.output_token_ids),
            generator=None, block_ids=list(new.block_ids))

