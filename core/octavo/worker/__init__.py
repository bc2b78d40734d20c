"""The worker side of the engine: ``Worker`` (one device: load, size the KV cache, step),
``ModelRunner`` with its persistent input batch and step inputs, and the worker side of each
feature - speculative decoding (``spec_decode``: proposers, verification), KV transfer
(``kv_transfer``), guided decoding (``grammar_bitmask``). Imports the features, the CPU
backend's interfaces and the layers below; never the scheduler or a registry (its classes
come resolved, ``WorkerClasses``)."""
