"""Sampling on the worker: the batched sampler, its logits processors (penalties, top-k /
top-p, bad words, min tokens) and logprobs. ``SamplingParams`` itself is plain data in
``octavo.sampling_params``. Imports the plain data and torch only."""
