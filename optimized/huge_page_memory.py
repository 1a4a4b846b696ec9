"""Byte buffers on transparent huge pages, where the kernel grants them.

After an idle period (the benchmark suite pauses 0.1 s between rounds; a server waits for its
next request) a run finds its TLB cold, and every 4 KiB page it touches costs a page walk.
On 2 MiB pages the plan's arena takes a walk per 512 of them.  With THP in madvise mode
(common, and this machine's) only advised memory gets huge pages, and numpy advises only
allocations of 4 MiB and more, so an arena of 2-4 MiB (light_squeezenet's is 3.75 MiB) was on
4 KiB pages.

Only the arena is advised.  light_squeezenet at 1 thread, CPU ms of a run after a 0.1 s pause,
one process alternating the two ways run by run, median of the 150 paired differences, two
processes each (load 0.1-1.0): the arena advised against np.empty, -0.139 / -0.095 (kept).  Tried
beside it and dropped: the constants the step table reads copied into one advised block, +0.004
/ +0.026 (a 12.4-14.0 ms run); the oneDNN convolutions' NHWC workspace on huge pages, -0.083 /
-0.008; their reordered weights bump-allocated from advised 2 MiB chunks, +0.16 (median of 6
alternating processes, whose spread was +-3 ms).  Prefetching the next tile's weight and output
rows in csrc/conv_pointwise.c, +0.002 / -0.116 likewise: dropped.  A 1x1 512->1000 at 13x13 alone
after the pause (2 MiB of weights): 3.77 ms with them on 4 KiB pages, 3.67 on a huge page, 3.70
with input and output there too (60 rounds, back to back 2.77-2.84).  A compute-only loop in
cache (100 calls of a 1x1 64->64 at 13x13) runs 15% slower after the pause too (4.80 -> 5.53
ms), as does a pure Python loop, so much of the penalty is the VM's core waking, not page walks.
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
