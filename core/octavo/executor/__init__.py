"""Executors: how an engine's workers run (in process, one process per rank)."""
