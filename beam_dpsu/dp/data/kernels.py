"""Compiled kernels for the sequential policies (optional: needs numba).

``DenseRunner`` applies a policy to users one after another like
``sequential.run_in_order``, but keeps the histogram as a float array indexed
through an open-addressing hash table of item ids, and runs the per-user
update (ℓ1-descent, ℓ2-descent, greedy fill, cascade-free greedy) in code
compiled by numba. The arithmetic is the same as in ``sequential.apply_l1`` /
``apply_l2`` / ``apply_greedy`` / ``apply_cascade_free``, operation for
operation and in the same order, so the histogram is bit-for-bit the same;
the tests check this.

Users arrive in batches (the sequential stage's buckets); only the histogram
and the id table are kept between batches, so memory is that of the
histogram, as for the dict version.

Without numba installed (``pip install 'beam-dpsu[fast]'``) ``available()`` is
False and the transforms use the plain-Python dict path. Compiled code is cached
on disk by numba (``cache=True``: next to this module, or numba's user cache
directory), so only the first process on a machine pays the compilation
(a few seconds); ``warm_up`` moves that cost out of the first batch.
"""
from __future__ import annotations

import math
from typing import Dict, Iterator, Tuple

import numpy as np

__all__ = ["KINDS", "available", "warm_up", "DenseRunner"]


try:  # pragma: no cover - exercised when numba is installed
    import numba
    from numba import njit
except ImportError:  # pragma: no cover
    numba = None

KINDS = {"l1-descent": 0, "l2-descent": 1, "greedy": 2, "greedy-public": 2,
         "cascade-free-greedy": 3, "cascade-free-greedy-public": 3}
_EMPTY = -1


def available() -> bool:
    """True when numba is installed and the compiled kernels can run."""
    return numba is not None


if numba is not None:

    @njit(cache=True)
    def _slot(keys, key):
        mask = keys.size - 1
        i = key & mask
        while True:
            k = keys[i]
            if k == key or k == _EMPTY:
                return i
            i = (i + 1) & mask

    @njit(cache=True)
    def _l2(H, idx, cutoff):
        z2 = 0.0
        any_below = False
        for j in range(idx.size):
            h = H[idx[j]]
            if h < cutoff:
                d = cutoff - h
                z2 += d * d
                any_below = True
        if not any_below:
            return
        if z2 <= 1.0:
            for j in range(idx.size):
                if H[idx[j]] < cutoff:
                    H[idx[j]] = cutoff
            return
        inv = 1.0 / math.sqrt(z2)
        for j in range(idx.size):
            h = H[idx[j]]
            if h < cutoff:
                d = cutoff - h
                v = h + d * inv
                H[idx[j]] = v if v < cutoff else cutoff

    @njit(cache=True)
    def _l1(H, idx, cutoff, budget):
        m = 0
        for j in range(idx.size):
            if H[idx[j]] < cutoff:
                m += 1
        if m == 0:
            return
        gaps = np.empty(m)
        hs = np.empty(m)
        where = np.empty(m, np.int64)
        k = 0
        for j in range(idx.size):
            h = H[idx[j]]
            if h < cutoff:
                gaps[k] = cutoff - h
                hs[k] = h
                where[k] = idx[j]
                k += 1
        order = np.argsort(gaps, kind="mergesort")
        remaining = budget
        prev = 0.0
        for j in range(m):
            o = order[j]
            g = gaps[o]
            cost = (g - prev) * (m - j)
            if cost <= remaining:
                remaining -= cost
                prev = g
                H[where[o]] = cutoff
                continue
            level = prev + remaining / (m - j)
            for jj in range(j, m):
                o2 = order[jj]
                v = hs[o2] + level
                H[where[o2]] = v if v < cutoff else cutoff
            return

    @njit(cache=True)
    def _greedy(H, idx, cutoff, budget):
        remaining = budget
        for j in range(idx.size):
            i = idx[j]
            h = H[i]
            if h >= cutoff:
                continue
            cost = cutoff - h
            if cost <= remaining:
                H[i] = cutoff
                remaining -= cost
                if remaining <= 0.0:
                    return
            else:
                v = h + remaining
                H[i] = v if v < cutoff else cutoff
                return

    @njit(cache=True)
    def _apply_batch(kind, cutoff, eta, rest, keys, slots, H, used, ids, lengths):
        pos = 0
        for u in range(lengths.size):
            n = lengths[u]
            idx = np.empty(n, np.int64)
            for j in range(n):
                key = ids[pos + j]
                s = _slot(keys, key)
                if keys[s] == _EMPTY:
                    keys[s] = key
                    slots[s] = used
                    H[used] = 0.0
                    used += 1
                idx[j] = slots[s]
            pos += n
            if kind == 0:
                _l1(H, idx, cutoff, 1.0)
            elif kind == 1:
                _l2(H, idx, cutoff)
            elif kind == 2:
                _greedy(H, idx, cutoff, 1.0)
            else:
                _l1(H, idx, cutoff, eta)
                _greedy(H, idx, cutoff, rest)
        return used

    @njit(cache=True)
    def _rehash(keys, slots, new_keys, new_slots):
        for s in range(keys.size):
            if keys[s] != _EMPTY:
                t = _slot(new_keys, keys[s])
                new_keys[t] = keys[s]
                new_slots[t] = slots[s]


