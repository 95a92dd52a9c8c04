"""Weighted histograms: each user spreads a bounded budget over their items.

``user_weight`` gives the weight a user with ``n`` kept items adds to each of
them; ``WeightedHistogram`` sums those weights per item across users. The sum
is computed inside each bundle first (one partial per item and bundle) and then
combined per item with ``CombinePerKey``, so no worker ever holds the users of
an item, and the per-element cost is paid per (bundle, item), not per
(user, item) pair.
"""
from __future__ import annotations

import pickle
from typing import Any, Dict, Optional

import apache_beam as beam
from apache_beam.utils.windowed_value import WindowedValue

from beam_dpsu.dp.data.contribution import DEFAULT_FLUSH_PAIRS, DEFAULT_USER_GROUPS, merge_item_counts
from beam_dpsu.transforms.bounding import (GLOBAL_TIMESTAMP, GLOBAL_WINDOWS, GroupUsers,
                                           check_global_window)
from beam_dpsu.dp.data.weights import (DEFAULT_NUM_SHARDS, add_user_to_histogram, check_weighting,
                                  packed_shards)


__all__ = ["SumPackedShards", "WeightedHistogram", "ShardedHistogram"]


def _sum_pack(element):
    """``(pack, [pickled {shard: partial}, ...])`` → ``(shard, {item: weight})`` per shard."""
    parts: Dict[int, list] = {}
    for blob in element[1]:
        for shard, part in pickle.loads(blob).items():
            parts.setdefault(shard, []).append(part)
    return ((shard, merge_item_counts(p)) for shard, p in parts.items())


class SumPackedShards(beam.PTransform):
    """``packed_shards`` partials → one ``(shard, {item: weight})`` per shard: a
    ``GroupByKey`` per pack of shards, then the sum of each shard's partials."""

    def expand(self, partials):
        return (partials
                | "GroupShards" >> beam.GroupByKey()
                | "SumPerShard" >> beam.FlatMap(_sum_pack))


class _PartialHistogramDoFn(beam.DoFn):
    """Sums user weights per item inside a bundle.

    Emits ``(item, partial weight)``, or with ``num_shards`` the bundle's
    partial histogram in packs of shards (``packed_shards``).
    """

    def __init__(self, weighting: str, flush_items: int, num_shards: Optional[int] = None):
        self._weighting = weighting
        self._flush_items = flush_items
        self._num_shards = num_shards

    def start_bundle(self):
        self._hist: Dict[Any, float] = {}

    def _parts(self):
        if self._num_shards is None:
            return self._hist.items()
        return packed_shards(self._hist, self._num_shards)

    def process(self, element):
        _, counts = element
        add_user_to_histogram(self._hist, counts, self._weighting)
        if len(self._hist) >= self._flush_items:
            yield from self._parts()
            self._hist = {}

    def finish_bundle(self):
        for part in self._parts():
            yield WindowedValue(part, GLOBAL_TIMESTAMP, GLOBAL_WINDOWS)
        self._hist = {}


class _GroupHistogramDoFn(beam.DoFn):
    """``(group, [(user, {item: count}), ...])`` → the group's partial histogram.

    Emits ``(item, partial weight)``, or with ``num_shards`` the group's
    partial histogram in packs of shards (``packed_shards``).
    """

    def __init__(self, weighting: str, num_shards: Optional[int] = None):
        self._weighting = weighting
        self._num_shards = num_shards

    def process(self, element):
        hist: Dict[Any, float] = {}
        for _, counts in element[1]:
            add_user_to_histogram(hist, counts, self._weighting)
        if self._num_shards is None:
            yield from hist.items()
        else:
            yield from packed_shards(hist, self._num_shards)


