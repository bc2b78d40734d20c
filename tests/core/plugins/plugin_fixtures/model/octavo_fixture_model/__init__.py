"""A plugin registering a model architecture of its own (vLLM's #18740 as a test: an
out-of-tree model must load in every worker process, not only in the engine's)."""
