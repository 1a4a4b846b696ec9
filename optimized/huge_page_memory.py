"""Byte buffers on transparent huge pages, where the kernel grants them.

After an idle period (the benchmark suite pauses 0.1 s between rounds; a server waits for its
next request) a run finds its TLB cold, and every 4 KiB page it touches costs a page walk.
On 2 MiB pages the plan's arena takes a walk per 512 of them.  With THP in madvise mode
(common, and this machine's) only advised memory gets huge pages, and numpy advises only
allocations of 4 MiB and more, so an arena of 2-4 MiB (light_squeezenet's is 3.75 MiB) was on
4 KiB pages.
"""
from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 << 20  # bytes: an x86-64 (and arm64 4K-granule) transparent huge page
SMALLEST = HUGE_PAGE  # bytes: smaller buffers stay on the heap, rounding up would waste most


def huge_page_buffer(nbytes: int) -> np.ndarray:
    """A uint8 array of nbytes.  One of at least SMALLEST bytes starts a private anonymous
    mapping aligned to HUGE_PAGE, rounded up to whole huge pages and advised MADV_HUGEPAGE;
    where mmap has no MADV_HUGEPAGE, and for smaller sizes, a plain np.empty.  The mapping
    lives as long as the array (its base) and goes back to the kernel with it."""
    if nbytes < 0:
        raise ValueError(f"a buffer cannot have {nbytes} bytes")
    if nbytes < SMALLEST or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(nbytes, np.uint8)
    rounded = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    # private: an anonymous shared mapping is shmem, whose huge pages follow another setting
    mapping = mmap.mmap(-1, rounded + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(mapping, np.uint8)
    skip = -whole.ctypes.data % HUGE_PAGE
    mapping.madvise(mmap.MADV_HUGEPAGE, skip, rounded)
    return whole[skip:skip + nbytes]
