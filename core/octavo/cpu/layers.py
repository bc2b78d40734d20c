"""The model layers that have a fused CPU kernel (``octavo.cpu.kernels``), switched onto it.

As with the Triton plugin's layers, :func:`use_cpu_layers` turns each portable ``RMSNorm``,
``RotaryEmbedding``, ``SiluAndMul``, ``LlamaMLP`` and ``MambaMixer`` of a built bf16 model
into the subclass below: the parameters and weight loading stay the portable layer's, and
``forward`` calls the kernel for the 2-D bf16 CPU tensors a decoder layer passes, falling
back to the portable code for anything else (Qwen3's per-head q/k norms, fp32 training
passes).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.cpu import kernels
from octavo.cpu.gemm import CpuGemm
from octavo.models.layers.activation import SiluAndMul
from octavo.models.layers.mamba import MambaMixer
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.rotary import RotaryEmbedding
from octavo.models.layers.switch import switch_layers
from octavo.models.llama import LlamaMLP


class CpuRMSNorm(RMSNorm):
    """With a residual, the sum is written into ``x`` (a fresh layer output) and returned
    as the next residual, so the add costs no allocation."""

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if x.dim() != 2 or not kernels.usable(x):
            return super().forward(x, residual)
        out = kernels.rms_norm(x, residual, self.weight, self.eps)
        return out if residual is None else (out, x)


class CpuRotaryEmbedding(RotaryEmbedding):
    """Rotates ``q`` and ``k`` in place (they are views of the fresh q/k/v projection)."""

    inv_freq: torch.Tensor

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
        lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        del lengths  # the plain frequencies do not depend on them
        if not kernels.usable(q, k) or q.stride(-1) != 1 or k.stride(-1) != 1:
            return super().forward(positions, q, k)
        cos, sin = self.cos_sin(positions, q.dtype)
        kernels.rope_(q, k, cos, sin)
        return q, k


class CpuSiluAndMul(SiluAndMul):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.stride(-1) != 1 or not kernels.usable(x):
            return super().forward(x)
        return kernels.silu_and_mul(x)


class CpuLlamaMLP(LlamaMLP):
    """The gate/up projection and SiLU-and-mul in one pass of the pair GEMM where it serves
    the projection (``CpuGemm.silu_and_mul``): the [T, 2 * intermediate] projection is never
    written out and read back (W1's prompt chunks: 25 MB a layer). Not in a step where the
    projection's method adds to the GEMM's product (a LoRA adapter's delta) before SiLU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gemm = self.gate_up_proj.cpu_gemm
        if (isinstance(gemm, CpuGemm) and type(self.act) is CpuSiluAndMul
                and not self.gate_up_proj.quant_method.adds_after_gemm()):
            act = gemm.silu_and_mul(x)
            if act is not None:
                return self.down_proj(act)
        return super().forward(x)


class CpuMambaMixer(MambaMixer):
    """Decode steps' selective scan in one pass over the states (``kernels.ssm_decode``)."""

    def _scan_step(self, state: torch.Tensor, rows: torch.Tensor, x: torch.Tensor,
                   dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        if not state.is_cpu or kernels.library() is None:
            return super()._scan_step(state, rows, x, dt, b, c)
        y = kernels.ssm_decode(state, rows, self.dims.d_conv - 1, x, dt, b, c,
                               -torch.exp(self.A_log.float()))
        return y.to(x.dtype)


CPU_LAYERS: dict[type[nn.Module], type[nn.Module]] = {
    RMSNorm: CpuRMSNorm,
    RotaryEmbedding: CpuRotaryEmbedding,
    SiluAndMul: CpuSiluAndMul,
    LlamaMLP: CpuLlamaMLP,
    MambaMixer: CpuMambaMixer,
}


def use_cpu_layers(model: nn.Module) -> int:
    """Switch ``model``'s portable layers onto their CPU kernels; returns how many. Nothing
    is switched when the kernels cannot be built here."""
    if kernels.library() is None:
        return 0
    return switch_layers(model, CPU_LAYERS)
