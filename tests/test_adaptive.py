"""Adaptive weighting: each condition of docs/mechanisms.md section 11.2 on neighbouring
datasets (fuzzed and adversarial), the calibration against independent computations, the
trap of section 11.1, and the parameters a user can pass."""
import math
import random
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.mechanisms.adaptive import (HEAVY_BUCKET, LOW_BUCKET, LOW_FACTOR, MAX_BOOST,
                                              Adaptive,
                                              adaptive_histogram, adaptive_weights,
                                              basic_histogram)
from beam_dpsu.dp.mechanisms import WeightedGaussian
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.mechanisms.registry import make_mechanism
from beam_dpsu.dp.randomness.release_rules import GaussianLevels, NoisyThresholdRule


DELTA = math.exp(-10)


def _norm2(vector) -> Fraction:
    return sum(Fraction(float(x)) ** 2 for x in vector)


# ---- (b) the adaptive weights of one user ------------------------------------------

def test_adaptive_weights_norm_positivity_and_shape():
    rng = random.Random(3)
    for _ in range(3000):
        k = rng.choice([1, 2, 3, 7, 50, 100, 1000])
        buckets = np.array([rng.choice([0, 0, 1, 1, 2, 3, 4, 6, 25]) for _ in range(k)])
        w = adaptive_weights(buckets)
        b = 1.0 / math.sqrt(k)
        heavy, low = buckets >= HEAVY_BUCKET, buckets == LOW_BUCKET
        light = ~(heavy | low)
        assert np.all(w > 0) and np.all(w <= 1)
        if light.all():
            assert np.all(w == b)                              # Weighted Gaussian's
            continue
        assert _norm2(w) <= 1                                  # exactly, in rationals
        assert np.array_equal(w[heavy], b * 2.0 ** -(buckets[heavy] - 2.0))
        assert np.array_equal(w[low], np.full(low.sum(), b * LOW_FACTOR))
        assert np.all(w[heavy | low] <= b)
        if light.any():
            assert np.all(w[light] == w[light][0]) and w[light][0] >= b * (1 - 1e-14)
            assert w[light][0] <= MAX_BOOST * b
            if w[light][0] < MAX_BOOST * b:                    # not capped: all the budget
                assert float(_norm2(w)) == pytest.approx(1.0, rel=1e-12)
    assert adaptive_weights([]).size == 0
    assert np.array_equal(adaptive_weights([1, 2, 1, 2]), np.full(4, 0.5))  # all light
    # three low items give their weight to the light one (up to γ·b)
    w = adaptive_weights([0, 0, 0, 1])
    assert w[3] == pytest.approx(min(math.sqrt(1 - 3 * (0.5 * LOW_FACTOR) ** 2),
                                     MAX_BOOST * 0.5))


def test_new_items_are_light_and_equal():
    # An added user's t′ new items that look light get the same ℓ ≤ 1/√t′, however
    # its other items look; the others at most b = 1/√k (condition (e)).
    rng = random.Random(11)
    for _ in range(2000):
        new = rng.randint(1, 40)
        old = [rng.choice([0, 1, 2, 3, 9]) for _ in range(rng.randint(0, 60))]
        w = adaptive_weights([rng.choice([1, 2]) for _ in range(new)] + old)
        assert np.all(w[:new] == w[0]) and w[0] <= 1 / math.sqrt(new)
        # and new items that are not light get at most b each, however many
        k = new + len(old)
        w = adaptive_weights([rng.choice([0, 3, 7]) for _ in range(new)] + old)
        assert np.all(w[:new] <= 1 / math.sqrt(k))


# ---- (a), (b): neighbouring datasets ---------------------------------------------------

def _random_dataset(rng, users, universe):
    return {f"u{u}": {f"i{rng.randint(0, universe)}": 1
                      for _ in range(rng.choice([1, 2, 3, 5, 30, 150]))}
            for u in range(users)}


def _sparse(hist):
    return {k: v for k, v in hist.items() if v != 0}


def _difference(after, before):
    keys = set(after) | set(before)
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys}


