"""The built-in CPU backend, all in one place: the platform (``platform``), the fused bf16 C
kernels (``cpu_ops.c``, ``cpu_attention.c``, compiled on first use by ``kernels``), the
layers switched onto them (``layers``), the prepacked GEMMs (``gemm``) and the attention
backend that decodes with them (``attention``). Imports the models' portable layers and the
torch attention backend that it specialises; nothing above them."""
