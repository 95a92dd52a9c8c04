"""The Beam-free core: run a mechanism on in-memory data with the same functions.

``run_local`` applies a mechanism to a ``{user_id: {item: count}}`` mapping
with exactly the per-user and per-item functions the Beam transforms call
(``bounding.sample_items``, ``histogram.add_user_to_histogram`` and the
mechanism's ``release_rule``), so tests, benchmarks and the privacy auditor
exercise the real code paths thousands of times without a pipeline. Given the
same ``RunKey`` it returns the same set as the pipeline.
"""
from __future__ import annotations

from typing import Any, Dict, Hashable, Iterable, Mapping, Set, Tuple

from beam_dpsu.bounding import ItemCounts, sample_items
from beam_dpsu.histogram import add_user_to_histogram
from beam_dpsu.mechanisms import HistogramMechanism, Mechanism
from beam_dpsu.noise import RunKey


def per_user_counts(occurrences: Iterable[Tuple[Hashable, Hashable]]) -> Dict[Any, ItemCounts]:
    """``(user_id, item)`` occurrences → ``{user_id: {item: count}}`` (None dropped)."""
    out: Dict[Any, ItemCounts] = {}
    for user, item in occurrences:
        if user is None or item is None:
            continue
        counts = out.get(user)
        if counts is None:
            counts = out[user] = {}
        counts[item] = counts.get(item, 0) + 1
    return out


def histogram_local(per_user: Mapping[Any, ItemCounts], mechanism: HistogramMechanism,
                    run_key: RunKey, round_index: int = 0) -> Dict[Any, float]:
    """The weighted histogram of one round, as the Beam transforms compute it."""
    r = mechanism.rounds[round_index]
    key = run_key.subkey(f"sample/{round_index}")
    hist: Dict[Any, float] = {}
    for user, counts in per_user.items():
        if not counts:
            continue
        kept = sample_items(user, counts, r.max_items, key) if r.max_items else counts
        add_user_to_histogram(hist, kept, r.weighting)
    return hist


def run_local(per_user: Mapping[Any, ItemCounts], mechanism: Mechanism,
              run_key: RunKey = None) -> Set[Any]:
    """The set a mechanism releases on in-memory per-user data.

    Args:
      per_user: ``{user_id: {item: count}}`` (see ``per_user_counts``).
      mechanism: a calibrated mechanism.
      run_key: the run's key; None draws a fresh OS-random key.
    """
    run_key = RunKey.resolve(run_key)
    if isinstance(mechanism, HistogramMechanism):
        hist = histogram_local(per_user, mechanism, run_key)
        rule = mechanism.release_rule(run_key)
        return {item for item, w in hist.items() if rule(item, w)}
    local = getattr(mechanism, "run_local", None)
    if local is None:
        raise ValueError(f"{mechanism!r} has no Beam-free implementation")
    return local(per_user, run_key)
