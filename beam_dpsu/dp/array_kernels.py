"""numba kernels of the columnar path and of SipHash-2-4 (needs numba: the ``fast`` extra).

Each has a numpy twin that gives the same results (``dp.siphash._numpy_many``,
``dp.columnar._spans_equal``, ``dp.columnar._line_spans``; the tests compare them).
Import this module only through ``dp.compiled.kernel``, which loads it once a
process has enough work to repay numba's start-up.
"""
import numpy as np
from numba import njit

from beam_dpsu.dp.siphash import _C0, _C1, _C2, _C3

__all__ = ["siphash24_many", "compare_spans", "line_spans"]


@njit(cache=True, inline="always")
def _rotl_one(x, b):
    return (x << np.uint64(b)) | (x >> np.uint64(64 - b))


@njit(cache=True, inline="always")
def _round_one(v0, v1, v2, v3):
    v0 += v1
    v1 = _rotl_one(v1, 13)
    v1 ^= v0
    v0 = _rotl_one(v0, 32)
    v2 += v3
    v3 = _rotl_one(v3, 16)
    v3 ^= v2
    v0 += v3
    v3 = _rotl_one(v3, 21)
    v3 ^= v0
    v2 += v1
    v1 = _rotl_one(v1, 17)
    v1 ^= v2
    v2 = _rotl_one(v2, 32)
    return v0, v1, v2, v3


@njit(cache=True)
def siphash24_many(k0, k1, buf, starts, lengths, prefix):
    n = starts.size
    out = np.empty(n, np.uint64)
    pre = 0 if prefix < 0 else 1
    for i in range(n):
        v0 = k0[i] ^ np.uint64(_C0)
        v1 = k1[i] ^ np.uint64(_C1)
        v2 = k0[i] ^ np.uint64(_C2)
        v3 = k1[i] ^ np.uint64(_C3)
        total = lengths[i] + pre
        base = starts[i] - pre
        m = np.uint64(0)
        k = 0
        for pos in range(total):
            if pos == 0 and pre == 1:
                byte = np.uint64(prefix)
            else:
                byte = np.uint64(buf[base + pos])
            m |= byte << np.uint64(8 * k)
            k += 1
            if k == 8:
                v3 ^= m
                v0, v1, v2, v3 = _round_one(v0, v1, v2, v3)
                v0, v1, v2, v3 = _round_one(v0, v1, v2, v3)
                v0 ^= m
                m = np.uint64(0)
                k = 0
        m |= np.uint64(total & 0xFF) << np.uint64(56)
        v3 ^= m
        v0, v1, v2, v3 = _round_one(v0, v1, v2, v3)
        v0, v1, v2, v3 = _round_one(v0, v1, v2, v3)
        v0 ^= m
        v2 ^= np.uint64(0xFF)
        for _ in range(4):
            v0, v1, v2, v3 = _round_one(v0, v1, v2, v3)
        out[i] = v0 ^ v1 ^ v2 ^ v3
    return out


@njit(cache=True)
def compare_spans(data, a, b, lengths):
    out = np.ones(a.size, np.bool_)
    for k in range(a.size):
        for j in range(lengths[k]):
            if data[a[k] + j] != data[b[k] + j]:
                out[k] = False
                break
    return out


@njit(cache=True)
def line_spans(buf, lines):
    """One pass over a block of ``lines`` lines: each line's start, its end (the
    ``\\n`` or the block's end), its first tab (``buf.size + 1`` when none), and
    whether any byte is >= 0x80."""
    n = buf.size
    starts = np.empty(lines, np.int64)
    ends = np.empty(lines, np.int64)
    tabs = np.empty(lines, np.int64)
    high = False
    line = 0
    starts[0] = 0
    tab = n + 1
    for k in range(n):
        c = buf[k]
        if c == 10:
            ends[line] = k
            tabs[line] = tab
            line += 1
            starts[line] = k + 1
            tab = n + 1
        elif c == 9:
            if tab > n:
                tab = k
        elif c >= 128:
            high = True
    ends[line] = n
    tabs[line] = tab
    return starts, ends, tabs, high