def warm_up() -> None:
    """Compiles (or loads from numba's on-disk cache) every kernel once.

    Call it where start-up cost is acceptable (a DoFn's ``setup``), so that the
    first real batch does not pay for compilation. A no-op without numba. The
    four policies share one compiled function (the kind is an argument); the
    second batch here outgrows the table, which compiles its growth (``_rehash``).
    """
    if not available():
        return
    for name in ("l1-descent", "l2-descent", "greedy", "cascade-free-greedy"):
        runner = DenseRunner(name, 1.0, initial_items=2, eta=0.5)
        runner.add_users(np.array([3, 5], dtype=np.int64), np.array([2], dtype=np.int64))
        runner.add_users(np.arange(7, 23, dtype=np.int64), np.array([16], dtype=np.int64))


class DenseRunner:
    """Runs one policy over users in order with the compiled kernels.

    Args:
      policy_name: ``policy.name`` of an ``L1DescentPolicy``, ``L2DescentPolicy``,
        ``GreedyPolicy`` or ``CascadeFreeGreedyPolicy``.
      cutoff: the policy's Γ.
      eta: the step-1 budget η of the cascade-free greedy (ignored otherwise);
        step 2 gets ``1.0 - eta``, computed as the policy computes it.
      initial_items: the number of distinct items the table starts with room for
        (default 1,024); it doubles as items arrive, so this only saves rehashing.
        A small start keeps the many tiny runs of an audit cheap.
    """

    def __init__(self, policy_name: str, cutoff: float, initial_items: int = 1 << 10,
                 eta: float = 0.0):
        if not available():
            raise RuntimeError("numba is not installed: pip install 'beam-dpsu[fast]'")
        if policy_name not in KINDS:
            raise ValueError(f"no compiled kernel for policy {policy_name!r}")
        self._kind = KINDS[policy_name]
        if self._kind == 3 and not 0.0 < float(eta) < 1.0:
            raise ValueError(f"the cascade-free greedy needs 0 < eta < 1, got {eta!r}")
        self._cutoff = float(cutoff)
        self._eta = float(eta)
        self._rest = 1.0 - self._eta
        cap = 1
        while cap < 2 * initial_items:
            cap <<= 1
        self._keys = np.full(cap, _EMPTY, dtype=np.int64)
        self._slots = np.zeros(cap, dtype=np.int64)
        self._H = np.zeros(cap // 2 + 1)
        self._used = 0

    def _reserve(self, extra: int) -> None:
        need = self._used + extra
        if 2 * need <= self._keys.size:
            return
        cap = self._keys.size
        while 2 * need > cap:
            cap <<= 1
        keys = np.full(cap, _EMPTY, dtype=np.int64)
        slots = np.zeros(cap, dtype=np.int64)
        _rehash(self._keys, self._slots, keys, slots)
        H = np.zeros(cap // 2 + 1)
        H[:self._used] = self._H[:self._used]
        self._keys, self._slots, self._H = keys, slots, H

    def add_users(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Applies users in order: ``lengths[k]`` ids each, concatenated in ``ids``."""
        # Writable, contiguous int64: the signature warm_up compiled (a read-only
        # array from np.frombuffer would make numba compile another one).
        ids = np.require(ids, dtype=np.int64, requirements=["C", "W"])
        lengths = np.require(lengths, dtype=np.int64, requirements=["C", "W"])
        if ids.size == 0:
            return
        self._reserve(int(ids.size))
        self._used = int(_apply_batch(self._kind, self._cutoff, self._eta, self._rest, self._keys, self._slots,
                                      self._H, self._used, ids, lengths))

    def arrays(self) -> Tuple[np.ndarray, np.ndarray]:
        """``(item ids, weights)`` as arrays, for every id with weight > 0."""
        occupied = np.flatnonzero(self._keys != _EMPTY)
        weights = self._H[self._slots[occupied]]
        keep = weights > 0
        return self._keys[occupied][keep], weights[keep]

    def items(self) -> Iterator[Tuple[int, float]]:
        """``(item id, weight)`` for every id with weight > 0."""
        ids, weights = self.arrays()
        return zip(ids.tolist(), weights.tolist())

    def histogram(self) -> Dict[int, float]:
        return dict(self.items())
