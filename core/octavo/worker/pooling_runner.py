"""``PoolingModelRunner``: the model runner of ``--runner pooling`` (vLLM's name).

Its requests sample nothing: each step runs the model over the scheduled tokens, as the
generation runner does, and every request whose prompt is complete after the step gets
its prompt's hidden states pooled (``octavo.models.pooler``) into
``ModelRunnerOutput.pooler_output``. No logits, no sampler. A decoder keeps its paged KV
cache (a LAST-pooled prompt may come in chunks); an encoder (``CausalLM.encoder_only``)
has none. Kept apart from ``ModelRunner``'s step, so generation pays nothing for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from octavo.models.pooler import pool
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.worker.model_runner import ModelRunner
from octavo.worker.step_inputs import prepare_step


class PoolingModelRunner(ModelRunner):
    def __init__(self, *args: Any, pooling_type: str, **kwargs: Any) -> None:
        """``pooling_type``: CLS, MEAN or LAST (``PoolerConfig``, resolved)."""
        super().__init__(*args, **kwargs)
        self.pooling_type = pooling_type
        if self.model.encoder_only:
            self.kv_tensor_index = []  # no KV cache: kv_cache_bytes_per_block() is 0

    def _execute_step(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        if not scheduler_output.total_num_scheduled_tokens:
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[])
        step = prepare_step(self.batch, scheduler_output.num_scheduled_tokens, self.block_size,
                            self.device, rope_lengths=self.model.uses_rope_lengths)
        hidden = self.run_model(step)
        assert hidden is not None, "the pooling runner runs one pipeline stage"
        starts = step.metadata.query_start_loc_cpu
        assert starts is not None  # prepare_step always fills the host copy
        return ModelRunnerOutput(
            req_ids=[self.batch.req_ids[r] for r in step.rows],
            sampled_token_ids=[[] for _ in step.rows],
            pooler_output=pool(hidden, starts.numpy().astype(np.int64), step.sample_mask,
                               self.pooling_type),
        )
