"""Adaptive weighting on Beam: ``AdaptiveRounds`` runs a core ``Adaptive`` mechanism on
``(user_id, {item: count})`` (``SelectPartitions``' expansion; the command line runs it on
blocks of arrays, ``transforms.columnar``).

The stages, each a function of the core module (``dp.mechanisms.adaptive``): users in
groups (``bounding.GroupUsers``) keep their Δ0 sample; the basic histogram W is summed per
shard; each shard's estimate gives the noisy values Ŵ (kept per shard), the buckets of the
items that are not low and, for ``adaptive-2r``, the first round's releases, which reach every group as
one list (``runners.WithList``); each group's adaptive histogram A is summed per shard and
meets the shard's Ŵ in one ``GroupByKey``, where the adaptive round decides. Only groups,
packed shards, the items that are not low and the released items cross the shuffles, and no stage
needs state or a ``finish_bundle`` output: the same graph on every runner.
"""
from __future__ import annotations

from typing import Any, Optional

import apache_beam as beam
import numpy as np

from beam_dpsu.dp.data.contribution import DEFAULT_USER_GROUPS
from beam_dpsu.dp.mechanisms.adaptive import (LOW_BUCKET, RELEASED, Adaptive,
                                              adaptive_histogram, basic_histogram,
                                              released_first)
from beam_dpsu.dp.data.weights import DEFAULT_NUM_SHARDS, packed_shards
from beam_dpsu.transforms import run_key as keys
from beam_dpsu.transforms import runners
from beam_dpsu.transforms.bounding import GroupUsers
from beam_dpsu.transforms.expansion import expand_mechanism
from beam_dpsu.transforms.histogram import SumPackedShards

__all__ = ["AdaptiveRounds"]


_MARKS = "marks"
_FIRST = "first"


def _the_key(run_key):
    return run_key


class _KeptDoFn(beam.DoFn):
    """``(group, [(user, counts), ...])`` → ``(group, [(user, [kept items]), ...])``."""

    def __init__(self, mechanism: Adaptive):
        self._mechanism = mechanism
        self._key = keys.KeyedCache(_the_key)

    def process(self, element, key_bytes):
        kept = self._mechanism.kept_items(dict(element[1]), self._key(key_bytes))
        if kept:
            yield element[0], list(kept.items())


def _basic_partials(element, shards: int):
    return packed_shards(basic_histogram(dict(element[1])), shards)


class _EstimateDoFn(beam.DoFn):
    """``(shard, {item: W})`` → ``(shard, {item: Ŵ})``; ``(item, bucket)`` of the items
    that are not low on ``marks`` (an item missing from it is low); the first round's releases (``adaptive-2r``) on ``first``."""

    def __init__(self, mechanism: Adaptive, envelope: bool):
        self._mechanism, self._envelope = mechanism, envelope
        self._key = keys.KeyedCache(_the_key)

    def process(self, element, key_bytes):
        shard, hist = element
        items = list(hist)
        noisy, buckets, first = self._mechanism.estimate(
            items, np.fromiter(hist.values(), np.float64, len(items)), self._key(key_bytes))
        yield runners.main_output((shard, ("estimate", dict(zip(items, noisy.tolist())))),
                                  self._envelope)
        for k in np.flatnonzero(buckets != LOW_BUCKET).tolist():
            yield runners.tag((items[k], int(buckets[k])), _MARKS, self._envelope)
        for k in np.flatnonzero(first).tolist():
            yield runners.tag(items[k], _FIRST, self._envelope)


class _AdaptGroup:
    """``(group, kept users, marks)`` → the group's adaptive histogram in packed shards
    (picklable, for ``runners.WithList``)."""

    def __init__(self, shards: int):
        self._shards = shards

    def __call__(self, group, kept, marks):
        marks = released_first(marks)
        buckets = {item: b for item, b in marks.items() if b != RELEASED}
        released = {item for item, b in marks.items() if b == RELEASED}
        return packed_shards(adaptive_histogram(dict(kept), buckets, released), self._shards)


def _tag_adaptive(element):
    return element[0], ("adaptive", element[1])


