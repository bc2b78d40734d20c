"""``CompilationConfig``: ``-O`` / ``--compilation-config`` (vLLM's names), whether the model's
forward runs through ``torch.compile``.

``-O3`` (or ``-O '{"level": 3}'``) compiles; ``-O0``, the default, runs eager, and
``--enforce-eager`` overrides any level (as in vLLM). vLLM's levels 1-3 choose how Dynamo's
graphs are split for CUDA graphs; the CPU has no graphs to capture, so on the CPU every level
above 0 means the same: the whole forward compiled by Inductor's C++ backend, attention an
opaque op (``octavo.cpu.compile``). ``cache_dir``: Inductor's on-disk cache (default:
``inductor`` under Octavo's cache root), so a second run reuses the first one's compiled
kernels. ``inductor_compile_config``: options handed to Inductor as they are (vLLM's field;
e.g. ``{"freezing": true}``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo.config.errors import ConfigError
from octavo.config.parse import check_known_keys, parse_json_object

MAX_LEVEL = 3


@dataclass
class CompilationConfig:
    level: int = 0  # 0: eager; 1-3: torch.compile the forward
    cache_dir: str | None = None  # Inductor's cache; None: <cache root>/inductor
    inductor_compile_config: dict[str, Any] = field(default_factory=dict)  # torch.compile options

    def __post_init__(self) -> None:
        if isinstance(self.level, bool) or not isinstance(self.level, int) or not (
                0 <= self.level <= MAX_LEVEL):
            raise ConfigError(f"compilation_config: level must be an integer from 0 to "
                              f"{MAX_LEVEL}, got {self.level!r}")
        if not isinstance(self.inductor_compile_config, dict):
            raise ConfigError("compilation_config: inductor_compile_config must be a JSON "
                              f"object, got {self.inductor_compile_config!r}")

    @classmethod
    def parse(cls, value: str | int | dict[str, Any] | CompilationConfig | None
              ) -> CompilationConfig:
        """From ``-O``'s text (a level, ``3``, or JSON), an int, a dict or an instance;
        ``None`` (or empty text): eager."""
        if isinstance(value, CompilationConfig):
            return value
        if value is None or (isinstance(value, str) and not value.strip()):
            return cls()
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            return cls(level=int(value))
        keys = parse_json_object(value, "compilation_config")
        check_known_keys(keys, cls, "compilation_config")
        return cls(**keys)


def check_compilation_combinations(compilation: CompilationConfig, *, enforce_eager: bool,
                                   world_size: int, enable_lora: bool) -> None:
    """``-O`` is verified on one rank without LoRA (docs/architecture.md, Compiled model):
    refuse the rest at once, naming what to turn off, rather than fail inside a step."""
    if compilation.level == 0 or enforce_eager:
        return
    if world_size > 1:
        raise ConfigError("compilation_config (-O) runs on one rank only for now: use "
                          "tensor/pipeline/sequence parallel size 1, or -O0")
    if enable_lora:
        raise ConfigError("compilation_config (-O) does not run with enable_lora yet; "
                          "turn one of them off")
