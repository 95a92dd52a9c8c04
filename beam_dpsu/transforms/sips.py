"""DP-SIPS on Beam: ``SipsRounds`` runs the rounds of a core ``Sips`` mechanism.

The rounds, their budgets and the Beam-free run are in
``beam_dpsu.dp.mechanisms.sips``; this module holds the Beam expansion, with
the removal of released items between rounds (``'side-input'`` or ``'join'``,
see that module's docstring) and, on a runner that re-evaluates side inputs in
every task, rounds run on groups of users.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Optional, Set

import apache_beam as beam

from beam_dpsu.dp.data.contribution import DEFAULT_USER_GROUPS, sample_items
from beam_dpsu.dp.mechanisms.histogram_threshold import remove_items
from beam_dpsu.dp.mechanisms.sips import Sips
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.data.weights import DEFAULT_NUM_SHARDS, add_user_to_histogram, packed_shards
from beam_dpsu.transforms import run_key as keys
from beam_dpsu.transforms import runners
from beam_dpsu.transforms.bounding import GroupUsers, MergeItemCountsFn, SampleItems
from beam_dpsu.transforms.expansion import expand_mechanism
from beam_dpsu.transforms.histogram import ShardedHistogram, SumPackedShards
from beam_dpsu.transforms.release import ApplyReleaseRule

__all__ = ["SipsRounds"]


class _RemoveReleasedDoFn(beam.DoFn):
    """Drops released items (side input) from each user; drops users left empty."""

    def __init__(self):
        self._cache_id = None
        self._cache: Set[Any] = set()

    def process(self, element, released_items):
        if self._cache_id != id(released_items):
            self._cache = set(released_items)
            self._cache_id = id(released_items)
        user, counts = element
        remaining = remove_items(counts, self._cache)
        if remaining:
            yield user, remaining


def _explode(element):
    user, counts = element
    for item, c in counts.items():
        yield item, (user, c)


def _keep_unreleased(element):
    item, grouped = element
    if grouped["released"]:
        return
    for user, c in grouped["pairs"]:
        yield user, {item: c}


class _RemoveByJoin(beam.PTransform):
    """The join variant of the removal: scales to released sets of any size."""

    def __init__(self, released):
        super().__init__()
        self._released = released

    def expand(self, per_user):
        pairs = per_user | "Explode" >> beam.FlatMap(_explode)
        marks = self._released | "Mark" >> beam.Map(lambda item: (item, True))
        return ({"pairs": pairs, "released": marks}
                | "JoinOnItem" >> beam.CoGroupByKey()
                | "KeepUnreleased" >> beam.FlatMap(_keep_unreleased)
                | "Regroup" >> beam.CombinePerKey(MergeItemCountsFn()))


def _group_as_list(element):
    group, users = element
    return group, list(users)


class _GroupRoundDoFn(beam.DoFn):
    """``(group, [(user, counts), ...])`` → one round's partial histogram of the group:
    each user sampled to Δ0 under ``purpose`` (``sample_items``, as ``SampleItems``)
    and weighted (``add_user_to_histogram``), in packs of shards (``packed_shards``)."""

    def __init__(self, max_items: int, purpose: str, weighting: str, num_shards: int):
        self._max_items = max_items
        self._key = keys.KeyedCache(keys.Subkey(purpose))
        self._weighting = weighting
        self._num_shards = num_shards

    def process(self, element, key_bytes):
        key = self._key(key_bytes)
        hist: Dict[Any, float] = {}
        for user, counts in element[1]:
            if counts:
                add_user_to_histogram(hist, sample_items(user, counts, self._max_items, key),
                                      self._weighting)
        yield from packed_shards(hist, self._num_shards)


def _remove_in_group(group, users, released):
    """``(group, users)`` → the group's users without the released items; users left
    empty disappear, and so does a group left without users."""
    released = set(released)
    left = []
    for user, counts in users:
        remaining = remove_items(counts, released)
        if remaining:
            left.append((user, remaining))
    if left:
        yield group, left


class SipsRounds(beam.PTransform):
    """``(user_id, {item: count})`` → ``(item, round)`` for every item DP-SIPS releases.

    Runs the rounds of ``sips`` (a calibrated ``Sips``) inside one pipeline:
    per round, remove the items already released, re-sample to Δ0, build the
    ℓ2-weighted histogram, add Gaussian noise, threshold at T_i. Each released
    item carries the (0-based) round that released it; the rounds' releases
    are disjoint. Released counts per round are in the metrics
    ``beam_dpsu/released_round_<i>``.

    Args:
      sips: the calibrated mechanism (rounds, budgets, Δ0, removal strategy).
      run_key: the run's ``RunKey``; None draws a fresh OS-random key.
    """

    def __init__(self, sips: Sips, run_key: Optional[RunKey] = None,
                 label: Optional[str] = None):
        super().__init__(label)
        if not isinstance(sips, Sips):
            raise ValueError(f"sips must be a calibrated beam_dpsu.dp.mechanisms.sips.Sips, got {sips!r}")
        self._sips = sips
        self._run_key = keys.for_pipeline(run_key)

    def expand(self, per_user):
        if (self._sips.removal == "side-input"
                and not runners.capabilities(per_user.pipeline).side_inputs_once):
            return self._expand_in_groups(per_user)
        sips, run_key = self._sips, self._run_key
        remaining = per_user
        outputs = []
        for i, r in enumerate(sips.rounds):
            released = (remaining
                        | f"Sample{i}" >> SampleItems(r.max_items, run_key, f"sample/{i}")
                        | f"Histogram{i}" >> ShardedHistogram(r.weighting)
                        | f"Release{i}" >> ApplyReleaseRule(
                            functools.partial(sips.release_rule, round_index=i), run_key,
                            metric=f"released_round_{i}", sharded=True))
            outputs.append(released | f"Tag{i}" >> beam.Map(lambda item, i=i: (item, i)))
            if i + 1 < len(sips.rounds):
                if sips.removal == "join":
                    remaining = remaining | f"Remove{i}" >> _RemoveByJoin(released)
                else:
                    remaining = remaining | f"Remove{i}" >> beam.ParDo(
                        _RemoveReleasedDoFn(), beam.pvalue.AsList(released))
        return tuple(outputs) | "Union" >> beam.Flatten()

    def _expand_in_groups(self, per_user):
        """The rounds on users kept in groups (``bounding.GroupUsers``), for runners that
        re-evaluate side inputs in every task and drop ``finish_bundle`` outputs (Dask):
        per round, each group's users are sampled and summed into a partial histogram
        packed per shard (``_GroupRoundDoFn``) and lose the released items in the group
        (``runners.WithList``), so only groups, packed shards and released lists cross
        the shuffles. The same samples, weights and rules as the per-user expansion."""
        sips, run_key = self._sips, self._run_key
        key = keys.key_side_input(per_user, run_key)
        groups = (per_user
                  | "GroupUsers" >> GroupUsers(DEFAULT_USER_GROUPS)
                  | "AsLists" >> beam.Map(_group_as_list))
        outputs = []
        for i, r in enumerate(sips.rounds):
            released = (groups
                        | f"Histogram{i}/PerGroup" >> beam.ParDo(
                            _GroupRoundDoFn(r.max_items, f"sample/{i}", r.weighting,
                                            DEFAULT_NUM_SHARDS), key)
                        | f"Histogram{i}/Sum" >> SumPackedShards()
                        | f"Release{i}" >> ApplyReleaseRule(
                            functools.partial(sips.release_rule, round_index=i), run_key,
                            metric=f"released_round_{i}", sharded=True))
            outputs.append(released | f"Tag{i}" >> beam.Map(lambda item, i=i: (item, i)))
            if i + 1 < len(sips.rounds):
                groups = groups | f"Remove{i}" >> runners.WithList(
                    released, DEFAULT_USER_GROUPS, _remove_in_group)
        return tuple(outputs) | "Union" >> beam.Flatten()


@expand_mechanism.register
def _(mechanism: Sips, per_user, run_key):
    released = per_user | "SipsRounds" >> SipsRounds(mechanism, run_key)
    return released | "DropRound" >> beam.Keys()
