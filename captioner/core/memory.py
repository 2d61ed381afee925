"""glibc's handling of freed memory: kept for reuse while a command runs, handed back once after a peak."""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4   # glibc mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of handing it back to the system at every free.

    Turns glibc's ``mmap`` for large allocations off and never trims the heap, so that a decoding step's large
    tensors (B * k hypotheses x L regions x A) reuse freed blocks instead of costing fresh page faults at every
    step. Called when a command starts; returns whether both settings took, False where the C library is not
    glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**30))


def release_freed_memory() -> bool:
    """Hand the freed memory glibc keeps (:func:`keep_freed_memory`) back to the system once (``malloc_trim``):
    after a one-off peak such as parsing a large annotation file, whose buffers would otherwise stay resident
    in this process and in every process forked from it. A no-op returning False where the C library is not glibc."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim     # the C library this process runs on
    except (OSError, AttributeError):
        return False
    return bool(malloc_trim(0))
