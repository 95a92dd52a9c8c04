"""Memory for the columnar path's arrays: Arrow's pool, and arrays reused block to block.

An array of a few hundred KB or more that numpy allocates comes from the C
library's ``malloc``. Where glibc's trim threshold is set (Dask's nanny sets
``MALLOC_TRIM_THRESHOLD_`` for its workers, which also fixes glibc's mmap
threshold at 128 KiB), every such array is mapped anew, zero-filled by the kernel
one 4 KiB page fault at a time as it is first written, and unmapped when freed:
on a block of lines that is most of the system time of a worker, and its
user code runs on cold pages. Arrow's default memory pool (mimalloc or
jemalloc in pyarrow's wheels) keeps what is freed for the next allocation.

So the hot path takes its larger arrays from here: ``empty`` for an array
that leaves a call (Arrow's pool), ``Scratch`` for arrays that one reader
reuses from block to block. Neither changes any value; only where the memory
comes from (``docs/runners.md``, "Worker settings that change the speed").
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import pyarrow as pa

__all__ = ["empty", "Scratch"]


def empty(n: int, dtype) -> np.ndarray:
    """An uninitialised writable numpy array of ``n`` elements of ``dtype``, its
    memory from Arrow's default memory pool (64-byte aligned; freed with the
    array, back to the pool)."""
    dtype = np.dtype(dtype)
    if n < 0:
        raise ValueError(f"an array has at least 0 elements; got {n}")
    return np.frombuffer(pa.allocate_buffer(int(n) * dtype.itemsize), dtype, int(n))


class Scratch:
    """Arrays that one reader reuses from block to block (``parse_block``,
    ``pair_blocks``), and from file to file when it keeps it: an array taken under
    a name stays valid until the same name is taken again, so nothing taken may
    outlive the block it was taken for (what ``pair_blocks`` returns never holds
    one). No effect on any result."""

    def __init__(self):
        self._arrays: Dict[str, np.ndarray] = {}

    def take(self, name: str, n: int, dtype) -> np.ndarray:
        """An uninitialised array of ``n`` elements of ``dtype``, the one last taken
        under ``name`` when it is large enough (grown by a quarter more when not)."""
        dtype = np.dtype(dtype)
        held = self._arrays.get(name)
        if held is None or held.dtype != dtype or held.size < n:
            size = n if held is None or held.dtype != dtype else max(n, held.size * 5 // 4)
            held = self._arrays[name] = empty(size, dtype)
        return held[:n]
