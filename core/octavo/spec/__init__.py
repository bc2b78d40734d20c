"""Speculative decoding in the core: the configuration, the ``Proposer`` interface that
plugins implement, the rejection sampler that verifies drafts, and acceptance statistics.
The proposers themselves (n-gram, draft model, Medusa, EAGLE) live in octavo-spec-decode."""