class _DecideDoFn(beam.DoFn):
    """``(shard, [("estimate", {item: Ŵ}), ("adaptive", {item: A})])`` → the items the
    adaptive round releases."""

    def __init__(self, mechanism: Adaptive):
        self._mechanism = mechanism
        self._key = keys.KeyedCache(mechanism.adaptive_rule)
        self._released = beam.metrics.Metrics.counter("beam_dpsu", "released")

    def process(self, element, key_bytes):
        noisy, adaptive = {}, {}
        for kind, part in element[1]:
            if kind == "estimate":
                noisy.update(part)
            else:
                adaptive = part
        items = list(adaptive)
        if not items:
            return
        rule = self._key(key_bytes)
        final = self._mechanism.adapted_weight(
            np.fromiter(adaptive.values(), np.float64, len(items)),
            np.fromiter((noisy[i] for i in items), np.float64, len(items)))
        out = np.flatnonzero(rule.exceeds_bits(rule.bits.many(items), final,
                                               rule._blocks_of(items)))
        self._released.inc(len(out))
        for k in out.tolist():
            yield items[k]


def _released_mark(item):
    return item, RELEASED


class AdaptiveRounds(beam.PTransform):
    """``(user_id, {item: count})`` → the items ``adaptive`` or ``adaptive-2r`` releases.

    The same samples, estimate, weights and rules as ``Adaptive.run_local``, so the same
    release under the same key (``tests/test_adaptive_beam.py``).

    Args:
      mechanism: a calibrated ``dp.mechanisms.adaptive.Adaptive``.
      run_key: the run's ``RunKey``; None draws a fresh OS-random key.
      user_groups: how many groups users are kept in (a group's users are held in one
        worker's memory). No privacy effect.
      num_shards: the histograms' item shards. No privacy effect.
    """

    def __init__(self, mechanism: Adaptive, run_key=None,
                 user_groups: int = DEFAULT_USER_GROUPS, num_shards: int = DEFAULT_NUM_SHARDS,
                 label: Optional[str] = None):
        super().__init__(label)
        if not isinstance(mechanism, Adaptive):
            raise ValueError(f"mechanism must be a calibrated Adaptive, got {mechanism!r}")
        self._mechanism = mechanism
        self._run_key = keys.for_pipeline(run_key)
        self._groups, self._shards = user_groups, num_shards

    def expand(self, per_user):
        m = self._mechanism
        key = keys.key_side_input(per_user, self._run_key)
        kept = (per_user
                | "GroupUsers" >> GroupUsers(self._groups)
                | "Keep" >> beam.ParDo(_KeptDoFn(m), key))
        basic = (kept
                 | "Basic" >> beam.FlatMap(_basic_partials, self._shards)
                 | "SumBasic" >> SumPackedShards())
        envelope = not runners.capabilities(per_user.pipeline).tagged_outputs
        dofn = beam.ParDo(_EstimateDoFn(m, envelope), key).with_output_types(Any)
        if envelope:
            parts = runners.split_envelopes(basic | "Estimate" >> dofn, "Estimate/Split",
                                            (None, _MARKS, _FIRST))
        else:
            out = basic | "Estimate" >> dofn.with_outputs(_MARKS, _FIRST, main="main")
            parts = {None: out.main, _MARKS: out[_MARKS], _FIRST: out[_FIRST]}
        marks = ((parts[_MARKS],
                  parts[_FIRST] | "MarkReleased" >> beam.Map(_released_mark))
                 | "Marks" >> beam.Flatten())
        adaptive = (kept
                    | "Adapt" >> runners.WithList(marks, self._groups, _AdaptGroup(self._shards))
                    | "SumAdaptive" >> SumPackedShards()
                    | "TagAdaptive" >> beam.Map(_tag_adaptive))
        released = ((parts[None], adaptive)
                    | "Together" >> beam.Flatten()
                    | "PerShard" >> beam.GroupByKey()
                    | "Decide" >> beam.ParDo(_DecideDoFn(m), key))
        return (parts[_FIRST], released) | "Union" >> beam.Flatten()


@expand_mechanism.register
def _(mechanism: Adaptive, per_user, run_key):
    return per_user | "AdaptiveRounds" >> AdaptiveRounds(mechanism, run_key)
