"""The engine: ``EngineCore`` (schedule, execute, update) and the parts it is built from
(``components``: names in the config resolved through the plugin registries), its process
and the clients that talk to it, the ``Processor`` and ``OutputProcessor`` around it, the
offline ``LLM`` and the online ``AsyncLLM``. Imports the plugin system and everything below;
nothing above (entrypoints, bench)."""
