"""NKI kernels of the Neuron platform, written against ``octavo_neuron.nki`` only (the real
NKI on a Neuron host, the emulator elsewhere), each with a torch wrapper for the worker."""

from .activation import silu_and_mul
from .attention import paged_attention
from .kv_cache import write_kv
from .rms_norm import rms_norm
from .rotary import rotary_embedding

__all__ = ["paged_attention", "rms_norm", "rotary_embedding", "silu_and_mul", "write_kv"]