def test_basic_weights_change_by_the_added_user_only():
    rng = random.Random(5)
    m = Adaptive(1.0, DELTA, max_items=20)
    key = RunKey.from_test_seed(1)
    for trial in range(30):
        data = _random_dataset(rng, 40, 60)
        added = {f"i{rng.randint(0, 80)}": 1 for _ in range(rng.choice([1, 4, 25]))}
        kept, kept2 = m.kept_items(data, key), m.kept_items(dict(data, v=added), key)
        assert {u: kept2[u] for u in kept} == kept          # the others keep the same items
        change = _difference(basic_histogram(kept2), basic_histogram(kept))
        mine = kept2["v"]
        for item, d in change.items():
            assert d == pytest.approx(1 / math.sqrt(len(mine)) if item in mine else 0.0,
                                      abs=1e-12)
        assert sum(d * d for d in change.values()) == pytest.approx(1.0)


def _adversarial(k=25, sharers=260, makers=10):
    """Section 11.1's dataset: ``sharers`` users hold all k items x_i and one item j (so
    j's weight stays below each x_i's), ``makers`` more users hold each x_i alone; the
    added user v holds the k items x_i."""
    data = {f"s{h}": dict({f"x{i}": 1 for i in range(k)}, j=1) for h in range(sharers)}
    for i in range(k):
        for h in range(makers):
            data[f"m{i}-{h}"] = {f"x{i}": 1}
    return data, {f"x{i}": 1 for i in range(k)}


@pytest.mark.parametrize("dataset", ["fuzzed", "adversarial"])
def test_adaptive_change_is_the_added_users_vector(dataset):
    # Given the estimate (any buckets, here those of D′'s estimate and random ones, and
    # any released set, adaptive-2r's removal), the others' adaptive weights do not move:
    # A′ − A is v's own vector, of norm ≤ 1.
    rng = random.Random(7)
    m = Adaptive(3.0, DELTA, max_items=30)
    cases = ([_random_dataset(rng, 50, 70) for _ in range(20)] if dataset == "fuzzed"
             else [_adversarial()[0]])
    for i, data in enumerate(cases):
        added = (_adversarial()[1] if dataset == "adversarial"
                 else {f"i{rng.randint(0, 90)}": 1 for _ in range(rng.choice([1, 3, 40]))})
        key = RunKey.from_test_seed(i)
        kept, kept2 = m.kept_items(data, key), m.kept_items(dict(data, v=added), key)
        items = list(basic_histogram(kept2))
        weights = np.array([basic_histogram(kept2)[x] for x in items])
        _, estimated, _ = m.estimate(items, weights, key)
        released = {x for x in items if rng.random() < 0.2}   # adaptive-2r's first round
        for buckets, gone in ((dict(zip(items, estimated.tolist())), set()),
                              ({x: rng.choice([0, 1, 2, 3, 4, 7]) for x in items}, set()),
                              ({x: rng.choice([0, 1, 2, 3, 4, 7]) for x in items}, released)):
            change = _sparse(_difference(adaptive_histogram(kept2, buckets, gone),
                                         adaptive_histogram(kept, buckets, gone)))
            mine = [x for x in kept2["v"] if x not in gone]
            own = dict(zip(mine, adaptive_weights([buckets[x] for x in mine])))
            assert set(change) <= set(own)
            for item, d in change.items():
                assert d == pytest.approx(own[item], abs=1e-12)
            assert sum(d * d for d in change.values()) <= 1 + 1e-12


def test_exact_weight_rerouting_is_not_one_sensitive():
    # Section 11.1: the proportional rule on the *exact* weights (keep C/W_i of each
    # contribution, re-spend the rest on the user's light items) moves the histogram of
    # the adversarial neighbours by about √k; the test would fail for a 1-sensitive rule.
    k = 25
    data, added = _adversarial(k)
    before = basic_histogram({u: list(c) for u, c in data.items()})
    cap = max(before[f"x{i}"] for i in range(k)) + 1e-9   # every x_i just below the cap
    assert before["j"] < cap

    def exact_rerouting(users):
        basic = basic_histogram({u: list(c) for u, c in users.items()})
        out = {}
        for items in users.values():
            b = 1 / math.sqrt(len(items))
            heavy = [x for x in items if basic[x] > cap]
            light = [x for x in items if basic[x] <= cap]
            back = sum(b * (1 - cap / basic[x]) for x in heavy)
            for x in heavy:
                out[x] = out.get(x, 0.0) + b * cap / basic[x]
            for x in light:
                out[x] = out.get(x, 0.0) + b + back / len(light)
        return out

    change = _difference(exact_rerouting(dict(data, v=added)), exact_rerouting(data))
    assert change["j"] >= math.sqrt(k) / 2   # the indirect change lands on one item
    assert math.sqrt(sum(d * d for d in change.values())) >= math.sqrt(k) / 2


