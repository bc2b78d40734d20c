"""The engine: ``EngineCore`` (schedule, execute, update), the ``Processor`` and
``OutputProcessor`` around it, and the offline ``LLM``."""
