"""Contribution bounding: per-user item frequencies and keyed-hash sampling to Δ0.

The per-user representation used throughout the library is
``(user_id, {item: count})``: a user's distinct items with how often the user
has each (``C_i[u]`` of the specification). ``PerUserItemCounts`` builds it from
a PCollection of ``(user_id, item)`` occurrences, aggregating inside each
bundle before the shuffle so that the per-element cost of the Python SDK is
paid once per (bundle, user) rather than once per occurrence.

``sample_items`` keeps, for a user with more than Δ0 distinct items, a
uniformly random subset of Δ0 of them drawn by a generator seeded with
``HMAC(key, user)``: the same subset on every retry and on every runner.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import apache_beam as beam
from apache_beam import typehints
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue

from beam_dpsu.transforms import run_key as keys
from beam_dpsu.dp.calibration import check_max_items
from beam_dpsu.dp.noise import RunKey
from beam_dpsu.dp.contribution import (DEFAULT_FLUSH_PAIRS, DEFAULT_USER_GROUPS, ItemCounts,
                                       merge_item_counts, sample_items, user_group)

__all__ = ["KV_ANY", "GLOBAL_WINDOWS", "GLOBAL_TIMESTAMP", "GroupUsers", "MergeItemCountsFn",
           "check_global_window", "PER_USER_DESIGNS", "PerUserItemCounts", "SampleItems"]


KV_ANY = typehints.Tuple[Any, Any]

# Where outputs of finish_bundle go: the library aggregates in the global window.
GLOBAL_WINDOWS = (window.GlobalWindow(),)
GLOBAL_TIMESTAMP = window.GlobalWindow().max_timestamp()


def _to_group(element, groups: int):
    return user_group(element[0], groups), element


class GroupUsers(beam.PTransform):
    """``(user, value)``, one element per user → ``(group, [(user, value), ...])``.

    A ``GroupByKey`` on ``user_group``: where a runner drops what a DoFn emits in
    ``finish_bundle`` (Beam's Dask runner), a DoFn that would aggregate a bundle of
    users aggregates a group instead, so what it emits is per group, not per user.
    A group's users are held in one worker's memory (users / ``groups`` of them).
    """

    def __init__(self, groups: int = DEFAULT_USER_GROUPS, label: Optional[str] = None):
        super().__init__(label)
        self._groups = groups

    def expand(self, per_user):
        return (per_user
                | "ToGroups" >> beam.Map(_to_group, self._groups)
                | "GroupUsers" >> beam.GroupByKey())


class MergeItemCountsFn(beam.CombineFn):
    """CombineFn adding ``{item: number}`` dicts (per-user counts, per-shard weights).

    Lifts into a per-bundle pre-combine.
    """

    def create_accumulator(self):
        return {}

    def add_input(self, acc, counts):
        if not acc:
            return dict(counts)
        get = acc.get
        for item, c in counts.items():
            acc[item] = get(item, 0) + c
        return acc

    def merge_accumulators(self, accs):
        return merge_item_counts(accs)

    def extract_output(self, acc):
        return acc


def check_global_window(pcoll: beam.PCollection, transform_name: str) -> None:
    """Raises a clear error for windowed input: set union is a batch aggregate."""
    windowfn = pcoll.windowing.windowfn
    if not isinstance(windowfn, window.GlobalWindows):
        raise ValueError(
            f"{transform_name} needs its input in the global window (a bounded, batch "
            f"aggregate over all users); got windowing {windowfn!r}. Re-window with "
            f"beam.WindowInto(beam.window.GlobalWindows()) first.")


class _AggregateOccurrencesDoFn(beam.DoFn):
    """Counts (user, item) occurrences inside a bundle, emitting (user, counts) partials."""

    def __init__(self, flush_pairs: int):
        self._flush_pairs = flush_pairs
        self._none = beam.metrics.Metrics.counter("beam_dpsu", "rejected_none")

    def start_bundle(self):
        self._acc: Dict[Any, ItemCounts] = {}
        self._pairs = 0

    def process(self, element):
        user, item = element
        if user is None or item is None:
            self._none.inc()
            return
        counts = self._acc.get(user)
        if counts is None:
            counts = self._acc[user] = {}
        c = counts.get(item)
        if c is None:
            counts[item] = 1
            self._pairs += 1
            if self._pairs >= self._flush_pairs:
                yield from self._acc.items()
                self._acc, self._pairs = {}, 0
        else:
            counts[item] = c + 1

    def finish_bundle(self):
        for user, counts in self._acc.items():
            yield WindowedValue((user, counts), GLOBAL_TIMESTAMP, GLOBAL_WINDOWS)
        self._acc, self._pairs = {}, 0


class _CountItemsFn(beam.CombineFn):
    """CombineFn: the items of one user's occurrences → ``{item: count}``.

    ``PerUserItemCounts`` applies it with ``CombinePerKey``, which Beam lifts
    into a per-bundle pre-combine (``add_input`` is called from the runner's
    combining table, without a DoFn invocation per occurrence) and merges the
    partial dicts after the shuffle. A ``None`` item is skipped and counted in
    ``beam_dpsu/rejected_none``.
    """

    def __init__(self):
        self._none = beam.metrics.Metrics.counter("beam_dpsu", "rejected_none")

    def create_accumulator(self):
        return {}

    def add_input(self, acc, item):
        if item is None:
            self._none.inc()
            return acc
        acc[item] = acc.get(item, 0) + 1
        return acc

    def add_inputs(self, acc, items):
        for item in items:
            acc = self.add_input(acc, item)
        return acc

    def merge_accumulators(self, accs):
        return merge_item_counts(accs)

    def extract_output(self, acc):
        return acc


class _DropRejectedDoFn(beam.DoFn):
    """Drops the ``None`` user (counting its occurrences) and users left with no items."""

    def __init__(self):
        self._none = beam.metrics.Metrics.counter("beam_dpsu", "rejected_none")

    def process(self, element):
        user, counts = element
        if user is None:
            self._none.inc(sum(counts.values()))
        elif counts:
            yield element


#: The designs of ``PerUserItemCounts`` (benchmarks compare them in one process).
PER_USER_DESIGNS = ("combine", "bundle-dofn")


class PerUserItemCounts(beam.PTransform):
    """``(user_id, item)`` occurrences → ``(user_id, {item: count})``, one per user.

    The building block for every mechanism: deduplicates each user's items and
    keeps how often the user has each (GW uses the frequencies; the other
    mechanisms use only the distinct items). Occurrences whose user id or item
    is ``None`` are dropped and counted in the metric
    ``beam_dpsu/rejected_none``; they are never released.

    Items and user ids may be any value Beam can encode deterministically as a
    grouping key (str, bytes, int, float, bool, and tuples of these; not sets or
    dicts, which Beam rejects with a clear error when the pipeline runs). They
    are passed through unchanged: ``42`` and ``"42"`` are different items.

    How: ``CombinePerKey`` with a dict-counting ``CombineFn``, which Beam lifts
    into a per-bundle pre-aggregation before the shuffle (one partial dict per
    user and bundle; the runner's combining table holds at most 100,000 users
    per bundle before it flushes part of them). This costs less per occurrence
    than a DoFn aggregating in its own dict (``design='bundle-dofn'``, the
    previous implementation, kept for benchmarks): about 0.05 against 0.11 of
    the cost of reading and splitting the lines (``benchmarks/RESULTS.md``).
    On a runner that does not lift combiners (Dask) it is a ``GroupByKey``
    followed by the count, still correct.

    Args:
      flush_pairs: with ``design='bundle-dofn'``, a bundle's partial aggregate
        is emitted when it holds this many distinct (user, item) pairs
        (default 1M). Validated and otherwise unused. No privacy effect.
      design: ``'combine'`` (default) or ``'bundle-dofn'``; the same output.

    Privacy: none by itself; this transform does not bound contributions.
    """

    def __init__(self, flush_pairs: int = DEFAULT_FLUSH_PAIRS, label: Optional[str] = None,
                 design: str = "combine"):
        super().__init__(label)
        if isinstance(flush_pairs, bool) or not isinstance(flush_pairs, int) or flush_pairs < 1:
            raise ValueError(f"flush_pairs must be an integer >= 1, got {flush_pairs!r}")
        if design not in PER_USER_DESIGNS:
            raise ValueError(f"design must be one of {PER_USER_DESIGNS}, got {design!r}")
        self._flush_pairs = flush_pairs
        self._design = design

    def _aggregate_fn(self, occurrences):
        # A runner that drops finish_bundle outputs (Dask): flush after every pair.
        from beam_dpsu.transforms import runners
        if runners.capabilities(occurrences.pipeline).bundle_outputs:
            return _AggregateOccurrencesDoFn(self._flush_pairs)
        return runners.per_element_flush(_AggregateOccurrencesDoFn(1))

    def expand(self, occurrences):
        check_global_window(occurrences, "PerUserItemCounts")
        if self._design == "bundle-dofn":
            return (occurrences
                    | "AggregateInBundle" >> beam.ParDo(self._aggregate_fn(occurrences))
                    | "MergePerUser" >> beam.CombinePerKey(MergeItemCountsFn()))
        if not typehints.typehints.is_consistent_with(occurrences.element_type, KV_ANY):
            # e.g. typed only as ``tuple``: Beam's key-value type check would refuse it.
            occurrences = occurrences | "AsPairs" >> beam.Map(tuple).with_output_types(KV_ANY)
        return (occurrences
                | "CountPerUser" >> beam.CombinePerKey(_CountItemsFn())
                | "DropRejected" >> beam.ParDo(_DropRejectedDoFn()))


class SampleItems(beam.PTransform):
    """``(user_id, {item: count})`` → the same with at most Δ0 items per user.

    Each user with more than Δ0 distinct items keeps a uniformly random subset
    of Δ0 of them, chosen by keyed hash (``sample_items``), so retries and
    runners agree. Users with no items are dropped.

    Args:
      max_items: Δ0, the contribution bound (integer ≥ 1). Smaller Δ0 means less
        noise per item for count-based mechanisms and less data per user.
      run_key: the run's ``RunKey`` (``RunKey.fresh()``, or a test seed); None
        draws a fresh key (then two ``SampleItems`` in one pipeline sample
        independently). The key's bytes are drawn on a worker and read as a
        side input (``beam_dpsu.transforms.run_key``), never staged with the job graph.
      purpose: the key's purpose label; mechanisms use ``'sample/<round>'``.

    Privacy: after this transform each user changes at most Δ0 distinct items,
    which is the sensitivity bound the calibrations assume.
    """

    def __init__(self, max_items: int, run_key: Optional[RunKey] = None,
                 purpose: str = "sample/0", label: Optional[str] = None):
        super().__init__(label)
        self._max_items = check_max_items(max_items)
        self._run_key = keys.for_pipeline(run_key)
        self._purpose = purpose

    def expand(self, per_user):
        return per_user | "SampleToMaxItems" >> beam.ParDo(
            _SampleDoFn(self._max_items, self._purpose),
            keys.key_side_input(per_user, self._run_key))


class _SampleDoFn(beam.DoFn):
    """Applies ``sample_items`` to each ``(user, counts)``; drops users with no items.

    The sampling key is derived on the worker from the run key's bytes (a side
    input), so it is never part of the job graph.
    """

    def __init__(self, max_items: int, purpose: str):
        self._max_items = max_items
        self._key = keys.KeyedCache(keys.Subkey(purpose))

    def process(self, element, key_bytes):
        user, counts = element
        if counts:
            yield user, sample_items(user, counts, self._max_items, self._key(key_bytes))