# ---- (c) the stages' precisions and σ --------------------------------------------------

@pytest.mark.parametrize("eps,delta,shares", [(1.0, 1e-5, [0.1, 0.9]), (3.0, DELTA, [0.25, 0.75]),
                                              (0.01, 1e-12, [0.5, 0.5]), (10.0, 0.3, [0.9, 0.1]),
                                              (2.0, 1e-6, [0.1, 0.2, 0.7])])
def test_stage_precisions_sum_to_the_budget(eps, delta, shares):
    sigmas = cal.adaptive_sigmas(eps, delta, shares)
    sigma = cal.weighted_gaussian_sigma(eps, delta)
    # Σ 1/σ_i² ≤ 1/σ² in exact arithmetic, and nearly all of it is spent
    assert sum(1 / Fraction(x) ** 2 for x in sigmas) <= 1 / Fraction(sigma) ** 2
    assert sum(1 / x ** 2 for x in sigmas) == pytest.approx(1 / sigma ** 2, rel=1e-10)
    # σ is the analytic Gaussian mechanism's for (ε, δ/2), checked by its δ(ε) formula
    with mpmath.workdps(50):
        s, e = mpmath.mpf(sigma), mpmath.mpf(eps)
        d = mpmath.ncdf(-e * s + 1 / (2 * s)) - mpmath.e ** e * mpmath.ncdf(-e * s - 1 / (2 * s))
        assert d <= mpmath.mpf(delta) / 2 * (1 + mpmath.mpf(10) ** -9)
        assert d >= mpmath.mpf(delta) / 2 * (1 - mpmath.mpf(10) ** -6)


def test_stage_shares_are_checked():
    for bad in ([], [0.0, 1.0], [0.6, 0.6], [float("nan")], [-0.1, 1.1]):
        with pytest.raises(ValueError):
            cal.adaptive_sigmas(1.0, 1e-5, bad)


# ---- (d) thresholds and new items ---------------------------------------------------

def _independent_threshold(sigma, delta, dmax, share=0, boost=1):
    budget, s = mpmath.mpf(delta), mpmath.mpf(share)
    best = -mpmath.inf
    for t in range(1, dmax + 1):
        per_item = 1 - (1 - budget) ** (mpmath.mpf(1) / t)
        mean = s / mpmath.sqrt(t) + (1 - s) * min(1, boost / mpmath.sqrt(t))
        best = max(best, mean + sigma * mpmath.sqrt(2) * mpmath.erfinv(1 - 2 * per_item))
    return float(best)


@pytest.mark.parametrize("sigma,delta,dmax,share,boost", [
    (1.33, DELTA / 2, 100, 0.2, 3.0), (3.5, 1e-5, 50, 0, 1), (0.2, 1e-9, 10, 0.5, 2.0),
    (5.0, 1e-3, 7, 0.9, 3.0), (1.0, 1e-6, 100, 0.2, 1000.0)])
def test_threshold_against_an_independent_computation(sigma, delta, dmax, share, boost):
    with mpmath.workdps(40):
        expected = _independent_threshold(sigma, delta, dmax, share, boost)
    got = cal.adaptive_threshold(sigma, delta, dmax, share, boost)
    assert got == pytest.approx(expected, rel=1e-9) and got >= expected
    for bad in (dict(share=1.0), dict(share=-0.1), dict(boost=0.5), dict(boost=float("inf"))):
        with pytest.raises(ValueError):
            cal.adaptive_threshold(sigma, delta, dmax, **dict(dict(share=share, boost=boost),
                                                             **bad))


@pytest.mark.parametrize("eps,delta,dmax,rounds", [(1.0, DELTA, 100, 1), (3.0, DELTA, 100, 2),
                                                   (0.1, 1e-12, 30, 1), (8.0, 1e-6, 1000, 2),
                                                   (0.5, 1e-3, 1, 2)])
