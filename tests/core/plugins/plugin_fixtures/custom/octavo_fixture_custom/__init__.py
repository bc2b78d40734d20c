"""A plugin replacing the scheduler and the KV-cache manager, chosen by config."""
