"""Models: the layers (``layers``), the Llama family and Mixtral, the built-in architecture
table, the loaders (HF folder, GGUF with its conversion cache) and ``build_model``. Imports
attention (the layers call a backend), config and the plain data; no registry - the engine
passes the registered architectures in."""
