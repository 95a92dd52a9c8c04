"""DP-SIPS: iterative partition selection rounds (Swanberg, Desfontaines, Haney).

I rounds of Weighted Gaussian in zCDP, each on what earlier rounds did not
release. Round ``i = 0..I−1`` gets the budget fraction
``f_i = r^(I−1−i)·(1 − r)/(1 − r^I)`` (``1/I`` when r = 1), so with r < 1 the
last round gets the most: ``ρ_i = ρ·f_i`` and ``δ_i = δ·f_i``. In each round
every user loses the items released earlier, is re-sampled to at most Δ0 of
the remaining distinct items, and the round runs Weighted Gaussian (zCDP) with
``(ρ_i, δ_i)``. The output is the union of the rounds. By composition the whole
is δ-approximate ρ-zCDP (``docs/mechanisms.md`` section 5).

Removing released items between rounds (``removal``):

* ``'side-input'`` (default): the items released so far reach every worker as a
  side input, held as a set. One pass over the per-user data per round and no
  extra shuffle; the released set (not the data) must fit in each worker's
  memory. Released sets are small next to the histogram: every released item
  needs weight above T_i ≥ 1, and a user's total ℓ1 weight is at most √Δ0, so
  at most n·√Δ0/T_i items can be released in round i, and in practice far
  fewer (hundreds of thousands of strings take tens of MB). On a runner that
  re-evaluates side inputs in every task (Beam's Dask runner) the rounds run on
  users kept in ``bounding.DEFAULT_USER_GROUPS`` groups (``SipsRounds._expand_in_groups``)
  and the released list is sent to every group through one ``GroupByKey``.
* ``'join'``: a per-item join (``CoGroupByKey`` of ``(item, user)`` pairs with
  the released items) followed by a regroup per user. It scales to released
  sets of any size, at the price of two shuffles of all user-item pairs per
  round. Use it when the released set could exceed worker memory.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Optional, Set

import apache_beam as beam

from beam_dpsu import calibration as cal
from beam_dpsu import keys
from beam_dpsu.accounting import PrivacyGuarantee, dp_to_zcdp_rho, zcdp_guarantee
from beam_dpsu import runners
from beam_dpsu.bounding import (DEFAULT_USER_GROUPS, GroupUsers, MergeItemCountsFn, SampleItems,
                                sample_items)
from beam_dpsu.calibration import (check_ratio, check_rounds, round_budgets,  # noqa: F401
                                   round_fractions)
from beam_dpsu.histogram import (DEFAULT_NUM_SHARDS, ShardedHistogram, SumPackedShards,
                                 add_user_to_histogram, packed_shards)
from beam_dpsu.mechanisms.base import Mechanism, noise_purpose
from beam_dpsu.mechanisms.histogram import WeightedGaussianZcdp, remove_items, round_histogram
from beam_dpsu.noise import RunKey
from beam_dpsu.threshold import ApplyReleaseRule, NoisyThresholdRule

DEFAULT_ROUNDS = 3
DEFAULT_RATIO = 1.0 / 3.0
REMOVALS = ("side-input", "join")


class Sips(Mechanism):
    """DP-SIPS: I rounds of Weighted Gaussian (zCDP), each on what is not yet released.

    Args:
      rho: the total ρ > 0 of δ-approximate ρ-zCDP (all rounds together).
      delta: the total approximate-zCDP δ, 0 < δ < 1/2.
      max_items: Δ0 ≥ 1, distinct items kept per user in each round (default 100).
      rounds: I ≥ 1 (default 3). More rounds find more items held by few users
        but split the budget thinner.
      ratio: r > 0 (default 1/3): round i gets r^(I−1−i) of the last round's
        share; r = 1 splits evenly; r < 1 puts most budget in the last round.
      removal: ``'side-input'`` (default) or ``'join'``; see the module docstring.
        No privacy effect.

    Use ``Sips.from_dp(epsilon, delta, ...)`` to calibrate to an (ε, δ)-DP target.

    Guarantee: δ-approximate ρ-zCDP; ``guarantee`` also states an (ε, δ)-DP
    equivalent (DP-SIPS Corollary 9).
    """

    def __init__(self, rho: float, delta: float, max_items: int = 100,
                 rounds: int = DEFAULT_ROUNDS, ratio: float = DEFAULT_RATIO,
                 removal: str = "side-input", guarantee: Optional[PrivacyGuarantee] = None):
        rho, delta = cal.check_rho(rho), cal.check_delta(delta, upper=0.5)
        max_items = cal.check_max_items(max_items)
        rounds, ratio = check_rounds(rounds), check_ratio(ratio)
        if removal not in REMOVALS:
            raise ValueError(f"removal must be one of {REMOVALS}, got {removal!r}")
        self.name = "sips"
        self.ratio = ratio
        self.removal = removal
        # Each round is the zCDP Weighted Gaussian of its share (docs/mechanisms.md section 5).
        self.rounds = [WeightedGaussianZcdp(rho_i, delta_i, max_items).calibration
                       for rho_i, delta_i in round_budgets(rho, delta, rounds, ratio)]
        self.guarantee = guarantee or zcdp_guarantee(rho, delta)
        self.rho, self.delta = rho, delta

    @classmethod
    def from_dp(cls, epsilon: float, delta: float, max_items: int = 100,
                rounds: int = DEFAULT_ROUNDS, ratio: float = DEFAULT_RATIO,
                removal: str = "side-input") -> "Sips":
        """Calibrates to (ε, δ)-DP: half of δ is the approximate-zCDP δ, and ρ is
        the largest whose conversion (``accounting.dp_to_zcdp_rho``) gives (ε, δ)."""
        epsilon, delta = cal.check_epsilon(epsilon), cal.check_delta(delta)
        rho = dp_to_zcdp_rho(epsilon, delta, delta / 2.0)
        guarantee = PrivacyGuarantee(
            epsilon, delta, rho=rho, zcdp_delta=delta / 2.0,
            note=f"{delta / 2:g}-approximate {rho:.6g}-zCDP, the largest ρ whose conversion "
                 f"(DP-SIPS Corollary 9) gives ({epsilon:g}, {delta:g})-DP")
        return cls(rho, delta / 2.0, max_items, rounds, ratio, removal, guarantee)

    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d.update({
            "rounds": len(self.rounds),
            "ratio": self.ratio,
            "removal": self.removal,
            "per_round": [{"round": i, "rho": r.rho, "delta": r.delta, "sigma": r.noise_scale,
                           "threshold": r.threshold} for i, r in enumerate(self.rounds)],
        })
        d["units"].update({"rounds": "number of rounds I",
                           "ratio": "budget ratio r: round i gets r^(I−1−i) of the last "
                                    "round's share (dimensionless)"})
        return d

    def release_rule(self, run_key: RunKey, round_index: int = 0) -> NoisyThresholdRule:
        r = self.rounds[round_index]
        return NoisyThresholdRule("gaussian", r.noise_scale, r.threshold, run_key,
                                  noise_purpose(round_index))

    def expand_per_user(self, per_user, run_key):
        released = per_user | "SipsRounds" >> SipsRounds(self, run_key)
        return released | "DropRound" >> beam.Keys()

    def run_local(self, per_user, run_key: RunKey) -> Set[Any]:
        """The Beam-free core: same sampling, weights and rules as ``SipsRounds``."""
        return set(self.run_local_with_rounds(per_user, run_key))

    def run_local_with_rounds(self, per_user, run_key: RunKey) -> Dict[Any, int]:
        """``{item: round that released it}`` on in-memory ``{user: {item: count}}``."""
        released: Dict[Any, int] = {}
        for i, r in enumerate(self.rounds):
            rule = self.release_rule(run_key, i)
            for item, w in round_histogram(per_user, r, run_key, i, released).items():
                if rule(item, w):
                    released[item] = i
        return released


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


def _released_to_every_group(element, groups: int):
    items = tuple(element[1])
    for g in range(groups):
        yield g, (True, items)


def _remove_in_group(element):
    """``(group, [(True, released items)..., (False, users)])`` → ``(group, users left)``:
    every user without the released items; users left empty disappear."""
    group, members = element
    released: Set[Any] = set()
    users = []
    for is_release, value in members:
        if is_release:
            released.update(value)
        else:
            users = value
    left = []
    for user, counts in users:
        remaining = remove_items(counts, released)
        if remaining:
            left.append((user, remaining))
    if left:
        yield group, left


class _RemoveFromGroups(beam.PTransform):
    """``(group, users)`` → the same groups without the released items.

    The released items are gathered into one list and sent, as one element, to
    each of ``groups`` groups, which meet their users in one ``GroupByKey``: no
    side input (Beam's Dask runner re-evaluates one in every task) and no
    shuffle of per-user elements. A group holds its users and the released
    list, as a worker holds the side input elsewhere.
    """

    def __init__(self, released, groups: int):
        super().__init__()
        self._released = released
        self._groups = groups

    def expand(self, user_groups):
        lists = (self._released
                 | "OneKey" >> beam.Map(lambda item: (None, item))
                 | "Gather" >> beam.GroupByKey()
                 | "ToEveryGroup" >> beam.FlatMap(_released_to_every_group, self._groups))
        users = user_groups | "Mark" >> beam.MapTuple(lambda g, users: (g, (False, users)))
        return ((users, lists)
                | "Together" >> beam.Flatten()
                | "PerGroup" >> beam.GroupByKey()
                | "Remove" >> beam.FlatMap(_remove_in_group))


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
            raise ValueError(f"sips must be a calibrated beam_dpsu.sips.Sips, got {sips!r}")
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
        (``_RemoveFromGroups``), so only groups, packed shards and released lists cross
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
                groups = groups | f"Remove{i}" >> _RemoveFromGroups(released,
                                                                     DEFAULT_USER_GROUPS)
        return tuple(outputs) | "Union" >> beam.Flatten()
