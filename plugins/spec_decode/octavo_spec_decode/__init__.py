"""Speculative-decoding proposers for Octavo: n-gram, draft model, EAGLE, Medusa."""
