"""The CPU worker's allocator setting (``octavo.cpu.allocator``): memory of a large block
that one layer frees serves the next layer's tensors without the kernel faulting its pages
in again."""

from __future__ import annotations

import resource

import torch

from octavo.cpu.allocator import keep_freed_memory

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
