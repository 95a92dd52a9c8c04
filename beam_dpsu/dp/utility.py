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
from typing import Any, Dict, Iterable, Mapping


__all__ = ["item_occurrences", "occurrence_coverage", "missing_mass"]


def item_occurrences(per_user: Mapping[Any, Mapping[Any, int]]) -> Dict[Any, int]:
    """``{item: number of (user, item) occurrences}`` summed over users.

    Args:
      per_user: ``{user: {item: count}}`` (``textio.read_per_user``,
        ``dp.contribution.per_user_counts``), where ``count`` is how many input lines the
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
