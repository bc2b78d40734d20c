"""Paged KV-cache bookkeeping: blocks, the free-block queue, prefix hashes, KVCacheManager."""
