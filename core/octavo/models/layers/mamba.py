"""The Mamba mixer (Jamba's SSM layer, HF ``JambaMambaMixer``), over a per-request state.

Each token goes through: ``in_proj`` to ``x`` and a gate ``z``; a causal depthwise
convolution over ``x`` (kernel ``d_conv``) and SiLU; ``x_proj`` to the time step, ``B`` and
``C`` (each RMS-normalised, Jamba's difference from Mamba); ``dt = softplus(dt_proj(time
step))``; the selective scan ``s = exp(A dt) s + dt B x``, ``y = s C + D x``; ``y * silu(z)``
through ``out_proj``.

A request's state lives in row ``slot`` of the layer's state tensor (fp32, ``[slots,
inner, d_conv - 1 + d_state]``): the convolution's last ``d_conv - 1`` inputs, then the
scan's state. A request's first chunk (nothing computed before it) starts from zeros, as HF
starts every prompt; a later chunk (chunked prefill) or a decode step continues from the
row, so a prompt split anywhere computes what one pass computes. Decode rows of a step are
updated together; prompt chunks one request at a time, the scan a token at a time in fp32
(HF's sequential reference scan; there is no parallel scan here).

Tensor parallelism splits ``inner`` (the convolution's channels, ``A``, ``D``, ``dt_proj``'s
outputs, the state); ``x_proj`` sums the ranks' partial products, as vLLM's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.attention.base import AttentionMetadata
from octavo.models.config_parts import MambaDims
from octavo.models.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    RowParallelLinear,
)
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.parallel import check_divisible, resolve_tp
from octavo.models.layers.weights import copy_shard, new_parameter


def state_shape(dims: MambaDims, num_slots: int, tp_size: int) -> tuple[int, int, int]:
    """One layer's state tensor on a rank: per slot, the convolution's last inputs and the
    scan's state for this rank's channels."""
    inner = check_divisible("mamba inner channels", dims.inner, tp_size)
    return (num_slots, inner, dims.d_conv - 1 + dims.d_state)


class ConvWeights(nn.Module):
    """HF's ``nn.Conv1d`` parameters under its names (``conv1d.weight [inner, 1, d_conv]``,
    ``conv1d.bias``), this rank's channels: the mixer convolves with them itself."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias


