"""Weighted histograms: each user spreads a bounded budget over their items.

``user_weight`` gives the weight a user with ``n`` kept items adds to each of
them; ``WeightedHistogram`` sums those weights per item across users. The sum
is computed inside each bundle first (one partial per item and bundle) and then
combined per item with ``CombinePerKey``, so no worker ever holds the users of
an item, and the per-element cost is paid per (bundle, item), not per
(user, item) pair.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import apache_beam as beam
from apache_beam.utils.windowed_value import WindowedValue

from beam_dpsu.bounding import (DEFAULT_FLUSH_PAIRS, GLOBAL_TIMESTAMP, GLOBAL_WINDOWS,
                                check_global_window)

# weighting name -> (what each of the n kept items of a user receives, its norm)
WEIGHTINGS = {
    "count": "1 to each kept item (ℓ∞-bounded; ℓ1 and ℓ2 norms grow with Δ0)",
    "l1": "1/n to each of the n kept items (ℓ1 norm 1)",
    "l2": "1/√n to each of the n kept items (ℓ2 norm 1)",
}


def check_weighting(weighting: str) -> str:
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {sorted(WEIGHTINGS)}, got {weighting!r}")
    return weighting


def user_weight(num_items: int, weighting: str) -> float:
    """The weight a user with ``num_items`` kept items adds to each of them.

    ``'count'``: 1; ``'l1'``: 1/n; ``'l2'``: 1/√n. ``num_items`` must be ≥ 1.
    """
    if num_items < 1:
        raise ValueError(f"a contributing user has at least one item, got {num_items!r}")
    if weighting == "count":
        return 1.0
    if weighting == "l1":
        return 1.0 / num_items
    if weighting == "l2":
        return 1.0 / math.sqrt(num_items)
    raise ValueError(f"weighting must be one of {sorted(WEIGHTINGS)}, got {weighting!r}")


def add_user_to_histogram(histogram: Dict[Any, float], items, weighting: str) -> None:
    """Adds one user's contribution (``items``: their kept distinct items) in place."""
    n = len(items)
    if n == 0:
        return
    w = user_weight(n, weighting)
    get = histogram.get
    for item in items:
        histogram[item] = get(item, 0.0) + w


class _PartialHistogramDoFn(beam.DoFn):
    """Sums user weights per item inside a bundle; emits (item, partial weight)."""

    def __init__(self, weighting: str, flush_items: int):
        self._weighting = weighting
        self._flush_items = flush_items

    def start_bundle(self):
        self._hist: Dict[Any, float] = {}

    def process(self, element):
        _, counts = element
        add_user_to_histogram(self._hist, counts, self._weighting)
        if len(self._hist) >= self._flush_items:
            yield from self._hist.items()
            self._hist = {}

    def finish_bundle(self):
        for item, w in self._hist.items():
            yield WindowedValue((item, w), GLOBAL_TIMESTAMP, GLOBAL_WINDOWS)
        self._hist = {}


class WeightedHistogram(beam.PTransform):
    """``(user_id, {item: count})`` → ``(item, weight)`` for every item with weight > 0.

    Each user adds ``user_weight(n, weighting)`` to each of their ``n`` items
    (the counts are ignored: apply ``SampleItems`` first to bound n by Δ0).

    Args:
      weighting: ``'count'`` (each item +1: the histogram of distinct users per
        item), ``'l1'`` (1/n each, ℓ1 norm 1 per user) or ``'l2'`` (1/√n each,
        ℓ2 norm 1 per user). The mechanism's noise must be calibrated to the
        chosen norm: Laplace for ℓ1, Gaussian for ℓ2, and for ``'count'`` a
        sensitivity of Δ0 (ℓ1) or √Δ0 (ℓ2).
      flush_items: a bundle's partial histogram is emitted when it has this many
        items (bounds worker memory; default 1M). No privacy effect.

    Privacy: none by itself. An item appears in the output only if some user
    has it, so no zero-weight item can later be noised or released.
    """

    def __init__(self, weighting: str = "l2", flush_items: int = DEFAULT_FLUSH_PAIRS,
                 label: Optional[str] = None):
        super().__init__(label)
        self._weighting = check_weighting(weighting)
        if isinstance(flush_items, bool) or not isinstance(flush_items, int) or flush_items < 1:
            raise ValueError(f"flush_items must be an integer >= 1, got {flush_items!r}")
        self._flush_items = flush_items

    def expand(self, per_user):
        check_global_window(per_user, "WeightedHistogram")
        return (per_user
                | "PartialHistogram" >> beam.ParDo(
                    _PartialHistogramDoFn(self._weighting, self._flush_items))
                | "SumPerItem" >> beam.CombinePerKey(sum))
