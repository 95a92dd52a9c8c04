"""Adaptive weighting: weight moved off items a DP estimate shows far above the cutoff
(``docs/mechanisms.md`` section 11).

In the spirit of MaxAdaptiveDegree (Chen, Cohen-Addad, Epasto, Zadimoghaddam, ICML 2025),
designed and proven here. The weighted Gaussian wastes most of a popular item's weight:
an item thousands of users hold needs only enough to clear the threshold. Moving that
excess to the users' other items by the items' *exact* weights would let one added user
change which items are over-full, and so every other user's weights (docs section 11.1
builds a dataset on which that indirect change is √Δ0 times the direct one). Here the
weights move by a *DP estimate* instead:

1. **Estimate** (share ``s`` of the precision, nothing released). Every user keeps at most Δ0
   distinct items (the sample of round 0) and adds 1/√k to each, as the weighted
   Gaussian does; each item's value gets Gaussian noise N(0, σ_E²), and
   is compared with the levels ``C·2^j`` (j = 0..m−1, C the last round's cutoff
   T + α·σ): the item's *bucket* β is the number of levels its noisy value exceeds
   (``release_rules.GaussianLevels``, exact decisions).
2. **Release rounds** (the rest; one round for ``adaptive``, two for
   ``adaptive-2r``, split as DP-SIPS splits its rounds). Each user keeps at most Δ0 of
   its items not yet released and weighs them by their buckets
   (``adaptive_weights``): an item of bucket β ≥ 2 (noisy value above 2C) is *heavy*
   and gets 2^-(β−1)/√k, so its users together still give it about C or more; the
   user's other (*light*) items share the rest of the ℓ2 budget 1 equally. Gaussian
   noise, and a threshold for half of the round's δ (``calibration.adaptive_threshold``).

Guarantee: (ε, δ)-DP. The estimate and the rounds are Gaussian mechanisms whose
precisions 1/σ² sum to that of σ = AGM(ε, δ/2, 1); the thresholds keep an added user's
new items within the other δ/2.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Set

import numpy as np

from beam_dpsu.dp import calibration as cal
from beam_dpsu.dp.accounting import PrivacyGuarantee
from beam_dpsu.dp.contribution import ItemCounts, sample_items
from beam_dpsu.dp.mechanisms.base import Mechanism, RoundCalibration, decided, noise_purpose
from beam_dpsu.dp.noise import RunKey
from beam_dpsu.dp.params import (DEFAULT_ALPHA, DEFAULT_ESTIMATE_SHARE, DEFAULT_MAX_ITEMS,
                                 DEFAULT_RATIO)
from beam_dpsu.dp.release_rules import GaussianLevels, NoisyThresholdRule

__all__ = ["LEVELS", "ESTIMATE_MARGIN", "LEVEL_RATIO", "HEAVY_BUCKET", "adaptive_weights",
           "basic_histogram", "adaptive_histogram", "RELEASED", "released_first", "adaptive_pairs_histogram",
           "Adaptive"]


#: m, the number of levels C·2^j: items up to 2^(m−1)·C (about 8·10^6·C) are told apart.
LEVELS = 24
#: The levels' ratio (2: a heavy item's users give it between C and 2C, before noise).
LEVEL_RATIO = 2.0
#: The levels are C·2^j + μ·σ_E: an item whose noisy value exceeds one is above C·2^j
#: unless its noise exceeded μ standard deviations.
ESTIMATE_MARGIN = 2.0
#: Items of this bucket or above (noisy value above 2C) are heavy.
HEAVY_BUCKET = 2

#: ℓ = √(rest/L)·(1 − 2^-50): the float rounding of the light items' weight never puts a
#: user's ℓ2 norm above 1.
_DOWN = 1.0 - 2.0 ** -50


def adaptive_weights(buckets) -> np.ndarray:
    """One user's weights on its k kept items, from their estimate buckets.

    b = 1/√k. An item of bucket β ≥ ``HEAVY_BUCKET`` gets ``b·2^-(β−1)`` (at most b/2);
    every other item gets the same ℓ = √((1 − Σ heavy²)/L), L their number (ℓ ≥ b; with
    no heavy item ℓ = b, Weighted Gaussian's weight). The ℓ2 norm is at most 1 (1 but for
    rounding when L ≥ 1; Weighted Gaussian's k·b² when nothing is heavy), every weight > 0,
    and the light items' weights are equal: the two facts the proof uses
    (``docs/mechanisms.md`` section 11).
    """
    buckets = np.asarray(buckets, dtype=np.int64)
    k = buckets.size
    if k == 0:
        return np.zeros(0)
    b = 1.0 / math.sqrt(k)
    heavy = buckets >= HEAVY_BUCKET
    w = np.empty(k)
    w[heavy] = b * np.power(LEVEL_RATIO, -(buckets[heavy] - 1).astype(np.float64))
    light = int(k - heavy.sum())
    if light == k:  # nothing heavy: Weighted Gaussian's weights, to the bit
        w[:] = b
    elif light:
        rest = max(0.0, 1.0 - float(np.sum(w[heavy] ** 2)))
        w[~heavy] = math.sqrt(rest / light) * _DOWN
    return w


class Adaptive(Mechanism):
    """Adaptive weighting: heavy items, by a DP estimate, give their users' budget to the
    users' other items (``docs/mechanisms.md`` section 11).

    Args:
      epsilon: ε > 0 of the (ε, δ)-DP guarantee of the whole release (both stages).
      delta: 0 < δ < 1: half for the two Gaussian stages together, half for the
        thresholds.
      max_items: Δ0 ≥ 1 (default 100), distinct items kept per user. No effect on the
        guarantee (the thresholds account for it).
      release_rounds: 1 (``adaptive``, default: the estimate is not released) or 2
        (``adaptive-2r``: the estimate releases the items above its own threshold, and
        the second stage works on the others). No effect on the guarantee.
      estimate_share: s in (0, 1) (default 0.1; 0.25 with two rounds), the estimate's
        share of the Gaussian precision 1/σ²; the second stage has the rest, and its
        release statistic combines both, so it has the whole precision. No effect on
        the guarantee; a larger s tells heavy items apart better (and, with two rounds,
        releases more in the first) but moves the release statistic towards the
        unadapted weights.
      alpha: α ≥ 0 (default 3): the cutoff C = T + α·σ; an item whose estimate is above
        2C + 2σ_E is heavy. No effect on the guarantee.
    """

    _policy_weights = True  # a user's weights are not 1/√k each (units' wording)

    def __init__(self, epsilon: float, delta: float, max_items: int = DEFAULT_MAX_ITEMS,
                 release_rounds: int = 1, estimate_share: Optional[float] = None,
                 alpha: float = DEFAULT_ALPHA):
        epsilon, delta = cal.check_epsilon(epsilon), cal.check_delta(delta)
        max_items = cal.check_max_items(max_items)
        if isinstance(release_rounds, bool) or release_rounds not in (1, 2):
            raise ValueError(f"release_rounds must be 1 or 2, got {release_rounds!r}")
        if estimate_share is None:
            estimate_share = DEFAULT_ESTIMATE_SHARE[release_rounds]
        if isinstance(estimate_share, bool) or \
                not isinstance(estimate_share, (int, float, np.integer, np.floating)) or \
                not 0.0 < float(estimate_share) < 1.0:
            raise ValueError(f"estimate_share must be a number in (0, 1), got "
                             f"{estimate_share!r}")
        cal.policy_cutoff(1.0, 1.0, alpha)  # α: a finite number ≥ 0
        self.name = "adaptive" if release_rounds == 1 else "adaptive-2r"
        self.epsilon, self.delta = epsilon, delta
        s = self.estimate_share = float(estimate_share)
        self.alpha = float(alpha)
        # The two Gaussian stages: precisions s/σ² and (1 − s)/σ² (section 11).
        self.sigma = cal.weighted_gaussian_sigma(epsilon, delta)
        self.estimate_sigma, self.adaptive_sigma = cal.adaptive_sigmas(
            epsilon, delta, [s, 1.0 - s])
        # The thresholds' δ/2: the released estimate's rounds take s of it (two rounds);
        # the adaptive round what is left, less δ_h (calibration.adaptive_threshold).
        first = delta / 2.0 * s if release_rounds == 2 else 0.0
        self.rounds = []
        if release_rounds == 2:
            self.rounds.append(RoundCalibration(
                cal.adaptive_threshold(self.estimate_sigma, 2.0 * first, 0.0, max_items),
                "gaussian", self.estimate_sigma, max_items, "l2", delta=first))
        # The cutoff and levels need T of the adaptive round, T needs δ_h, δ_h the
        # levels: T is first computed without δ_h (its largest value: δ_h only lowers
        # the budget's first term below δ/4 when δ_h > δ/4, and then the budget is δ/4),
        # then the levels from the T of the worst budget, then T from δ_h.
        # the thresholds' δ/2 left, doubled (the δ argument), scaled down by 10^-12 with two
        # rounds so that first + rest/2 ≤ δ/2 holds in spite of rounding
        rest = (delta - 2.0 * first) * (1.0 - 1e-12 if release_rounds == 2 else 1.0)
        worst = cal.adaptive_threshold(self.sigma, rest, rest / 4.0, max_items)
        self.cutoff = cal.policy_cutoff(worst, self.sigma, alpha)
        self.levels = [x + ESTIMATE_MARGIN * self.estimate_sigma
                       for x in cal.adaptive_levels(self.cutoff, LEVELS, LEVEL_RATIO)]
        self.heavy_delta = cal.adaptive_heavy_delta(self.levels[HEAVY_BUCKET - 1],
                                                    self.estimate_sigma, max_items)
        threshold = cal.adaptive_threshold(self.sigma, rest, self.heavy_delta, max_items)
        self.rounds.append(RoundCalibration(threshold, "gaussian", self.sigma, max_items,
                                            "l2", delta=rest / 2.0))
        self.guarantee = PrivacyGuarantee(
            epsilon, delta,
            note=f"(ε, δ)-DP: the estimate and the adaptive round are Gaussian mechanisms "
                 f"whose precisions sum to that of σ = AGM(ε, δ/2, 1) = {self.sigma:.6g}; "
                 f"an added user's new items are released with probability at most δ/2")
    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d["units"].pop("cutoff", None)
        d["units"].pop("per_round", None)
        d.update({
            "estimate_share": self.estimate_share,
            "estimate": {"sigma": self.estimate_sigma, "cutoff": self.cutoff,
                         "levels": [self.levels[0], LEVEL_RATIO, len(self.levels)],
                         "heavy_delta": self.heavy_delta,
                         "released": len(self.rounds) == 2},
            "alpha": self.alpha,
        })
        d["units"].update({
            "estimate_share": "the estimate's share of the Gaussian precision 1/σ² (the "
                              "adaptive round has the rest; its release statistic "
                              "combines both)",
            "estimate": "the estimate: its Gaussian σ_E, the cutoff C = T + α·σ, the "
                        "levels [C + 2σ_E, ratio, count] an item's noisy value is compared "
                        "with (C·ratio^j + 2σ_E), the bound δ_h on an added user's new item "
                        "looking heavy, and whether its items above its own threshold are "
                        "released (adaptive-2r)",
            "alpha": "α: the cutoff multiplier (dimensionless)"})
        return d

    def release_rule(self, run_key: RunKey, round_index: int = 0) -> NoisyThresholdRule:
        """The estimate's rule (``round_index`` 0 of ``adaptive-2r``; its noise is the
        estimate's). The adaptive round's decisions are ``adaptive_rule``'s."""
        if round_index != 0 or len(self.rounds) != 2:
            raise ValueError("the adaptive round is decided by adaptive_rule, on its "
                             "combined statistic")
        return self.estimate_rule(run_key)

    def estimate_rule(self, run_key: RunKey) -> NoisyThresholdRule:
        """The estimate's noise (``noise/0``) and, with two rounds, its release rule."""
        threshold = self.rounds[0].threshold if len(self.rounds) == 2 else self.cutoff
        return NoisyThresholdRule("gaussian", self.estimate_sigma, threshold, run_key,
                                  noise_purpose(0))

    def estimate_levels(self, run_key: RunKey) -> GaussianLevels:
        """The estimate's comparisons with the levels (``decide``: the buckets), on the
        estimate's noise."""
        return GaussianLevels(self.estimate_sigma, self.levels, run_key, noise_purpose(0))

    def adaptive_rule(self, run_key: RunKey) -> NoisyThresholdRule:
        """The adaptive round's rule on ``adapted_weight``: ``A + s/(1 − s)·Ŵ + Z > T/(1 − s)``,
        Z ~ N(0, σ_A²), σ_A² = σ²/(1 − s), i.e. ``s·Ŵ + (1 − s)·(A + Z) > T``."""
        r = self.rounds[-1]
        return NoisyThresholdRule("gaussian", self.adaptive_sigma,
                                  r.threshold / (1.0 - self.estimate_share), run_key,
                                  noise_purpose(1))

    def adapted_weight(self, adaptive, estimate) -> np.ndarray:
        """``A + s/(1 − s)·Ŵ`` of each item: its adaptive weight and its noisy estimate."""
        s = self.estimate_share
        return np.asarray(adaptive, np.float64) + s / (1.0 - s) * np.asarray(estimate,
                                                                            np.float64)

    def kept_items(self, per_user, run_key: RunKey) -> Dict[Any, list]:
        """``{user: [kept items]}``: each user's at most Δ0 items (``sample/0``)."""
        key = run_key.subkey("sample/0")
        return {user: list(sample_items(user, counts, self.max_items, key))
                for user, counts in per_user.items() if counts}

    def estimate(self, items, weights, run_key: RunKey):
        """``(Ŵ, buckets, released)`` of items with basic weights ``weights``: the noisy
        estimates (floats), their buckets, and (``adaptive-2r``) the estimate's release
        decisions (all False for ``adaptive``)."""
        weights = np.asarray(weights, np.float64)
        rule = self.estimate_rule(run_key)
        noisy = weights + rule.noise_values(items)
        buckets = self.estimate_levels(run_key).decide(items, weights)
        released = (rule.decide(items, weights) if len(self.rounds) == 2
                    else np.zeros(len(weights), bool))
        return noisy, buckets, released

    def estimate_shard(self, items, weights, run_key: RunKey):
        """``estimate`` of a shard's items (an Arrow string array), on their UTF-8 bytes."""
        from beam_dpsu.dp import columnar
        data, starts, lengths = columnar.string_spans(items)
        weights = np.asarray(weights, np.float64)
        rule = self.estimate_rule(run_key)
        noisy = weights + rule.noise_spans(data, starts, lengths)
        buckets = self.estimate_levels(run_key).decide_spans(data, starts, lengths, weights)
        released = (rule.decide_spans(data, starts, lengths, weights) if len(self.rounds) == 2
                    else np.zeros(len(weights), bool))
        return noisy, buckets, released

    def decide_shard(self, items, adaptive, noisy, run_key: RunKey) -> np.ndarray:
        """The adaptive round's decisions on a shard's items (an Arrow string array) of
        adaptive weights ``adaptive`` and noisy estimates ``noisy``."""
        from beam_dpsu.dp import columnar
        if len(items) == 0:
            return np.zeros(0, bool)
        data, starts, lengths = columnar.string_spans(items)
        return self.adaptive_rule(run_key).exceeds_spans(
            data, starts, lengths, self.adapted_weight(adaptive, noisy))

    def run_local(self, per_user, run_key: RunKey) -> Set[Any]:
        """The Beam-free core: the released set."""
        return set(self.run_local_with_rounds(per_user, run_key))

    def run_local_with_rounds(self, per_user, run_key: RunKey) -> Dict[Any, int]:
        """``{item: round that released it}`` on in-memory ``{user: {item: count}}``
        (round 0: the estimate of ``adaptive-2r``; the adaptive round is the last)."""
        kept = self.kept_items(per_user, run_key)
        basic = basic_histogram(kept)
        items = list(basic)
        if not items:
            return {}
        noisy, buckets, first = self.estimate(
            items, np.fromiter(basic.values(), np.float64, len(items)), run_key)
        released = {items[i]: 0 for i in np.flatnonzero(first)}
        adaptive = adaptive_histogram(kept, dict(zip(items, buckets.tolist())), released)
        left = list(adaptive)
        if left:
            index = {item: i for i, item in enumerate(items)}
            where = np.fromiter((index[i] for i in left), np.int64, len(left))
            final = self.adapted_weight(np.fromiter(adaptive.values(), np.float64, len(left)),
                                        noisy[where])
            rule = self.adaptive_rule(run_key)
            out = rule.exceeds_bits(rule.bits.many(left), final, rule._blocks_of(left))
            released.update((left[i], len(self.rounds) - 1) for i in np.flatnonzero(out))
        return released


def basic_histogram(kept: Mapping[Any, list]) -> Dict[Any, float]:
    """W: every user adds 1/√k to each of its k kept items (``{user: [items]}``)."""
    hist: Dict[Any, float] = {}
    for items in kept.values():
        b = 1.0 / math.sqrt(len(items))
        for item in items:
            hist[item] = hist.get(item, 0.0) + b
    return hist


def adaptive_histogram(kept: Mapping[Any, list], buckets: Mapping[Any, int],
                       released=()) -> Dict[Any, float]:
    """A: every user weighs its kept items not in ``released`` by ``adaptive_weights``
    of their buckets (an item missing from ``buckets`` is light)."""
    hist: Dict[Any, float] = {}
    for items in kept.values():
        mine = [item for item in items if item not in released]
        if not mine:
            continue
        weights = adaptive_weights([buckets.get(item, 0) for item in mine])
        for item, w in zip(mine, weights.tolist()):
            hist[item] = hist.get(item, 0.0) + w
    return hist


#: The mark of a released item in ``adaptive_pairs_histogram``'s ``marks``.
RELEASED = -1


def released_first(marks) -> Dict[Any, int]:
    """``{item: mark}`` of ``(item, bucket or RELEASED)`` pairs in any order: a released
    item is ``RELEASED`` whatever else it is marked (an item of ``adaptive-2r``'s first
    round is heavy too)."""
    out: Dict[Any, int] = {}
    for item, mark in marks:
        if out.get(item) != RELEASED:
            out[item] = mark
    return out


def adaptive_pairs_histogram(pairs, max_items: int, sample_key: bytes,
                             marks: Mapping[str, int]):
    """A user group's partial adaptive histogram on its distinct pairs
    (``columnar.GroupPairs``): each user keeps the Δ0 items ``sample_items`` keeps under
    ``sample_key``, drops those ``marks`` maps to ``RELEASED`` and weighs the rest by
    ``adaptive_weights`` of their buckets (``marks``' value, 0 for an item it lacks), as
    ``adaptive_histogram`` does with dicts. Returns a ``columnar.GroupHistogram``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from beam_dpsu.dp import columnar
    keep = columnar.sampled_pairs(pairs, max_items, sample_key)
    bucket = np.zeros(len(pairs.items), np.int64)
    if marks and len(pairs.items):
        listed = pa.array(list(marks), pa.string())
        where = pc.index_in(pairs.items, value_set=listed).to_numpy(zero_copy_only=False)
        found = np.flatnonzero(~np.isnan(where.astype(np.float64)))
        if found.size:
            values = np.fromiter(marks.values(), np.int64, len(marks))
            bucket[found] = values[where[found].astype(np.int64)]
    u, i = pairs.u[keep], pairs.i[keep]
    beta = bucket[i]
    live = beta != RELEASED
    u, i, beta = u[live], i[live], beta[live]
    users = len(pairs.users)
    k = np.bincount(u, minlength=users)
    b = 1.0 / np.sqrt(np.maximum(k, 1).astype(np.float64))
    heavy = beta >= HEAVY_BUCKET
    w = b[u]                                                   # no heavy item: b itself
    w[heavy] = w[heavy] * np.power(LEVEL_RATIO, -(beta[heavy] - 1).astype(np.float64))
    heavy_users = np.zeros(users, bool)
    heavy_users[u[heavy]] = True
    if heavy_users.any():
        squares = np.bincount(u[heavy], weights=w[heavy] ** 2, minlength=users)
        light = k - np.bincount(u[heavy], minlength=users)
        rest = np.maximum(0.0, 1.0 - squares)
        ell = np.sqrt(rest / np.maximum(light, 1)) * _DOWN
        mixed = heavy_users[u] & ~heavy
        w[mixed] = ell[u[mixed]]
    hist = np.bincount(i, weights=w, minlength=len(pairs.items))
    present = np.flatnonzero(hist > 0)
    return columnar.GroupHistogram(pairs.items.take(pa.array(present)), hist[present],
                                   users)
