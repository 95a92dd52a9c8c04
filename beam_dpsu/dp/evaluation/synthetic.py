"""Synthetic user-keyed data in the style of the DP-SIPS paper's Synthetic_80M.

Each user's number of occurrences is drawn from a Pareto distribution with
scale 10 and shape 1.16 (rounded down), and each occurrence's item from a
zeta (Zipf) distribution with parameter 1.1, so a user may repeat an item.
The mean is about 72 occurrences per user (100,000 users ≈ 7.2M lines).

This is test and benchmark data, not a release: it uses numpy's seeded
generator on purpose so that the same seed gives the same data. Users are
generated in blocks of ``BLOCK_USERS`` with one generator per block derived
from ``(seed, block)``, so user ``i``'s data does not depend on how many users
are requested.
"""
from __future__ import annotations

import gzip
import os
from typing import Iterator, Optional, Tuple

import numpy as np

__all__ = ["PARETO_SCALE", "PARETO_SHAPE", "ZIPF_PARAMETER", "BLOCK_USERS", "user_blocks",
           "occurrences", "write_tsv"]


PARETO_SCALE = 10.0
PARETO_SHAPE = 1.16
ZIPF_PARAMETER = 1.1
BLOCK_USERS = 1000


def _check(num_users: int, seed: int, max_items: Optional[int]) -> None:
    if isinstance(num_users, bool) or not isinstance(num_users, int) or num_users < 0:
        raise ValueError(f"num_users must be an integer >= 0, got {num_users!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if max_items is not None and (not isinstance(max_items, int) or max_items < 1):
        raise ValueError(f"max_occurrences must be None or an integer >= 1, got {max_items!r}")


def user_blocks(num_users: int, seed: int = 0, max_occurrences: Optional[int] = None
                ) -> Iterator[Tuple[int, np.ndarray, np.ndarray]]:
    """Yields ``(first_user, sizes, items)`` per block of users.

    ``sizes[j]`` is the number of occurrences of user ``first_user + j`` and
    ``items`` their concatenated item ids (integers ≥ 1).

    Args:
      num_users: how many users (≥ 0).
      seed: the data seed (≥ 0); the same seed gives the same data.
      max_occurrences: optional cap on a user's occurrences (None: no cap;
        the Pareto tail then gives a few users tens of thousands of lines).
    """
    _check(num_users, seed, max_occurrences)
    for first in range(0, num_users, BLOCK_USERS):
        count = min(BLOCK_USERS, num_users - first)
        rng = np.random.default_rng([seed, first // BLOCK_USERS])
        # Always draw a whole block of sizes, so that a user's data does not depend
        # on how many users the last block holds.
        sizes = np.floor(PARETO_SCALE * (1.0 + rng.pareto(PARETO_SHAPE, BLOCK_USERS)))
        sizes = sizes.astype(np.int64)[:count]
        if max_occurrences is not None:
            np.minimum(sizes, max_occurrences, out=sizes)
        items = rng.zipf(ZIPF_PARAMETER, int(sizes.sum()))
        yield first, sizes, items


def occurrences(num_users: int, seed: int = 0, max_occurrences: Optional[int] = None
                ) -> Iterator[Tuple[str, str]]:
    """Yields ``(user_id, item)`` string pairs, one per occurrence."""
    for first, sizes, items in user_blocks(num_users, seed, max_occurrences):
        pos = 0
        for j, size in enumerate(sizes.tolist()):
            user = f"u{first + j}"
            for item in items[pos:pos + size].tolist():
                yield user, f"i{item}"
            pos += size


def write_tsv(path: str, num_users: int, seed: int = 0,
              max_occurrences: Optional[int] = None) -> int:
    """Writes ``user<TAB>item`` lines to ``path`` (gzip if it ends in .gz); returns lines."""
    lines = 0
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    f = (gzip.open(path, "wt", encoding="utf-8", newline="\n", compresslevel=1)
         if path.endswith(".gz") else open(path, "w", encoding="utf-8", newline="\n"))
    with f:
        for first, sizes, items in user_blocks(num_users, seed, max_occurrences):
            users = np.repeat(np.arange(first, first + len(sizes)), sizes)
            f.write("".join(f"u{u}\ti{i}\n" for u, i in zip(users.tolist(), items.tolist())))
            lines += len(items)
    return lines