class MambaMixer(nn.Module):
    def __init__(self, dims: MambaDims, eps: float) -> None:
        super().__init__()
        self.dims = dims
        self.tp_rank, self.tp_size = resolve_tp(None, None)
        self.inner = check_divisible("mamba inner channels", dims.inner, self.tp_size)
        self.in_proj = MergedColumnParallelLinear(dims.hidden_size, [dims.inner, dims.inner],
                                                  bias=dims.proj_bias)
        self.conv1d = ConvWeights(
            new_parameter(self.inner, 1, dims.d_conv, weight_loader=self._channel_loader),
            new_parameter(self.inner, weight_loader=self._channel_loader)
            if dims.conv_bias else None)
        self.x_proj = RowParallelLinear(dims.inner, dims.dt_rank + 2 * dims.d_state)
        self.dt_proj = ColumnParallelLinear(dims.dt_rank, dims.inner, bias=True)
        self.A_log = new_parameter(self.inner, dims.d_state, weight_loader=self._channel_loader)
        self.D = new_parameter(self.inner, weight_loader=self._channel_loader)
        self.out_proj = RowParallelLinear(dims.inner, dims.hidden_size, bias=dims.proj_bias)
        self.dt_layernorm = RMSNorm(dims.dt_rank, eps)
        self.b_layernorm = RMSNorm(dims.d_state, eps)
        self.c_layernorm = RMSNorm(dims.d_state, eps)

    def _channel_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        """Per-channel tensors: this rank's channels (dim 0)."""
        copy_shard(param.data, loaded, 0, self.tp_rank, self.tp_size)

    def forward(self, hidden: torch.Tensor, state: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        """``hidden [T, hidden_size]`` of the step's requests (laid out as in the metadata)
        -> ``[T, hidden_size]``, each request's state row updated."""
        num_tokens = metadata.num_actual_tokens
        x, z = self.in_proj(hidden[:num_tokens]).split(self.inner, dim=-1)
        assert metadata.state_slots is not None, "a model with SSM layers needs state slots"
        starts = _host(metadata.query_start_loc_cpu, metadata.query_start_loc)
        seq_lens = _host(metadata.seq_lens_cpu, metadata.seq_lens)
        slots = metadata.state_slots.tolist()
        out = torch.empty_like(x)
        decode_rows = [r for r in range(metadata.num_reqs)
                       if starts[r + 1] - starts[r] == 1 and seq_lens[r] > 1]
        if decode_rows:
            tokens = torch.tensor([int(starts[r]) for r in decode_rows], device=x.device)
            rows = torch.tensor([slots[r] for r in decode_rows], device=x.device)
            out[tokens] = self._decode(x[tokens], z[tokens], state, rows)
        decoding = set(decode_rows)
        for r in range(metadata.num_reqs):
            if r in decoding:
                continue
            start, end = int(starts[r]), int(starts[r + 1])
            fresh = int(seq_lens[r]) == end - start  # nothing of it computed before
            out[start:end] = self._chunk(x[start:end], z[start:end], state, slots[r], fresh)
        result = self.out_proj(out)
        if result.shape[0] < hidden.shape[0]:  # padding tokens a runner may add
            result = torch.cat([result, result.new_zeros(hidden.shape[0] - num_tokens,
                                                         result.shape[1])])
        return result

    def _ssm_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``dt`` (fp32, after softplus), ``B`` and ``C`` of convolved inputs ``x [n, inner]``."""
        d = self.dims
        time_step, b, c = self.x_proj(x).split([d.dt_rank, d.d_state, d.d_state], dim=-1)
        time_step = self.dt_layernorm(time_step)
        dt = F.linear(time_step, self.dt_proj.weight)  # HF adds the bias in fp32, below
        bias = self.dt_proj.bias
        assert bias is not None  # built with one
        dt = F.softplus(dt + bias.float())
        return dt, self.b_layernorm(b), self.c_layernorm(c)

    def _conv(self, window: torch.Tensor) -> torch.Tensor:
        """The causal convolution's outputs ``[n, inner]`` for inputs ``window [n + d_conv
        - 1, inner]`` (the earlier inputs first), SiLU applied."""
        weight = self.conv1d.weight
        out = F.conv1d(window.t()[None].to(weight.dtype), weight, self.conv1d.bias,
                       groups=self.inner)[0].t()
        return F.silu(out)

    def _chunk(self, x: torch.Tensor, z: torch.Tensor, state: torch.Tensor, slot: int,
               fresh: bool) -> torch.Tensor:
        """One request's chunk of ``n`` tokens through the convolution and the scan."""
        d, dtype = self.dims, x.dtype
        row = state[slot]
        if fresh:
            row.zero_()
        conv_state, ssm_state = row[:, :d.d_conv - 1], row[:, d.d_conv - 1:]
        window = torch.cat([conv_state.t().to(dtype), x])
        x = self._conv(window)
        conv_state.copy_(window[window.shape[0] - (d.d_conv - 1):].t())
        dt, b, c = self._ssm_inputs(x)
        a = -torch.exp(self.A_log.float())
        decay = torch.exp(a[None] * dt[:, :, None])  # [n, inner, d_state]
        drive = dt[:, :, None] * b[:, None, :].float() * x[:, :, None].float()
        s = ssm_state.clone()
        ys = []
        for t in range(x.shape[0]):
            s = decay[t] * s + drive[t]
            ys.append(torch.matmul(s.to(dtype), c[t]))
        ssm_state.copy_(s)
        y = torch.stack(ys) + x * self.D
        return y * F.silu(z)

    def _decode(self, x: torch.Tensor, z: torch.Tensor, state: torch.Tensor,
                rows: torch.Tensor) -> torch.Tensor:
        """One token for each of ``B`` requests whose state rows are ``rows``, together."""
        d, dtype = self.dims, x.dtype
        conv_states = state[rows, :, :d.d_conv - 1]  # [B, inner, d_conv - 1]
        window = torch.cat([conv_states.to(dtype), x[:, :, None]], dim=-1)
        weight = self.conv1d.weight[:, 0, :]  # [inner, d_conv]
        conv = (window * weight).sum(-1)
        if self.conv1d.bias is not None:
            conv = conv + self.conv1d.bias
        x = F.silu(conv)
        state[rows, :, :d.d_conv - 1] = window[:, :, 1:].float()
        dt, b, c = self._ssm_inputs(x)
        y = self._scan_step(state, rows, x, dt, b, c).to(dtype) + x * self.D
        return y * F.silu(z)

    def _scan_step(self, state: torch.Tensor, rows: torch.Tensor, x: torch.Tensor,
                   dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """One scan step of ``B`` requests: their scan states (in ``state``'s ``rows``)
        advanced by ``x``, ``dt`` [B, inner], ``b``, ``c`` [B, d_state]; returns the states
        times ``c`` [B, inner]. A device's subclass runs it on a kernel (the CPU's:
        ``octavo.cpu.layers.CpuMambaMixer``)."""
        offset = self.dims.d_conv - 1
        a = -torch.exp(self.A_log.float())
        s = (state[rows, :, offset:] * torch.exp(dt[:, :, None] * a)
             + dt[:, :, None] * b[:, None, :].float() * x[:, :, None].float())
        state[rows, :, offset:] = s
        return torch.matmul(s.to(x.dtype), c[:, :, None])[:, :, 0]


def _host(host_copy: torch.Tensor | None, device_tensor: torch.Tensor) -> list[int]:
    return (device_tensor.cpu() if host_copy is None else host_copy).tolist()
