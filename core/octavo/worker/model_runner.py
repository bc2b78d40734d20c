"""``ModelRunner``: executes one ``SchedulerOutput`` - update the persistent batch, run the
model over the flattened super-sequence, sample the requests that finished their prompt.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import torch

from octavo.attention import AttentionBackend
from octavo.distributed.state import get_parallel_state
from octavo.kv.cache_spec import is_hybrid, kv_cache_groups, ssm_state_spec
from octavo.lora.manager import WorkerLoRAManager
from octavo.models.base import CausalLM, IntermediateTensors
from octavo.models.layers.moe import execute_dummy_batch
from octavo.outputs import (
    LogprobsLists,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from octavo.sample.logprobs import compute_prompt_logprobs
from octavo.sample.metadata import (
    SamplingArrays,
    SamplingMetadata,
    allowed_token_ids_mask,
    min_tokens_rows,
    padded_token_ids,
)
from octavo.sample.sampler import Sampler, SamplerOutput
from octavo.worker.grammar_bitmask import apply_grammar_bitmask, grammar_rows
from octavo.worker.input_batch import CachedRequestState, InputBatch, new_generator
from octavo.worker.kv_groups import assign_kv_groups, layer_kv_specs, local_tensor_indices
from octavo.worker.kv_transfer import WorkerKVTransfer
from octavo.worker.spec_decode.verifier import SpecVerifier
from octavo.worker.step_inputs import StepInputs, prepare_step


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        attn_backend: type[AttentionBackend],
        *,
        block_size: int,
        max_num_reqs: int,
        max_model_len: int,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        device: torch.device,
    ) -> None:
        self.model = model
        self.attn_backend = attn_backend
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.device = device
        # The model's KV groups (octavo.kv.cache_spec); with several, or a sliding window, local
        # attention layer j writes KV tensor kv_tensor_index[j], shared across groups. SSM
        # layers (ssm_layers, model-wide) keep a state tensor instead, a row per slot.
        specs = layer_kv_specs(model)
        self.kv_groups = kv_cache_groups(specs)
        ssm_state = ssm_state_spec(specs)
        self.ssm_layers = frozenset(ssm_state.layers if ssm_state else ())
        self.num_state_slots = max_num_reqs
        self.attention_layers = [i for i in model.layer_range if i not in self.ssm_layers]
        self.hybrid_kv = is_hybrid(self.kv_groups)
        self.kv_tensor_index = (local_tensor_indices(self.kv_groups, self.attention_layers)
                                if self.hybrid_kv else list(range(len(self.attention_layers))))
        self.batch = InputBatch(max_num_reqs, max_model_len, -(-max_model_len // block_size),
                                num_kv_groups=len(self.kv_groups))
        self.sampler = Sampler()
        self.kv_caches: list[torch.Tensor] = []
        # What the KV tensors hold: the model's dtype, or fp8 (--kv-cache-dtype), set by the
        # worker through ``set_kv_cache_dtype`` before the cache is sized.
        self.kv_cache_dtype = model.dtype
        self.kv_transfer: WorkerKVTransfer | None = None  # set by the worker with a KV connector
        # Set by the worker when speculative decoding is on.
        self.spec: SpecVerifier | None = None
        # Set by the worker with --enable-lora: the adapter slots.
        self.lora: WorkerLoRAManager | None = None

    # -- KV cache ---------------------------------------------------------------------
    def kv_cache_bytes_per_block(self) -> int:
        shape = self.model.kv_cache_shape(1, self.block_size)
        per_layer = int(np.prod(shape)) * torch.finfo(self.kv_cache_dtype).bits // 8
        proposer = self.spec.proposer.kv_cache_bytes_per_block() if self.spec else 0
        return per_layer * self.num_kv_tensors + proposer

    def set_kv_cache_dtype(self, dtype: torch.dtype) -> None:
        """Store keys and values in ``dtype`` (an fp8 one: ``octavo.attention.kv_quant``);
        refused, naming the flag, for a latent attention model, whose kernels read only its
        own dtype."""
        if dtype != self.model.dtype and self.model.mla_spec is not None:
            raise ValueError(f"--kv-cache-dtype {dtype} is not supported for multi-head latent "
                             "attention (MLA) models yet; use --kv-cache-dtype auto")
        self.kv_cache_dtype = dtype

    @property
    def num_kv_tensors(self) -> int:
        """KV tensors on this rank: one per attention layer, or with KV groups one per layer
        of a group (each block id holds one group's layers)."""
        return max(self.kv_tensor_index, default=-1) + 1

    def ssm_state_bytes(self) -> int:
        """What this rank's SSM layers' states take: a slot per request it may hold."""
        local = sum(1 for layer in self.model.layer_range if layer in self.ssm_layers)
        if not local:
            return 0
        shape = self.model.ssm_state_shape(self.num_state_slots)
        return local * int(np.prod(shape)) * torch.finfo(torch.float32).bits // 8

    def initialize_kv_cache(self, num_blocks: int) -> None:
        shape = self.model.kv_cache_shape(num_blocks, self.block_size)
        # Zeroed (written) now, so the OS commits every page at start-up: the memory the
        # process holds from the start is what it holds under full load. Lazily committed
        # pages would grow the RSS by the whole cache over the first hours of traffic (the
        # free-block queue cycles through every block), which hides a real leak and moves
        # an out-of-memory kill from start-up to the middle of serving.
        tensors = [torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
                   for _ in range(self.num_kv_tensors)]
        caches = dict(zip(self.attention_layers,
                          (tensors[index] for index in self.kv_tensor_index)))
        caches.update((layer, self._ssm_state()) for layer in self.model.layer_range
                      if layer in self.ssm_layers)
        # In layer order; none at all for a model without a cache (an encoder, whose
        # kv_tensor_index the pooling runner empties).
        self.kv_caches = [caches[layer] for layer in self.model.layer_range if layer in caches]
        if len(self.kv_groups) > 1:
            assign_kv_groups(self.model, self.kv_groups, self.attention_layers)
        if self.spec:
            self.spec.proposer.initialize_kv_cache(num_blocks)

    def _ssm_state(self) -> torch.Tensor:
        """One SSM layer's state tensor, zeroed (fp32: the scan accumulates in it)."""
        return torch.zeros(self.model.ssm_state_shape(self.num_state_slots),
                           dtype=torch.float32, device=self.device)

    # -- one step -----------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.batch.apply(scheduler_output, self._request_state,
                         reads_sampled_tokens=not self.model.ranks.is_last_stage)
        if self.kv_transfer is not None:
            return self.kv_transfer.execute(scheduler_output, self._execute_step)
        return self._execute_step(scheduler_output)

    def _execute_step(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        if not scheduler_output.total_num_scheduled_tokens:
            if get_parallel_state().ep is not None:  # the other engines' MoE layers wait
                execute_dummy_batch(self.model)
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[])
        drafts = scheduler_output.scheduled_spec_decode_tokens
        if drafts:
            SpecVerifier.place_drafts(self.batch, drafts)
        step = prepare_step(self.batch, scheduler_output.num_scheduled_tokens, self.block_size,
                            self.device, rope_lengths=self.model.uses_rope_lengths,
                            state_slots=bool(self.ssm_layers))
        if drafts:
            assert self.spec is not None, "drafts were scheduled without a proposer"
            verify_mask = SpecVerifier.draft_mask(step, self.batch, drafts)
            self.spec.mark_trees(step, verify_mask)
        if self.lora is not None:
            self._prepare_lora(step)
        hidden = self.run_model(step)
        if hidden is None:  # a pipeline stage before the last: the hidden states went on
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[])
        prompt_logprobs = self._prompt_logprobs(step, hidden)
        sample_mask, logits_indices = step.sample_mask, step.logits_indices
        if drafts:  # drafting requests are sampled by the rejection sampler instead
            keep = torch.from_numpy(~verify_mask[sample_mask]).to(self.device)
            logits_indices = logits_indices[keep]
            sample_mask = sample_mask & ~verify_mask
        sample_rows = step.rows[sample_mask]
        sampled: list[list[int]] = [[] for _ in step.rows]
        logprobs: dict[str, LogprobsLists] = {}
        if len(sample_rows):
            logits = self.model.compute_logits(hidden[logits_indices])
            self._apply_grammar(logits, sample_rows, scheduler_output)
            out = self.sampler(logits, self.sampling_metadata(sample_rows))
            self._record_samples(sample_mask, sample_rows, out, sampled, logprobs)
        if drafts:
            assert self.spec is not None
            self.spec.verify(step, hidden, verify_mask, drafts, sampled)
        return ModelRunnerOutput(
            req_ids=[self.batch.req_ids[r] for r in step.rows],
            sampled_token_ids=sampled,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            spec_token_ids=(self.spec.propose(step, hidden, sampled, drafts)
                            if self.spec else []),
        )

    def _prepare_lora(self, step: StepInputs) -> None:
        """Slot the step's adapters and map its tokens (in step order) to them."""
        assert self.lora is not None
        starts = step.metadata.query_start_loc_cpu
        assert starts is not None  # prepare_step always fills the host copy
        states = [self.batch.states[self.batch.req_ids[row]] for row in step.rows.tolist()]
        self.lora.prepare_step([state.lora for state in states], torch.diff(starts).tolist(),
                               total=step.input_ids.shape[0])

    def _prompt_logprobs(self, step: StepInputs, hidden: torch.Tensor,
                         ) -> dict[str, LogprobsLists]:
        """Logprobs of each prompt token given the ones before it, for the prompt positions
        computed this step (position p scores prompt token p + 1)."""
        result: dict[str, LogprobsLists] = {}
        starts = step.metadata.query_start_loc_cpu
        assert starts is not None  # prepare_step always fills the host copy
        for i, row in enumerate(step.rows.tolist()):
            state = self.batch.states[self.batch.req_ids[row]]
            num_logprobs = state.sampling_params.prompt_logprobs
            if num_logprobs is None:
                continue
            first = int(self.batch.num_computed_tokens[row])
            last = min(first + int(starts[i + 1] - starts[i]),
                       int(self.batch.num_prompt_tokens[row]) - 1)
            if last <= first:
                continue
            flat = torch.arange(int(starts[i]), int(starts[i]) + last - first)
            targets = torch.from_numpy(self.batch.token_ids[row, first + 1 : last + 1])
            logits = self.model.compute_logits(hidden[flat.to(self.device)])
            result[state.req_id] = compute_prompt_logprobs(
                logits, targets.to(self.device), num_logprobs).tolists()
        return result

    def run_model(self, step: StepInputs) -> torch.Tensor | None:
        """The forward pass of one step: hidden states ``[T, hidden]``, or None on a
        pipeline stage before the last, which sends its ``IntermediateTensors`` on (and a
        stage after the first receives them). GPU runners override it to replay a captured
        CUDA graph when the step fits one."""
        ranks = self.model.ranks
        # Prompt embeddings enter at the first stage; later ones get its hidden states.
        embeds = (self.input_embeddings(step)
                  if ranks.is_first_stage and step.prompt_embeds is not None else None)
        extra = {} if embeds is None else {"inputs_embeds": embeds}
        if ranks.pp_size == 1:
            return self.model(step.input_ids, step.positions, self.kv_caches, step.metadata,
                              **extra)
        state = get_parallel_state()
        intermediate = None
        if not ranks.is_first_stage:
            shape = (step.input_ids.shape[0], self.model.config.hidden_size)
            hidden, residual = state.recv_from_previous_stage([shape, shape], self.model.dtype,
                                                              self.device)
            intermediate = IntermediateTensors(hidden, residual)
        output = self.model(step.input_ids, step.positions, self.kv_caches, step.metadata,
                            intermediate, **extra)
        if isinstance(output, IntermediateTensors):
            state.send_to_next_stage(output.as_list())
            return None
        return output

    def input_embeddings(self, step: StepInputs) -> torch.Tensor:
        """The model's input ``[T, hidden]`` of a step with prompt embeddings: the ids'
        embeddings, with the given rows at the prompt positions of embedded requests."""
        assert step.prompt_embeds is not None
        hidden = self.model.get_input_embeddings(step.input_ids)
        hidden[step.prompt_embeds.indices] = step.prompt_embeds.values
        return hidden

    def _record_samples(self, sample_mask: np.ndarray, sample_rows: np.ndarray,
                        out: SamplerOutput, sampled: list[list[int]],
                        logprobs: dict[str, LogprobsLists]) -> None:
        tokens = out.sampled_token_ids.tolist()
        positions = np.flatnonzero(sample_mask)
        lists = out.logprobs.tolists() if out.logprobs is not None else None
        for i, (row, pos) in enumerate(zip(sample_rows.tolist(), positions.tolist())):
            self.batch.append_token(row, tokens[i])
            sampled[pos] = [tokens[i]]
            req_id = self.batch.req_ids[row]
            n = self.batch.states[req_id].sampling_params.logprobs
            if lists is not None and n is not None:
                logprobs[req_id] = LogprobsLists(lists.token_ids[i : i + 1, : n + 1],
                                                 lists.logprobs[i : i + 1, : n + 1],
                                                 lists.ranks[i : i + 1])

    def _apply_grammar(self, logits: torch.Tensor, sample_rows: np.ndarray,
                       so: SchedulerOutput) -> None:
        """Forbid, in each constrained request's row, the tokens its grammar rejects."""
        if so.grammar_bitmask is None:
            return
        logits_req_ids = [self.batch.req_ids[r] for r in sample_rows.tolist()]
        mask_rows, logits_rows = grammar_rows(logits_req_ids, so.structured_output_request_ids)
        apply_grammar_bitmask(logits, so.grammar_bitmask[mask_rows], logits_rows)

    # -- persistent batch ---------------------------------------------------------------
    def _request_state(self, new: NewRequestData) -> CachedRequestState:
        """A new request's state: its generator, its prompt embeddings on the device."""
        return CachedRequestState(
            req_id=new.req_id,
            prompt_token_ids=list(new.prompt_token_ids),
            sampling_params=new.sampling_params,
            output_token_ids=list(new.output_token_ids),
            generator=new_generator(new.sampling_params, self.device),
            block_ids=list(new.block_ids),
            group_block_ids=[list(ids) for ids in new.group_block_ids],
            state_slot=new.state_slot,
            lora=new.lora,
            prompt_embeds=(None if new.prompt_embeds is None else torch.tensor(
                new.prompt_embeds, dtype=self.model.dtype, device=self.device)),
        )

    # -- sampling -----------------------------------------------------------------------
    def sampling_metadata(self, rows: np.ndarray,
                          output_token_ids: list[list[int]] | None = None) -> SamplingMetadata:
        """The sampling settings of batch ``rows``; public for the speculative verifier,
        whose ``output_token_ids`` override the rows' outputs (drafts being verified)."""
        states = [self.batch.states[self.batch.req_ids[r]] for r in rows.tolist()]
        params = [s.sampling_params for s in states]
        arrays = SamplingArrays(**{f.name: getattr(self.batch.sampling, f.name)[rows]
                                   for f in fields(SamplingArrays)})
        uses_penalties = any(p.repetition_penalty != 1.0 or p.presence_penalty
                             or p.frequency_penalty for p in params)
        return SamplingMetadata.from_arrays(
            arrays,
            len(rows),
            self.vocab_size,
            output_token_ids=(output_token_ids if output_token_ids is not None
                              else [s.output_token_ids for s in states]),
            generators={i: s.generator for i, s in enumerate(states) if s.generator},
            # A prompt of embeddings has no tokens to penalise (its ids are placeholders).
            prompt_token_ids=(padded_token_ids([[] if s.prompt_embeds is not None
                                                else s.prompt_token_ids for s in states],
                                               self.vocab_size, self.device)
                              if uses_penalties else None),
            logit_bias=[p.logit_bias for p in params],
            allowed_token_ids_mask=allowed_token_ids_mask(params, self.vocab_size, self.device),
            bad_words_token_ids=[p.bad_words_token_ids for p in params],
            min_tokens=min_tokens_rows(params, self.eos_token_ids),
            max_num_logprobs=max((p.logprobs for p in params if p.logprobs is not None),
                                 default=None),
            device=self.device,
        )
