"""``StructuredOutputsConfig``: how guided decoding compiles and keeps grammars."""

from __future__ import annotations

from dataclasses import dataclass

from octavo.config.errors import ConfigError
from octavo.config.parse import check_positive_ints

BACKENDS = ("xgrammar",)


@dataclass
class StructuredOutputsConfig:
    backend: str = "xgrammar"  # the grammar library (vLLM's structured_outputs_config.backend)
    max_cached_grammars: int = 256  # compiled grammars kept for reuse by their constraint
    compile_threads: int = 2  # threads compiling grammars beside the engine loop

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"structured_outputs_config: backend must be one of "
                              f"{', '.join(BACKENDS)}; got {self.backend!r}")
        check_positive_ints("structured_outputs_config: ",
                            max_cached_grammars=self.max_cached_grammars,
                            compile_threads=self.compile_threads)
