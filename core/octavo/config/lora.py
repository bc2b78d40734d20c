"""``LoRAConfig``: multi-LoRA serving (vLLM's ``--enable-lora`` and its limits)."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.config.errors import ConfigError
from octavo.config.parse import check_positive_ints


@dataclass
class LoRAConfig:
    enable_lora: bool = field(default=False, metadata={
        "help": "Serve LoRA adapters (PEFT format) on the base model: see docs/lora.md."})
    max_loras: int = field(default=1, metadata={
        "help": "Most distinct LoRA adapters in one step (adapter slots on each worker)."})
    max_lora_rank: int = field(default=16, metadata={
        "help": "Highest adapter rank accepted; the slots are this wide."})
    max_cpu_loras: int | None = field(default=None, metadata={
        "help": "Adapters kept loaded in host memory (least recently used dropped first); "
                "default and minimum: max_loras."})

    def __post_init__(self) -> None:
        check_positive_ints("", max_loras=self.max_loras, max_lora_rank=self.max_lora_rank)
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        if self.max_cpu_loras < self.max_loras:
            raise ConfigError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least "
                              f"max_loras ({self.max_loras})")