def _partials(pcoll, label, weighting, flush_items, num_shards=None,
              user_groups=DEFAULT_USER_GROUPS):
    """Partial histograms of ``pcoll``'s users, to be summed per key.

    Per bundle (``_PartialHistogramDoFn``, emitted at ``finish_bundle``) where
    the runner keeps ``finish_bundle`` outputs. Where it does not
    (``runners.Capabilities.bundle_outputs``: Beam's Dask runner), flushing
    after every user would send one element per (user, shard) pair through the
    shuffle; instead the users are grouped by a hash of their id into
    ``user_groups`` groups (a ``GroupByKey`` of one element per user) and each
    group emits its partial histogram: at most ``user_groups`` × shards
    elements. A group holds its users' kept items in one worker's memory.
    """
    from beam_dpsu.transforms import runners
    if runners.capabilities(pcoll.pipeline).bundle_outputs:
        return pcoll | label >> beam.ParDo(
            _PartialHistogramDoFn(weighting, flush_items, num_shards))
    return (pcoll
            | label >> GroupUsers(user_groups)
            | f"{label}/PerGroup" >> beam.ParDo(_GroupHistogramDoFn(weighting, num_shards)))


def _check_histogram_args(weighting, flush_items) -> None:
    check_weighting(weighting)
    if isinstance(flush_items, bool) or not isinstance(flush_items, int) or flush_items < 1:
        raise ValueError(f"flush_items must be an integer >= 1, got {flush_items!r}")


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

    See ``ShardedHistogram`` for the same histogram as per-shard dicts, which
    the mechanisms use because it costs one Beam element per shard and bundle
    instead of one per item.
    """

    def __init__(self, weighting: str = "l2", flush_items: int = DEFAULT_FLUSH_PAIRS,
                 label: Optional[str] = None):
        super().__init__(label)
        _check_histogram_args(weighting, flush_items)
        self._weighting = weighting
        self._flush_items = flush_items

    def expand(self, per_user):
        check_global_window(per_user, "WeightedHistogram")
        return (_partials(per_user, "PartialHistogram", self._weighting, self._flush_items)
                | "SumPerItem" >> beam.CombinePerKey(sum))


class ShardedHistogram(beam.PTransform):
    """``(user_id, {item: count})`` → ``(shard, {item: weight})``: the histogram in shards.

    The input may also be a tuple of such PCollections (each user in one of
    them): each is summed into partial histograms where it is produced, and
    only the partials are flattened.

    The same weights as ``WeightedHistogram``, with every item in exactly one
    shard (``item_shard``). Each bundle emits its partial histogram as one
    pickled dict per pack of ``SHARDS_PER_PACK`` shards (``packed_shards``), a
    ``GroupByKey`` brings a pack's partials together and one call adds them per
    shard (``SumPackedShards``), so the per-element cost of the Python SDK (and
    the runner's decoding in its shuffle) is paid per pack and bundle, not per
    item; a worker holds one pack's items at a time.
    ``threshold.ApplyReleaseRule(rule, sharded=True)`` consumes the output.

    Args:
      weighting, flush_items: as for ``WeightedHistogram``.
      num_shards: how many shards (default 1024). More shards spread the
        per-item work over more workers and bound each shard's memory to about
        (distinct items / num_shards) × 150 bytes. No privacy effect.
    """

    def __init__(self, weighting: str = "l2", num_shards: int = DEFAULT_NUM_SHARDS,
                 flush_items: int = DEFAULT_FLUSH_PAIRS, label: Optional[str] = None):
        super().__init__(label)
        _check_histogram_args(weighting, flush_items)
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be an integer >= 1, got {num_shards!r}")
        self._weighting = weighting
        self._flush_items = flush_items
        self._num_shards = num_shards

    def expand(self, per_user):
        if isinstance(per_user, (tuple, list)):  # per-user parts: partials of each, flattened
            partials = []
            for k, part in enumerate(per_user):
                check_global_window(part, "ShardedHistogram")
                partials.append(_partials(part, f"PartialHistogram{k}", self._weighting,
                                          self._flush_items, self._num_shards))
            # Into a GroupByKey, not a lifted combine: a Flatten feeding the
            # combine's pre-combine ParDo made a stage that decoded every partial
            # (feeding a GroupByKey, the FnApiRunner only moves the packed bytes).
            partials = partials | "FlattenPartials" >> beam.Flatten()
        else:
            check_global_window(per_user, "ShardedHistogram")
            partials = _partials(per_user, "PartialHistogram", self._weighting,
                                 self._flush_items, self._num_shards)
        return partials | "Sum" >> SumPackedShards()
