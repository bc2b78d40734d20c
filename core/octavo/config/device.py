"""``DeviceConfig``: which platform (``--backend``) and attention backend run the model, and
whether devices may capture graphs."""

from __future__ import annotations

from dataclasses import dataclass, field

# Platforms whose plugin distributions the project ships (for help texts and install hints);
# the user-facing name is the --backend flag.
PLATFORM_CHOICES = ("auto", "cpu", "cuda", "rocm", "tpu", "neuron")


@dataclass
class DeviceConfig:
    backend: str = field(default="auto", metadata={
        "help": "Hardware backend: " + "|".join(PLATFORM_CHOICES)
                + " or a plugin's own name; 'auto' picks the best available."})
    attention_backend: str | None = field(default=None, metadata={
        "help": "Attention backend name (default: the platform's)."})
    enforce_eager: bool = field(default=False, metadata={"help": "Devices: no graph capture."})
