"""Rotary position embedding, "neox" style (rotate halves) as HF Llama, with the frequency
scalings HF defines: ``linear``, ``llama3``, ``yarn``, ``longrope`` and ``dynamic`` (NTK).

cos/sin are computed from the positions on the fly in fp32, with the same arithmetic as HF,
so positions have no upper bound and results match HF bit for bit in fp32.

``RotaryEmbedding`` is the plain kind - every dim rotated by fixed frequencies - which is all
the platforms' fused kernels take (they read ``inv_freq``). ``ScaledRotaryEmbedding`` adds
what those kernels do not do, so it stays on this portable code everywhere (layers are
switched by exact class): an attention factor on cos/sin (yarn, longrope), a rotated share
of each head (``partial_rotary_factor``), and frequencies that depend on the length of the
token's sequence (longrope, dynamic).

Length-dependent scalings: HF picks the frequencies of a whole forward pass from its longest
position (``seq_len = max(position_ids) + 1``) - in a generation, the prompt's length for
the prompt and ``p + 1`` for the token decoded at position ``p``. Here each token gets
``max(prompt length, p + 1)`` (``AttentionMetadata.rope_lengths``), which is exactly that,
however the prompt is chunked or the request preempted and recomputed.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from octavo.models.config_rope import RopeConfig


def rotary_dim(head_dim: int, rope: RopeConfig) -> int:
    """How many leading dims of each head are rotated (HF: ``int(head_dim * factor)``)."""
    return int(head_dim * rope.partial_rotary_factor)


def rope_inv_freq(dim: int, rope: RopeConfig, seq_len: int | None = None) -> torch.Tensor:
    """Inverse frequencies ``[dim / 2]`` (fp32) for the rope type of ``rope``, rotating
    ``dim`` dims; ``seq_len`` only matters to longrope and dynamic (None: their frequencies
    for the original context)."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if rope.rope_type == "longrope":
        long = seq_len is not None and seq_len > rope.original_max_position_embeddings
        factors = torch.tensor(rope.long_factor if long else rope.short_factor)
        return 1.0 / (factors * rope.theta ** exponents)
    if rope.rope_type == "dynamic" and seq_len is not None:
        return 1.0 / (_dynamic_base(rope, dim, torch.tensor([seq_len]))[0] ** exponents)
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaled(inv_freq, rope)
    if rope.rope_type == "yarn":
        return _yarn_scaled(dim, rope)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by ``factor``, blend in between."""
    old_context = rope.original_max_position_embeddings
    low_freq_wavelen = old_context / rope.low_freq_factor
    high_freq_wavelen = old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_scaled(dim: int, rope: RopeConfig) -> torch.Tensor:
    """YaRN: frequencies that turn fewer than ``beta_slow`` times over the original context
    are interpolated (divided by ``factor``), those turning more than ``beta_fast`` times
    kept, a linear ramp between (HF's ``_compute_yarn_parameters``)."""
    base, context = rope.theta, rope.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (rope.factor * pos_freqs)) * (1 - extrapolation) \
        + (1.0 / pos_freqs) * extrapolation


def _dynamic_base(rope: RopeConfig, dim: int, seq_lens: torch.Tensor) -> torch.Tensor:
    """Dynamic NTK: the RoPE base for sequences of ``seq_lens`` (int64 ``[N]``) tokens, in
    fp32 as HF computes it from a length tensor; the original base up to max_position."""
    lengths = torch.maximum(seq_lens, torch.tensor(rope.max_position_embeddings))
    scale = rope.factor * lengths / rope.max_position_embeddings - (rope.factor - 1)
    return rope.theta * scale ** (dim / (dim - 2))


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(scale) + 1`` (1 for no scaling)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_attention_factor(rope: RopeConfig) -> float:
    """What cos and sin are multiplied by: yarn's and longrope's attention factor (HF's
    ``attention_scaling``), 1 for the other scalings."""
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.rope_type == "yarn":
        if rope.mscale and rope.mscale_all_dim:
            return yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor,
                                                                      rope.mscale_all_dim)
        return yarn_mscale(rope.factor)
    if rope.rope_type == "longrope" and rope.factor > 1.0:
        return math.sqrt(1 + math.log(rope.factor)
                         / math.log(rope.original_max_position_embeddings))
    return 1.0


def rotary_embedding(head_dim: int, rope: RopeConfig, neox_style: bool = True,
                     ) -> RotaryEmbedding:
    """The rotary embedding for ``rope``: the plain kind where it computes it.
    ``neox_style`` False rotates adjacent pairs of dims instead of halves (GPT-J's, and
    DeepSeek's complex-number form; vLLM's name)."""
    plain = (rotary_dim(head_dim, rope) == head_dim and not rope.length_dependent
             and rope_attention_factor(rope) == 1.0 and neox_style)
    return (RotaryEmbedding(head_dim, rope) if plain
            else ScaledRotaryEmbedding(head_dim, rope, neox_style))