def test_new_item_release_probability_within_delta(eps, delta, dmax, rounds):
    # Section 11.2 (e): t new items of an added user have statistics at most m(t) plus
    # independent noise of the statistic's σ (the estimate's 1/√t and σ_E in
    # adaptive-2r's first round), whatever their kinds; all of them stay below T but with
    # probability at most the round's share. The shares sum to at most δ/2 in exact
    # arithmetic; the probabilities in 40 digits, without any tolerance.
    m = Adaptive(eps, delta, dmax, release_rounds=rounds)
    s, boost = mpmath.mpf(m.estimate_share), MAX_BOOST
    rounds_ = [(m.rounds[-1], lambda t: s / mpmath.sqrt(t)
                + (1 - s) * min(1, boost / mpmath.sqrt(t)))]
    if rounds == 2:
        rounds_.append((m.rounds[0], lambda t: 1 / mpmath.sqrt(t)))
    assert sum(Fraction(r.delta) for r, _ in rounds_) <= Fraction(delta) / 2
    assert sum(r.delta for r, _ in rounds_) >= delta / 2 * (1 - 1e-9)   # nearly all of it
    assert m.rounds[-1].noise_scale == m.statistic_sigma >= m.sigma
    with mpmath.workdps(40):
        exact = mpmath.sqrt((s * mpmath.mpf(m.estimate_sigma)) ** 2
                            + ((1 - s) * mpmath.mpf(m.adaptive_sigma)) ** 2)
        assert mpmath.mpf(m.statistic_sigma) >= exact        # the statistic's σ, rounded up
        for r, mean in rounds_:
            ts = range(1, dmax + 1) if dmax <= 100 else sorted({1, 2, 3, 10, 100, dmax})
            for t in ts:
                p = mpmath.ncdf(-(mpmath.mpf(r.threshold) - mean(t)) / r.noise_scale)
                assert -mpmath.expm1(t * mpmath.log1p(-p)) <= mpmath.mpf(r.delta), (t, r)


def test_a_new_items_weight_is_at_most_the_bound_of_the_threshold():
    # Whatever the kinds of a user's k items, each weight is at most min(1, γ/√k): what
    # m(t) assumes (k ≥ t, the number of new items).
    rng = random.Random(13)
    for _ in range(3000):
        k = rng.choice([1, 2, 3, 5, 9, 40, 100])
        w = adaptive_weights([rng.choice([0, 0, 0, 1, 2, 3, 8]) for _ in range(k)])
        assert np.all(w <= min(1.0, MAX_BOOST / math.sqrt(k)) * (1 + 1e-15))


def test_the_gaussian_epsilon_leaves_room_for_the_new_items_event():
    # σ = AGM(ε_G, δ/2, 1) with ε_G = ε + log(1 − δ/2) < ε (section 11.2, both directions)
    for eps, delta in ((1.0, 1e-5), (3.0, DELTA), (0.5, 0.3)):
        m = Adaptive(eps, delta)
        assert m.gaussian_epsilon < eps
        assert m.gaussian_epsilon == pytest.approx(eps + math.log1p(-delta / 2), abs=1e-15)
        assert m.sigma == cal.weighted_gaussian_sigma(m.gaussian_epsilon, delta)
    with pytest.raises(ValueError, match="too small"):
        Adaptive(0.1, 0.3)


def test_the_estimate_levels_are_nested_and_match_the_noise():
    key = RunKey.from_test_seed(4)
    levels = [5.0, 10.0, 20.0, 40.0]
    rule = GaussianLevels(6.0, levels, key, "noise/0")
    noise = NoisyThresholdRule("gaussian", 6.0, 1.0, key, "noise/0")
    items = [f"item{i}" for i in range(4000)]
    weights = np.array([(i % 60) * 1.0 for i in range(4000)])        # weight 0 included
    counts = rule.decide(items, weights)
    values = weights + noise.noise_values(items)
    expected = (values[:, None] > np.array(levels)[None, :]).sum(axis=1)
    assert np.array_equal(counts, expected)
    assert counts.min() == 0 and counts.max() == len(levels)
    assert rule("item7", 7.0) == counts[7]
    with pytest.raises(ValueError):
        GaussianLevels(1.0, [2.0, 1.0], key, "noise/0")


