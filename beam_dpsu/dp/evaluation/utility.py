"""Utility of a release beyond its size: how much of the data the released items cover.

The number of released items is the measure the papers report, but for a
vocabulary or a key set what matters is how much of the data those items
account for: a release of 900 rare items is worth less than one of 800 items
that cover most occurrences. ``occurrence_coverage`` is the share of all
``(user, item)`` occurrences (input lines) whose item was released; its
complement is the *missing mass* (the share of the data a downstream
vocabulary would mark unknown; Dick, Joseph and Raman, ICLR 2026, argue it is
the measure that matters for vocabularies).

These are evaluation figures computed from the private data: they are NOT
differentially private and must not be published beside a release (``compare``
says so).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Sequence


__all__ = ["item_occurrences", "occurrence_coverage", "missing_mass", "users_per_item",
           "user_item_pairs", "top_k_missing_mass", "k_relative_error", "users_hit_share",
           "greedy_hitting_set"]


def item_occurrences(per_user: Mapping[Any, Mapping[Any, int]]) -> Dict[Any, int]:
    """``{item: number of (user, item) occurrences}`` summed over users.

    Args:
      per_user: ``{user: {item: count}}`` (``textio.read_per_user``,
        ``dp.data.contribution.per_user_counts``), where ``count`` is how many input lines the
        user has for the item.
    """
    out: Dict[Any, int] = {}
    get = out.get
    for counts in per_user.values():
        for item, c in counts.items():
            out[item] = get(item, 0) + c
    return out


def occurrence_coverage(released: Iterable[Any], occurrences: Mapping[Any, int]) -> float:
    """The share of all occurrences whose item is in ``released`` (0 when there are none).

    Items of ``released`` absent from ``occurrences`` count for nothing (a
    correct mechanism never releases them). The sum is exact (``math.fsum``
    of integers).

    Args:
      released: the released items (any iterable; duplicates count once).
      occurrences: ``item_occurrences`` of the data the release was made from.
    """
    total = math.fsum(occurrences.values())
    if total <= 0:
        return 0.0
    covered = math.fsum(occurrences.get(item, 0) for item in set(released))
    return covered / total


def missing_mass(released: Iterable[Any], occurrences: Mapping[Any, int]) -> float:
    """``1 − occurrence_coverage``: the share of occurrences whose item was not released."""
    return 1.0 - occurrence_coverage(released, occurrences)


# -- top-k and hitting sets (Dick, Joseph and Raman, ICLR 2026) ---------------------------
#
# N(x) is the number of users holding x, N the number of distinct (user, item) pairs. These
# count users, not occurrences: the top-k missing mass below is the paper's (Definition
# 4.1), named apart from the occurrence-based ``missing_mass`` above.

def users_per_item(per_user: Mapping[Any, Mapping[Any, int]]) -> Dict[Any, int]:
    """``{x: N(x)}``: the number of users holding each item."""
    out: Dict[Any, int] = {}
    for items in per_user.values():
        for x in items:
            out[x] = out.get(x, 0) + 1
    return out


def user_item_pairs(per_user: Mapping[Any, Mapping[Any, int]]) -> int:
    """N: the number of distinct (user, item) pairs."""
    return sum(len(items) for items in per_user.values())


def top_k_missing_mass(holders: Mapping[Any, int], released: Sequence[Any], k: int,
                       pairs: int) -> float:
    """MM_k = (sum of the k largest N(x) − sum of N(x) over the released items) / N.

    Args:
      holders: ``{x: N(x)}`` (``users_per_item``).
      released: the released items (at most k; an item no user holds counts 0).
      k: the query's k.
      pairs: N (``user_item_pairs``), > 0.
    """
    top = sorted(holders.values(), reverse=True)[:k]
    got = sum(holders.get(x, 0) for x in list(released)[:k])
    return (sum(top) - got) / pairs


def k_relative_error(holders: Mapping[Any, int], released: Sequence[Any], k: int) -> int:
    """N_(k) minus the smallest N(x) of the released items, at least 0; N_(k) (the k-th
    largest number of holders, 0 past the number of items) when fewer than k were
    released."""
    ranked = sorted(holders.values(), reverse=True)
    n_k = ranked[k - 1] if len(ranked) >= k else 0
    released = list(released)
    if len(released) < k:
        return n_k
    return max(0, n_k - min(holders.get(x, 0) for x in released))


def users_hit_share(per_user: Mapping[Any, Mapping[Any, int]], chosen: Iterable[Any]) -> float:
    """The share of users holding at least one of the chosen items."""
    chosen = set(chosen)
    if not per_user:
        return 0.0
    return sum(1 for items in per_user.values() if not chosen.isdisjoint(items)) / len(per_user)


def greedy_hitting_set(per_user: Mapping[Any, Mapping[Any, int]], k: int) -> List[Any]:
    """The non-private greedy k-hitting set (the ceiling a private one is measured
    against): k times, the item held by the most users not yet hit (ties: the
    smallest item in sorted order of their ``repr``)."""
    remaining = [set(items) for items in per_user.values() if items]
    chosen: List[Any] = []
    for _ in range(k):
        counts: Dict[Any, int] = {}
        for items in remaining:
            for x in items:
                counts[x] = counts.get(x, 0) + 1
        if not counts:
            break
        best = min(counts.items(), key=lambda kv: (-kv[1], repr(kv[0])))[0]
        chosen.append(best)
        remaining = [items for items in remaining if best not in items]
    return chosen
