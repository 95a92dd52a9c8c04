"""The Beam-free core: run a mechanism on in-memory data with the same functions.

``run_local`` applies a mechanism to a ``{user_id: {item: count}}`` mapping by
calling its ``run_local`` method, which uses exactly the per-user and per-item
functions its Beam expansion calls (``bounding.sample_items``,
``histogram.add_user_to_histogram``, the policies, the mechanism's
``release_rule``), so tests, benchmarks and the privacy auditor exercise the
real code paths thousands of times without a pipeline. Given the same
``RunKey`` it returns the same release as the pipeline.
"""
from __future__ import annotations

from typing import Any, Dict, Hashable, Iterable, Mapping, Tuple

from beam_dpsu.bounding import ItemCounts
from beam_dpsu.mechanisms.base import Mechanism
from beam_dpsu.mechanisms.histogram import histogram_local  # noqa: F401  (re-export)
from beam_dpsu.noise import RunKey


def per_user_counts(occurrences: Iterable[Tuple[Hashable, Hashable]]) -> Dict[Any, ItemCounts]:
    """``(user_id, item)`` occurrences → ``{user_id: {item: count}}`` (None dropped).

    Each user's dict iterates in the order the user's items first occur (the
    record order that ``needs_record_order`` mechanisms read).
    """
    out: Dict[Any, ItemCounts] = {}
    for user, item in occurrences:
        if user is None or item is None:
            continue
        counts = out.get(user)
        if counts is None:
            counts = out[user] = {}
        counts[item] = counts.get(item, 0) + 1
    return out


def run_local(per_user: Mapping[Any, ItemCounts], mechanism: Mechanism,
              run_key: RunKey = None):
    """The release of a mechanism on in-memory per-user data (``mechanism.run_local``).

    Args:
      per_user: ``{user_id: {item: count}}`` (see ``per_user_counts``).
      mechanism: a calibrated mechanism.
      run_key: the run's key; None (default) draws a fresh OS-random key.
    Returns:
      the released set (top-k: the ranked rows).
    """
    return mechanism.run_local(per_user, RunKey.resolve(run_key))
