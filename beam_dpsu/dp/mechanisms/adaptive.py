"""Adaptive weighting: weight moved by a DP estimate, off the items far above the cutoff and
off the items far below the threshold, onto the rest (``docs/mechanisms.md`` section 11).

In the spirit of MaxAdaptiveDegree (Chen, Cohen-Addad, Epasto, Zadimoghaddam, ICML 2025),
designed and proven here. Weighted Gaussian wastes weight twice: an item thousands of users
hold needs only enough to clear the threshold, and an item a few users hold will not clear
it whatever they give. Moving weight by the items' *exact* weights would let one added user
change which items are over-full, and so every other user's weights (docs section 11.1
builds a dataset on which that indirect change is √k times the direct one). Here the
weights move by a *DP estimate* instead:

1. **Estimate** (share ``s`` of the Gaussian precision). Every user keeps at most Δ0
   distinct items (the keyed sample ``sample/0``) and adds 1/√k to each, as Weighted
   Gaussian does; each item's value gets Gaussian noise N(0, σ_E²) and is compared with
   the levels ``[T − σ_E] + [C·2^j + 2σ_E for j = 0..23]`` (T the adaptive round's
   threshold, C = T + α·σ): the item's *bucket* β is the number of levels its noisy value
   exceeds (``release_rules.GaussianLevels``, exact decisions). β = 0: *low*; β ≥ 3
   (noisy value above 2C + 2σ_E): *heavy*; otherwise *light*.
2. **Adaptive round** (the rest of the precision). Each user weighs its kept items by their
   buckets (``adaptive_weights``): a low item gets b/10, a heavy one b·2^-(β−2) (so its
   users still give it more than C), the light ones share the rest of the ℓ2 budget 1
   equally, up to 3b each (b = 1/√k). The released statistic is the precision-weighted
   mean of the estimate and the adaptive histogram's noisy value, whose noise is that of
   Weighted Gaussian; its threshold keeps an added user's new items, whose statistics are
   at most m(t) = s/√t + (1 − s)·min(1, 3/√t) plus noise, within δ/2
   (``calibration.adaptive_threshold``).

``adaptive-2r`` also releases, from the estimate, the items above its own threshold T₀;
every user drops them before the adaptive round (so the heavy items, above T₀ too, are in
practice released in the first round and the second round's gain is the low items').

Guarantee: (ε, δ)-DP. The two stages are Gaussian mechanisms whose precisions 1/σ² sum to
that of σ = AGM(ε + log(1 − δ/2), δ/2, 1); the thresholds keep an added user's new items
within the other δ/2.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Set

import numpy as np

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.privacy.accounting import PrivacyGuarantee
from beam_dpsu.dp.data.contribution import sample_items
from beam_dpsu.dp.data.weights import add_user_to_histogram
from beam_dpsu.dp.mechanisms.base import Mechanism, RoundCalibration, noise_purpose
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.privacy.params import DEFAULT_ALPHA, DEFAULT_ESTIMATE_SHARE, DEFAULT_MAX_ITEMS
from beam_dpsu.dp.randomness.release_rules import GaussianLevels, NoisyThresholdRule

__all__ = ["LEVELS", "ESTIMATE_MARGIN", "LEVEL_RATIO", "LOW_MARGIN", "LOW_FACTOR", "LOW_BUCKET",
           "HEAVY_BUCKET", "MAX_BOOST", "adaptive_weights",
           "basic_histogram", "adaptive_histogram", "RELEASED", "released_first", "marks_message", "marks_arrays", "adaptive_pairs_histogram",
           "Adaptive"]


#: The number of heavy levels C·2^j + 2σ_E: items up to 2^23·C (about 8·10^6·C) are told apart.
LEVELS = 24
#: The heavy levels' ratio (2: a heavy item's users give it between C and 2C, before noise).
LEVEL_RATIO = 2.0
#: The heavy levels are C·2^j + μ·σ_E: an item whose noisy value exceeds one is above C·2^j
#: unless its noise exceeded μ standard deviations.
ESTIMATE_MARGIN = 2.0
#: The low level is T − LOW_MARGIN·σ_E: an item below it is low.
LOW_MARGIN = 1.0
#: A low item's weight, as a fraction of the user's basic weight b = 1/√k.
LOW_FACTOR = 0.1
#: γ: a user's weight on a light item is at most γ·b (so an added user's new items, of
#: whatever kind, each get at most min(1, γ/√k): section 11.2 (e)).
MAX_BOOST = 3.0
#: The bucket of a low item (below every level).
LOW_BUCKET = 0
#: Items of this bucket or above (noisy value above 2C + 2σ_E) are heavy.
HEAVY_BUCKET = 3

#: ℓ = √(rest/L)·(1 − 2^-50): the float rounding of the light items' weight never puts a
#: user's ℓ2 norm above 1.
_DOWN = 1.0 - 2.0 ** -50


def adaptive_weights(buckets) -> np.ndarray:
    """One user's weights on its k kept items, from their estimate buckets.

    b = 1/√k. A low item (bucket ``LOW_BUCKET``) gets ``LOW_FACTOR·b``; a heavy one
    (bucket β ≥ ``HEAVY_BUCKET``) ``b·2^-(β−2)`` (at most b/2); the L light items the same
    ℓ = min(√((1 − Σ others²)/L), γ·b) ≥ b, γ = ``MAX_BOOST`` (with neither low nor heavy
    items, ℓ = b: Weighted Gaussian's weights to the bit). Every weight is > 0 and at most
    min(1, γ·b), and the ℓ2 norm is at most 1 (Weighted Gaussian's k·b² with only light
    items): what the proof uses (``docs/mechanisms.md`` section 11).
    """
    buckets = np.asarray(buckets, dtype=np.int64)
    k = buckets.size
    if k == 0:
        return np.zeros(0)
    b = 1.0 / math.sqrt(k)
    heavy = buckets >= HEAVY_BUCKET
    low = buckets == LOW_BUCKET
    light = ~(heavy | low)
    w = np.full(k, b)
    if light.all():  # Weighted Gaussian's weights, to the bit
        return w
    w[heavy] = b * np.power(LEVEL_RATIO, -(buckets[heavy] - 2).astype(np.float64))
    w[low] = b * LOW_FACTOR
    count = int(light.sum())
    if count:
        rest = max(0.0, 1.0 - float(np.sum(w[~light] ** 2)))
        w[light] = min(math.sqrt(rest / count) * _DOWN, MAX_BOOST * b)
    return w


class Adaptive(Mechanism):
    """Adaptive weighting: by a DP estimate, items far above the cutoff (heavy) and far
    below the threshold (low) give their users' budget to the users' other items
    (``docs/mechanisms.md`` section 11).

    Args:
      epsilon: ε > 0 of the (ε, δ)-DP guarantee of the whole release (both stages).
      delta: 0 < δ < 1: half for the two Gaussian stages together, half for the
        thresholds (ε must exceed −log(1 − δ/2)).
      max_items: Δ0 ≥ 1 (default 100), distinct items kept per user. No effect on the
        guarantee (the thresholds account for it).
      release_rounds: 1 (``adaptive``, default: the estimate is not released) or 2
        (``adaptive-2r``: the estimate releases the items above its own threshold, and
        the second stage works on the others). No effect on the guarantee.
      estimate_share: s in (0, 1) (default 0.2), the
        estimate's share of the Gaussian precision 1/σ²; the adaptive round has the rest,
        and its release statistic combines both, so it has the whole precision. No effect
        on the guarantee; a larger s tells heavy and low items apart better (and, with
        two rounds, releases more in the first) but moves the release statistic towards
        the unadapted weights.
      alpha: α ≥ 0 (default 3): the cutoff C = T + α·σ; an item whose estimate is above
        2C + 2σ_E is heavy, and its users still give it more than C. No effect on the
        guarantee.
    """

    _policy_weights = True  # a user's weights are not 1/√k each (units' wording)

    composition = "gaussian"

    @staticmethod
    def gaussian_epsilon_of(epsilon: float, delta: float) -> float:
        """ε_G = ε + log(1 − δ/2), one step below: the Gaussian stages' ε (section 11.2)."""
        return math.nextafter(epsilon + math.log1p(-delta / 2.0), 0.0)

    def __init__(self, epsilon: float, delta: float, max_items: int = DEFAULT_MAX_ITEMS,
                 release_rounds: int = 1, estimate_share: Optional[float] = None,
                 alpha: float = DEFAULT_ALPHA):
        epsilon, delta = cal.check_epsilon(epsilon), cal.check_delta(delta)
        max_items = cal.check_max_items(max_items)
        if isinstance(release_rounds, bool) or not isinstance(release_rounds, int) or \
                release_rounds not in (1, 2):
            raise ValueError(f"release_rounds must be 1 or 2, got {release_rounds!r}")
        if estimate_share is None:
            estimate_share = DEFAULT_ESTIMATE_SHARE
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
        # The thresholds' δ/2: adaptive-2r's first round takes s of it (its statistic is the
        # estimate: means 1/√t); the adaptive round the rest (means at most m(t),
        # calibration.adaptive_threshold). Scaled down by 10^-12 so they never sum above δ/2.
        down = 1.0 - 1e-12
        first = delta / 2.0 * s * down if release_rounds == 2 else 0.0
        last = (delta / 2.0 - first) * down
        # The Gaussian stages: precisions s/σ² and (1 − s)/σ², σ = AGM(ε_G, δ/2, 1) with
        # ε_G = ε + log(1 − δ/2) (slightly below ε): the new items' release event, which
        # has probability at most δ/2, then costs no δ in either direction (section 11.2).
        self.gaussian_epsilon = self.gaussian_epsilon_of(epsilon, delta)
        if self.gaussian_epsilon <= 0:
            raise ValueError(f"epsilon = {epsilon:g} is too small for delta = {delta:g}: "
                             f"adaptive weighting needs epsilon > -log(1 - delta/2) = "
                             f"{-math.log1p(-delta / 2.0):.3g}")
        self.sigma = cal.weighted_gaussian_sigma(self.gaussian_epsilon, delta)
        self.estimate_sigma, self.adaptive_sigma = cal.adaptive_sigmas(
            self.gaussian_epsilon, delta, [s, 1.0 - s])
        # The released statistic s·Ŵ + (1 − s)·(A + Z′): its noise's σ, as the stages'
        # (raised) σs give it, rounded up; the thresholds use it.
        sigma_x = math.sqrt((s * self.estimate_sigma) ** 2
                            + ((1.0 - s) * self.adaptive_sigma) ** 2)
        self.statistic_sigma = math.nextafter(math.nextafter(sigma_x, math.inf), math.inf)
        self.rounds = []
        if release_rounds == 2:
            self.rounds.append(RoundCalibration(
                cal.adaptive_threshold(self.estimate_sigma, first, max_items),
                "gaussian", self.estimate_sigma, max_items, "l2", delta=first))
        threshold = cal.adaptive_threshold(self.statistic_sigma, last, max_items, s, MAX_BOOST)
        self.rounds.append(RoundCalibration(threshold, "gaussian", self.statistic_sigma,
                                            max_items, "l2", delta=last))
        self.cutoff = cal.policy_cutoff(threshold, self.statistic_sigma, alpha)
        self.low_level = threshold - LOW_MARGIN * self.estimate_sigma
        self.levels = [self.low_level] + [
            x + ESTIMATE_MARGIN * self.estimate_sigma
            for x in cal.adaptive_levels(self.cutoff, LEVELS, LEVEL_RATIO)]
        self.guarantee = PrivacyGuarantee(
            epsilon, delta,
            note=f"(ε, δ)-DP: the estimate and the adaptive round are Gaussian mechanisms "
                 f"whose precisions sum to that of σ = AGM(ε + log(1 − δ/2), δ/2, 1) = "
                 f"{self.sigma:.6g}; an added user's new items are released with probability "
                 f"at most δ/2")

    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d["units"].pop("cutoff", None)
        d["units"].pop("per_round", None)
        d.update({
            "estimate_share": self.estimate_share,
            "estimate": {"sigma": self.estimate_sigma, "cutoff": self.cutoff,
                         "low_level": self.low_level,
                         "heavy_levels": [self.levels[1], LEVEL_RATIO, len(self.levels) - 1],
                         "released": len(self.rounds) == 2},
            "alpha": self.alpha,
        })
        d["units"].update({
            "estimate_share": "the estimate's share of the Gaussian precision 1/σ² (the "
                              "adaptive round has the rest; its release statistic "
                              "combines both)",
            "estimate": "the estimate: its Gaussian σ_E, the cutoff C = T + α·σ, the low "
                        "level T − σ_E (an item whose noisy value is below it is low), the "
                        "heavy levels [C + 2σ_E, ratio, count] (C·ratio^j + 2σ_E; an item "
                        "above the second is heavy), and whether its items above its own "
                        "threshold are released (adaptive-2r)",
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
        # (adaptive: a placeholder threshold, never decided; the noise is what is read)
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
        from beam_dpsu.dp.data import columnar_text
        data, starts, lengths = columnar_text.string_spans(items)
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
        from beam_dpsu.dp.data import columnar_text
        if len(items) == 0:
            return np.zeros(0, bool)
        data, starts, lengths = columnar_text.string_spans(items)
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
        add_user_to_histogram(hist, items, "l2")
    return hist


def adaptive_histogram(kept: Mapping[Any, list], buckets: Mapping[Any, int],
                       released=()) -> Dict[Any, float]:
    """A: every user weighs its kept items not in ``released`` by ``adaptive_weights``
    of their buckets (an item missing from ``buckets`` is low)."""
    hist: Dict[Any, float] = {}
    for items in kept.values():
        mine = [item for item in items if item not in released]
        if not mine:
            continue
        weights = adaptive_weights([buckets.get(item, LOW_BUCKET) for item in mine])
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


def marks_message(items, marks) -> bytes:
    """One Arrow IPC message of ``(item, mark)`` rows: a string array and int marks (a
    shard's buckets of the items that are not low), for ``marks_arrays``."""
    import pyarrow as pa
    batch = pa.RecordBatch.from_arrays([items, pa.array(np.asarray(marks, np.int64))],
                                       names=["item", "mark"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def marks_arrays(marks):
    """``(items, marks)`` arrays (an Arrow string array, an int64 array) of marks in any
    order and form, each item once, a released item ``RELEASED`` whatever else it is
    marked (``released_first`` on arrays: ``RELEASED`` is the smallest mark). ``marks``:
    ``(item, bucket or RELEASED)`` pairs and ``marks_message`` messages, mixed."""
    import pyarrow as pa
    parts, pairs = [], []
    for m in marks:
        if isinstance(m, (bytes, bytearray, memoryview)):
            parts.append(pa.ipc.open_stream(pa.py_buffer(m)).read_all())
        else:
            pairs.append(m)
    if pairs:
        parts.append(pa.table({"item": pa.array([m[0] for m in pairs], pa.string()),
                               "mark": pa.array([m[1] for m in pairs], pa.int64())}))
    if not parts:
        return pa.array([], pa.string()), np.zeros(0, np.int64)
    table = pa.concat_tables([t.cast(parts[0].schema) for t in parts])
    table = table.group_by("item").aggregate([("mark", "min")])
    return (table.column("item").combine_chunks(),
            table.column("mark_min").to_numpy().astype(np.int64))


def adaptive_pairs_histogram(pairs, max_items: Optional[int], sample_key: Optional[bytes],
                             marks):
    """A user group's partial adaptive histogram on its distinct pairs
    (``columnar.GroupPairs``): each user keeps the Δ0 items ``sample_items`` keeps under
    ``sample_key`` (all with ``max_items`` None), drops those marked ``RELEASED`` and
    weighs the rest by ``adaptive_weights`` of their buckets, as ``adaptive_histogram``
    does with dicts. ``marks``: ``(items, marks)`` arrays (``marks_arrays``) or a
    ``{item: mark}`` mapping; an item they lack is low. Returns a
    ``columnar.GroupHistogram``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from beam_dpsu.dp.data import columnar
    if isinstance(marks, Mapping):
        marks = (pa.array(list(marks), pa.string()),
                 np.fromiter(marks.values(), np.int64, len(marks)))
    listed, values = marks
    bucket = np.zeros(len(pairs.items), np.int64)
    if len(listed) and len(pairs.items):
        where = pc.index_in(pairs.items, value_set=listed)
        found = np.flatnonzero(where.is_valid().to_numpy(zero_copy_only=False))
        if found.size:
            at = where.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            bucket[found] = values[at[found]]
    keep = columnar.sampled_pairs(pairs, max_items, sample_key)
    u, i = pairs.u[keep], pairs.i[keep]
    beta = bucket[i]
    live = beta != RELEASED
    u, i, beta = u[live], i[live], beta[live]
    users = len(pairs.users)
    k = np.bincount(u, minlength=users)
    b = 1.0 / np.sqrt(np.maximum(k, 1).astype(np.float64))
    heavy = beta >= HEAVY_BUCKET
    low = beta == LOW_BUCKET
    other = heavy | low
    w = b[u]                                              # all light: b itself
    w[heavy] = w[heavy] * np.power(LEVEL_RATIO, -(beta[heavy] - 2).astype(np.float64))
    w[low] = w[low] * LOW_FACTOR
    mixed_users = np.zeros(users, bool)
    mixed_users[u[other]] = True
    if mixed_users.any():
        squares = np.bincount(u[other], weights=w[other] ** 2, minlength=users)
        light = k - np.bincount(u[other], minlength=users)
        ell = np.minimum(np.sqrt(np.maximum(0.0, 1.0 - squares) / np.maximum(light, 1))
                         * _DOWN, MAX_BOOST * b)
        mixed = mixed_users[u] & ~other
        w[mixed] = ell[u[mixed]]
    hist = np.bincount(i, weights=w, minlength=len(pairs.items))
    present = np.flatnonzero(hist > 0)
    return columnar.GroupHistogram(pairs.items.take(pa.array(present)), hist[present],
                                   users)
