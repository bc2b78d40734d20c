"""Paged KV-cache bookkeeping on the scheduler side: blocks, the free-block queue, the block
pool with its prefix cache, and ``KVCacheManager`` (the default ``KVCacheManagerInterface``,
the coordinator of one full-attention group); for models with KV groups (sliding-window
layers), the specs, the per-group managers and ``KVCacheCoordinator``.
Imports the plain data below it (requests, block hashes, stats) and nothing else."""
