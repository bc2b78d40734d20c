"""The CPU worker's memory (``octavo.cpu.allocator``): memory of a large block that one layer
frees serves the next layer's tensors without the kernel faulting its pages in again, and
the packed weights' arena hands out aligned tensors on huge pages."""

from __future__ import annotations

import gc
import resource
import time
from pathlib import Path

import pytest
import torch

from octavo.cpu.allocator import ARENA_ALIGN, HugePageArena, keep_freed_memory

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
THP_MODE = THP_SETTING.read_text() if THP_SETTING.exists() else ""

BLOCK_BYTES = 64 * 2**20  # above glibc's largest dynamic mmap threshold (32 MiB)
PAGE_BYTES = 4096


def page_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_freed_memory_serves_the_next_block_without_page_faults() -> None:
    assert keep_freed_memory()  # glibc here
    first = torch.empty(BLOCK_BYTES, dtype=torch.uint8)
    first.fill_(1)
    del first
    before = page_faults()
    second = torch.empty(BLOCK_BYTES * 3 // 4, dtype=torch.uint8)
    second.fill_(2)
    # Served by a fresh mmap, as glibc's default does, it would fault once per page: 12288
    # times.
    assert page_faults() - before < BLOCK_BYTES // PAGE_BYTES // 20


def _huge_page_kib(address: int) -> int:
    """AnonHugePages of the mapping of this process that holds ``address``."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return 0


def test_the_weight_arena_hands_out_aligned_tensors_that_keep_their_memory() -> None:
    arena = HugePageArena(segment_bytes=8 * 2**20)
    gen = torch.Generator().manual_seed(int(time.time()))
    # (5 * 2**20,): 10 MiB, more than a segment, gets a mapping of its own
    shapes = [(3, 5, 7), (1000, 64), (5 * 2**20,), (17,), (2**20, 3)]
    made = []
    for shape in shapes:
        tensor = arena.empty(shape, torch.bfloat16)
        assert tensor.shape == shape and tensor.data_ptr() % ARENA_ALIGN == 0
        values = torch.randn(shape, generator=gen).bfloat16()
        made.append((tensor.copy_(values), values))
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * 2) for t, _ in made)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # no overlap
    del arena
    gc.collect()  # the tensors alone keep their segments mapped
    for tensor, values in made:
        assert torch.equal(tensor, values)


@pytest.mark.skipif("[never]" in THP_MODE or not THP_MODE, reason="no transparent huge pages")
def test_packed_weights_sit_on_huge_pages() -> None:
    arena = HugePageArena()
    tensor = arena.empty((4 * 2**20,), torch.bfloat16)  # 8 MiB: at least three whole 2 MiB pages
    tensor.fill_(1.0)
    assert _huge_page_kib(tensor.data_ptr()) >= 3 * 2048
