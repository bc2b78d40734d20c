"""``GpuModelRunner``: the core's model runner plus what a GPU adds - a profiling run to
size the KV cache, and CUDA graphs replayed for decode steps (see ``cuda_graphs.py``)."""

from __future__ import annotations

import torch

from octavo.plugin_api import IntermediateTensors, ModelRunner, StepInputs
from octavo_triton.cuda_graphs import DecodeGraphs
from octavo_triton.memory_profile import profile_step


class GpuModelRunner(ModelRunner):
    graphs: DecodeGraphs | None = None  # None: every step runs eagerly

    @torch.inference_mode()
    def profile_run(self, max_num_batched_tokens: int, max_num_seqs: int,
                    max_model_len: int) -> None:
        """One forward pass of the largest possible step, and the logits of as many rows as
        a step can sample, on a one-block KV cache: the activation peak of serving."""
        step = profile_step(max_num_batched_tokens, max_num_seqs, max_model_len,
                            self.block_size, self.device)
        model = self.model
        shape = self.attn_backend.kv_cache_shape(1, self.block_size, model.num_kv_heads,
                                                 model.head_dim)
        cache = torch.zeros(shape, dtype=model.dtype, device=self.device)
        caches = [cache] * model.num_layers
        if model.ranks.pp_size > 1:  # a stage: its layers on stand-in hidden states
            size = (step.input_ids.shape[0], model.config.hidden_size)
            stand_in = torch.randn(size, dtype=model.dtype, device=self.device)
            hidden = model(step.input_ids, step.positions, caches, step.metadata,
                           None if model.ranks.is_first_stage
                           else IntermediateTensors(stand_in, stand_in))
            if isinstance(hidden, IntermediateTensors):
                return  # a stage before the last has no LM head
        else:
            hidden = model(step.input_ids, step.positions, caches, step.metadata)
        rows = torch.arange(step.num_sampled, device=self.device) % hidden.shape[0]
        torch.softmax(model.compute_logits(hidden[rows]), dim=-1)

    def capture_graphs(self, sizes: list[int], max_model_len: int) -> None:
        graphs = DecodeGraphs(self.model, self.kv_caches, sizes,
                              self.batch.block_table.shape[1], max_model_len, self.device)
        graphs.capture()
        self.graphs = graphs

    def run_model(self, step: StepInputs) -> torch.Tensor | None:
        if self.graphs is not None and self.graphs.fits(step):  # none on pipeline stages
            return self.graphs.run(step)
        return super().run_model(step)