class RotaryEmbedding(nn.Module):
    """Applies rotary embeddings to ``q [T, heads, head_dim]`` and ``k [T, kv_heads, head_dim]``
    at ``positions [T]``.

    One instance serves every layer of a model: cos/sin depend only on the positions, so they
    are computed once per forward pass (for the first layer) and reused by the others.
    """

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, rope: RopeConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(rotary_dim(head_dim, rope), rope),
                             persistent=False)
        self._cached: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def angles(self, positions: torch.Tensor, lengths: torch.Tensor | None,
               ) -> torch.Tensor:
        """Each position's rotation angles ``[T, rotated dims / 2]`` (fp32)."""
        del lengths  # the plain frequencies do not depend on them
        return positions[:, None].float() * self.inv_freq

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype,
                lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and the signed ``sin`` (``-sin`` on the first half) ``[T, 1, rotated
        dims]`` in ``dtype``: ``x * cos + roll(x, dims / 2) * sin`` is HF's rotate-half
        formula. ``lengths``: see ``forward``. Traced by ``torch.compile`` (``-O``), the
        whole forward is one graph, whose compiler computes them once itself: no cache,
        which would be state the graph had to guard on."""
        if torch.compiler.is_compiling():
            return self._cos_sin(positions, dtype, lengths)
        cached = self._cached
        if cached is not None and cached[0] is positions and cached[1] == dtype:
            return cached[2], cached[3]
        cos, sin = self._cos_sin(positions, dtype, lengths)
        self._cached = (positions, dtype, cos, sin)
        return cos, sin

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype,
                 lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = self.angles(positions, lengths)
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, rotated dims]
        cos, sin = self.scale_cos_sin(angles.cos(), angles.sin())
        half = sin.shape[-1] // 2
        sin[..., :half].neg_()
        return cos.to(dtype), sin.to(dtype)

    def scale_cos_sin(self, cos: torch.Tensor, sin: torch.Tensor,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos/sin as HF multiplies them by its attention factor (none here)."""
        return cos, sin

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
        lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``lengths``: each token's ``AttentionMetadata.rope_lengths``, which only the
        length-dependent scalings read (None elsewhere)."""
        cos, sin = self.cos_sin(positions, q.dtype, lengths)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` with its first ``cos.shape[-1]`` dims rotated, the rest passed through."""
    dims = cos.shape[-1]
    if dims == x.shape[-1]:
        return x * cos + x.roll(dims // 2, dims=-1) * sin
    rotated, passed = x[..., :dims], x[..., dims:]
    return torch.cat((rotated * cos + rotated.roll(dims // 2, dims=-1) * sin, passed), dim=-1)


class ScaledRotaryEmbedding(RotaryEmbedding):
    """The scalings the fused kernels do not compute (module docstring): cos/sin times the
    attention factor, a partial rotation, length-dependent frequencies, and pairs of
    adjacent dims rotated (``neox_style`` False) - in fp32, as HF's complex-number form."""

    long_inv_freq: torch.Tensor

    def __init__(self, head_dim: int, rope: RopeConfig, neox_style: bool = True) -> None:
        super().__init__(head_dim, rope)
        self.rope = rope
        self.neox_style = neox_style
        self.dim = rotary_dim(head_dim, rope)
        self.attention_factor = rope_attention_factor(rope)
        # longrope's frequencies past the original context (its short ones are inv_freq).
        long = rope_inv_freq(self.dim, rope, rope.original_max_position_embeddings + 1)
        self.register_buffer("long_inv_freq", long, persistent=False)

    def angles(self, positions: torch.Tensor, lengths: torch.Tensor | None,
               ) -> torch.Tensor:
        if not self.rope.length_dependent:
            return super().angles(positions, lengths)
        if lengths is None:
            raise ValueError(f"{self.rope.rope_type} RoPE needs each token's sequence length "
                             "(AttentionMetadata.rope_lengths), which this step lacks")
        past = (lengths > self.rope.original_max_position_embeddings
                if self.rope.rope_type == "longrope"
                else lengths > self.rope.max_position_embeddings)
        if self.rope.rope_type == "longrope":
            inv_freq = torch.where(past[:, None], self.long_inv_freq, self.inv_freq)
        else:  # dynamic: each length's own base, the original one up to max_position
            exponents = torch.arange(0, self.dim, 2, dtype=torch.int64,
                                     device=positions.device).float() / self.dim
            scaled = 1.0 / (_dynamic_base(self.rope, self.dim, lengths)[:, None] ** exponents)
            inv_freq = torch.where(past[:, None], scaled, self.inv_freq)
        return positions[:, None].float() * inv_freq

    def scale_cos_sin(self, cos: torch.Tensor, sin: torch.Tensor,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.attention_factor == 1.0:
            return cos, sin
        return cos * self.attention_factor, sin * self.attention_factor

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
        lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.neox_style:
            return super().forward(positions, q, k, lengths)
        angles = self.angles(positions, lengths)[:, None, :]  # [T, 1, rotated dims / 2]
        cos, sin = self.scale_cos_sin(angles.cos(), angles.sin())
        return _rotate_pairs(q, cos, sin), _rotate_pairs(k, cos, sin)


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` with each pair of dims ``(2i, 2i + 1)`` of its first ``2 * cos.shape[-1]``
    rotated by angle ``i``, in fp32 (HF: ``x`` as complex numbers times ``cos + i sin``)."""
    dims = 2 * cos.shape[-1]
    pairs = x[..., :dims].float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    rotated = rotated.flatten(-2).to(x.dtype)
    return rotated if dims == x.shape[-1] else torch.cat((rotated, x[..., dims:]), dim=-1)
