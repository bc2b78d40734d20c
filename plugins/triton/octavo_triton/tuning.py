"""Launch parameters of the kernels, per kind of GPU.

The values differ between vendors (NVIDIA warps are 32 lanes, AMD CDNA wavefronts 64, and
AMD's compiler prefers fewer pipeline stages), so each GPU platform carries its own
``KernelTuning`` and its worker makes it the active one for the process with
:func:`set_tuning` before the model runs. A process runs on one platform, which is why
one process-wide setting is enough; the launchers read it with :func:`active_tuning`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KernelTuning:
    name: str
    attention_warps: int = 4
    attention_stages: int = 2
    # Query rows (query tokens x the query heads of one kv head) per attention program.
    # tl.dot needs at least 16; steps with prompt chunks use larger tiles than pure decodes.
    prefill_block_m: int = 64
    decode_block_m: int = 16
    # Decode-only steps with fewer (request, kv head) programs than this split each
    # context into ``split_kv_segments`` parts so that long contexts keep the GPU busy.
    split_kv_max_programs: int = 128
    split_kv_segments: int = 16  # a power of two
    split_kv_min_seq_len: int = 512
    elementwise_warps: int = 4
    # Element-wise kernels (norms, rotary, cache writes) give each program this many
    # elements (a power of two), i.e. several rows when rows are short.
    elementwise_elements: int = 4096
    # Compiler options only one vendor's backend knows (e.g. AMD's waves_per_eu).
    extra_options: dict[str, int] = field(default_factory=dict)

    def attention_block_m(self, decode_only: bool, group: int, dim_pad: int) -> int:
        """Rows of an attention tile: at least one kv head's query heads, and prompt tiles
        no larger than 8192 accumulator values (64 x 128), so that head dims of 256 do not
        spill registers."""
        rows = self.decode_block_m if decode_only else min(self.prefill_block_m,
                                                           max(16, 8192 // dim_pad))
        return max(rows, 1 << (group - 1).bit_length())  # the next power of two

    def rows_per_program(self, row_elements: int) -> int:
        """Rows an element-wise program takes when each row has ``row_elements`` (a power
        of two): one for long rows, several for short ones."""
        return max(1, self.elementwise_elements // row_elements)

    def attention_launch(self) -> dict[str, int]:
        """Keyword arguments of an attention kernel launch."""
        return {"num_warps": self.attention_warps, "num_stages": self.attention_stages,
                **self.extra_options}


DEFAULT_TUNING = KernelTuning(name="default")

_active = DEFAULT_TUNING


def set_tuning(tuning: KernelTuning) -> None:
    """Make ``tuning`` the launch parameters of every kernel launched by this process."""
    global _active
    _active = tuning


def active_tuning() -> KernelTuning:
    return _active

