"""Speculative decoding, the parts both sides share: the draft tree (``tree``) and the
rejection sampler (``rejection``). The config is ``octavo.config.speculative``, the
scheduler side ``octavo.sched.spec_decode``, the worker side (proposer interface, verifier)
``octavo.worker.spec_decode``; the proposers themselves (n-gram, draft model, Medusa, EAGLE) live
in octavo-spec-decode. Imports sampling, config and the plain data."""