# ---- the mechanism ----------------------------------------------------------------------

def test_the_statistic_has_weighted_gaussians_noise():
    # s·Ŵ + (1 − s)·(A + Z′): the noise of Weighted Gaussian at ε_G (up to the stages'
    # 10^-12), against the threshold of means m(t).
    for eps in (0.5, 1.0, 3.0):
        m, wg = Adaptive(eps, DELTA, 100), WeightedGaussian(eps, DELTA, 100)
        sigma = cal.weighted_gaussian_sigma(m.gaussian_epsilon, DELTA)
        assert wg.calibration.noise_scale <= sigma <= m.statistic_sigma <= sigma * (1 + 1e-11)
        assert m.rounds[-1].threshold > wg.calibration.threshold
        assert m.rounds[-1].threshold == cal.adaptive_threshold(
            m.statistic_sigma, DELTA / 2 * (1 - 1e-12), 100, m.estimate_share, MAX_BOOST)
        s = m.estimate_share
        assert (1 - s) ** 2 * m.adaptive_sigma ** 2 + s ** 2 * m.estimate_sigma ** 2 == \
            pytest.approx(sigma ** 2, rel=1e-10)
        assert m.levels[0] == m.rounds[-1].threshold - m.estimate_sigma   # the low level
        assert all(a < b for a, b in zip(m.levels, m.levels[1:]))


def test_a_heavy_items_users_still_give_it_more_than_the_cutoff():
    # Bucket β ≥ 3 means an estimate above C·2^(β−2) + 2σ_E; the users' reduced weights
    # sum to W·2^-(β−2), above C whenever the estimate's noise was below 2σ_E.
    m = Adaptive(3.0, DELTA, 100)
    for beta in range(HEAVY_BUCKET, len(m.levels) + 1):
        lowest_w = m.levels[beta - 1] - 2 * m.estimate_sigma
        assert lowest_w * 2.0 ** -(beta - 2) >= m.cutoff * (1 - 1e-12)


def test_release_is_reproducible_and_statistical_release_rate_of_a_crowd():
    # An item held alone by 200 users (far above T) is always released; one held by one
    # user almost never: false-failure probability below 1e-6 (the bounds are 10σ away).
    m = Adaptive(3.0, DELTA, 100)
    data = {f"u{i}": {"crowd": 1} for i in range(200)}
    data["lone"] = {"rare": 1}
    key = RunKey.from_test_seed(9)
    out = m.run_local(data, key)
    assert out == m.run_local(data, key)
    assert "crowd" in out and "rare" not in out
    two = Adaptive(3.0, DELTA, 100, release_rounds=2).run_local_with_rounds(data, key)
    assert two.get("crowd") == 0 and "rare" not in two


@pytest.mark.parametrize("bad", [dict(estimate_share=0.0), dict(estimate_share=1.0),
                                 dict(estimate_share=True), dict(estimate_share=float("nan")),
                                 dict(estimate_share="0.1"), dict(release_rounds=3),
                                 dict(release_rounds=True), dict(alpha=-1.0),
                                 dict(alpha=float("inf")), dict(max_items=0)])
def test_bad_parameters_fail_at_construction(bad):
    with pytest.raises(ValueError):
        Adaptive(1.0, 1e-5, **bad)


def test_registry_names_and_parameters():
    one = make_mechanism("adaptive", epsilon=1.0, delta=1e-5)
    two = make_mechanism("adaptive-2r", epsilon=1.0, delta=1e-5, estimate_share=0.3)
    assert one.name == "adaptive" and len(one.rounds) == 1 and one.estimate_share == 0.2
    assert two.name == "adaptive-2r" and len(two.rounds) == 2 and two.estimate_share == 0.3
    with pytest.raises(ValueError, match="does not apply"):
        make_mechanism("adaptive", epsilon=1.0, delta=1e-5, rounds=2)
    with pytest.raises(ValueError, match="does not apply"):
        make_mechanism("adaptive", rho=0.1, delta=1e-5)
    d = two.describe()
    assert d["estimate_share"] == 0.3 and d["estimate"]["released"] is True
    assert d["estimate"]["low_level"] == two.levels[0]
    assert set(d) >= {"threshold", "noise_scale", "units", "estimate", "alpha"}
    assert "cutoff" not in d["units"]
