"""Executors: how an engine's workers run - in the engine core's process (``uni``), one
process per rank (``mp``) or one Ray actor per rank (``ray``); ``ranks.py`` holds what the
last two share."""
