"""The conditions of the histogram family's proof, checked on neighbouring datasets.

``docs/mechanisms.md`` section 3 proves every histogram-and-threshold mechanism
from four conditions. For fuzzed neighbouring pairs (D, D ∪ {x}) under one
fixed key, with the mechanism's own contribution bound and weighting, this
checks each of them directly on the histograms H (of D) and H′ (of D ∪ {x}):

(a) every user of D keeps the same Δ0-sample in both datasets (a user's sample
    depends on their own data and the key only), so H′ − H is exactly x's
    contribution: H ≤ H′ and H′ − H is supported on x's kept items;
(b) the norm of H′ − H (ℓ1 for the Laplace and count rows, ℓ2 for the
    Gaussian ones) is at most the sensitivity the noise scale is calibrated to,
    and that sensitivity is what the calibration used (the Laplace scale is
    sensitivity/ε; the Gaussian σ is AGM(ε, δ/2, sensitivity));
(c) the new items (weight 0 in H, > 0 in H′) are at most Δ0 of x's kept
    items, each with exactly x's per-item weight, which is what the threshold's
    max over t accounts for;
(d) an item of weight 0 is never released, whatever its noise.

DP-SIPS runs the zCDP row once per round on what earlier rounds did not
release: the same checks hold per round for any released set removed from
every user. Top-k's counts change by at most 1 per item and on at most Δ items.

Everything is deterministic (seeded data, test keys): no false-failure
probability to state.
"""
import math

import numpy as np
import pytest

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.data.contribution import sample_items
from beam_dpsu.dp.mechanisms.histogram_threshold import round_histogram
from beam_dpsu.dp.data.weights import user_weight
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.mechanisms.registry import make_mechanism

RK = RunKey.from_test_seed(1913)
EPS, DELTA, MAX_ITEMS = 1.5, 1e-6, 4

# mechanism name -> (norm of the proof, sensitivity in that norm for Δ0)
SENSITIVITY = {
    "count-laplace": ("l1", lambda d: float(d)),
    "count-gaussian": ("l2", lambda d: math.sqrt(d)),
    "weighted-laplace": ("l1", lambda d: 1.0),
    "weighted-gaussian": ("l2", lambda d: 1.0),
    "truncated-geometric": ("linf", lambda d: 1.0),
}


def fuzzed_pairs(n_pairs=40, seed=0):
    """(D, x): D with 5–30 users over a small vocabulary, x with 1–12 items."""
    rng = np.random.default_rng(seed)     # test data only, not a release
    for _ in range(n_pairs):
        vocab = [f"w{k}" for k in range(int(rng.integers(3, 25)))]
        users = {}
        for u in range(int(rng.integers(5, 30))):
            k = int(rng.integers(1, min(10, len(vocab)) + 1))
            items = rng.choice(len(vocab), size=k, replace=False)
            users[f"u{u}"] = {vocab[i]: int(rng.integers(1, 4)) for i in items}
        k = int(rng.integers(1, 13))
        own = [f"x-only{j}" for j in range(k // 2)]
        shared = [vocab[i] for i in rng.choice(len(vocab), size=min(k - len(own), len(vocab)),
                                                replace=False)]
        x = {item: 1 for item in own + shared}
        yield users, ("canary", x)


def norm(diff, which):
    values = np.array(list(diff.values()) or [0.0])
    if which == "l1":
        return float(np.sum(np.abs(values)))
    if which == "l2":
        return float(np.sqrt(np.sum(values * values)))
    return float(np.max(np.abs(values)))


@pytest.mark.parametrize("name", sorted(SENSITIVITY))
def test_fuzzed_neighbours_meet_every_condition_of_the_proof(name):
    mech = make_mechanism(name, epsilon=EPS, delta=DELTA, max_items=MAX_ITEMS)
    r = mech.rounds[0]
    which, sens = SENSITIVITY[name]
    key = RK.subkey("sample/0")
    worst = 0.0
    for users, (x, x_counts) in fuzzed_pairs():
        # H and H′ from the mechanism's own histogram (the function the release uses)
        h = mech.histogram_local(users, RK)
        with_x = dict(users, **{x: x_counts})
        h2 = mech.histogram_local(with_x, RK)
        # (a) the common users keep the same sample, so H′ − H is exactly x's own
        # contribution, computed here from x's sample alone: x's weight on each of x's
        # kept items and 0 elsewhere (H ≤ H′, H′ − H on x's kept items).
        x_kept = set(sample_items(x, x_counts, r.max_items, key))
        assert len(x_kept) <= MAX_ITEMS
        x_weight = user_weight(len(x_kept), r.weighting)
        diff = {u: h2.get(u, 0.0) - h.get(u, 0.0) for u in set(h) | set(h2)}
        for u, d in diff.items():
            assert math.isclose(d, x_weight if u in x_kept else 0.0, rel_tol=1e-9,
                                abs_tol=1e-12), (u, d)
        assert all(d >= -1e-12 for d in diff.values())
        assert {u for u, d in diff.items() if d > 1e-12} <= x_kept
        # (b) the change is within the sensitivity the calibration assumes.
        size = norm(diff, which)
        assert size <= sens(r.max_items) * (1 + 1e-12)
        worst = max(worst, size / sens(r.max_items))
        # (c) new items: x's kept items nobody else has, each with x's own weight.
        new = set(h2) - set(h)
        assert new <= x_kept and len(new) <= MAX_ITEMS
        w = user_weight(len(x_kept), r.weighting)
        assert all(math.isclose(h2[u], w, rel_tol=1e-12) for u in new)
    # The bound is reached on some pair (x with Δ0 items or more), so it is the
    # sensitivity, not a loose bound that would hide a miscalibration.
    assert worst == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("name", ["count-laplace", "weighted-laplace"])
def test_laplace_scale_is_the_l1_sensitivity_over_epsilon(name):
    mech = make_mechanism(name, epsilon=EPS, delta=DELTA, max_items=MAX_ITEMS)
    _, sens = SENSITIVITY[name]
    assert mech.rounds[0].noise == "laplace"
    assert mech.rounds[0].noise_scale == pytest.approx(sens(MAX_ITEMS) / EPS, rel=1e-15)


@pytest.mark.parametrize("name", ["count-gaussian", "weighted-gaussian"])
def test_gaussian_sigma_is_the_agm_of_the_l2_sensitivity(name):
    mech = make_mechanism(name, epsilon=EPS, delta=DELTA, max_items=MAX_ITEMS)
    _, sens = SENSITIVITY[name]
    assert mech.rounds[0].noise == "gaussian"
    assert mech.rounds[0].noise_scale == pytest.approx(
        cal.analytic_gaussian_sigma(EPS, DELTA / 2, sens(MAX_ITEMS)), rel=1e-12)


@pytest.mark.parametrize("name", ["count-laplace", "count-gaussian", "weighted-laplace",
                                  "weighted-gaussian"])
def test_zero_weight_items_are_never_released_by_the_mechanisms_rule(name):
    # (d): a huge noise scale would release a zero-weight item half the time if the
    # rule noised it; it never does.
    mech = make_mechanism(name, epsilon=EPS, delta=DELTA, max_items=MAX_ITEMS)
    rule = mech.release_rule(RunKey.from_test_seed(5))
    assert not any(rule(f"item{i}", 0.0) for i in range(2000))
    assert not any(rule(f"item{i}", -1.0) for i in range(200))


def test_sips_rounds_meet_the_conditions_for_any_removed_set():
    # Each round is the zCDP row on the users' items minus the released set R
    # (a function of earlier DP outputs): for every R, x changes the round's
    # histogram by ≤ 1 in ℓ2, only on x's kept items, new items with x's weight.
    sips = make_mechanism("sips", epsilon=EPS, delta=DELTA, max_items=MAX_ITEMS, rounds=3)
    rng = np.random.default_rng(3)        # test data only
    for i, r in enumerate(sips.rounds):
        assert r.weighting == "l2" and r.max_items == MAX_ITEMS
        assert r.noise_scale == pytest.approx(cal.zcdp_gaussian_sigma(r.rho), rel=1e-15)
        key = RK.subkey(f"sample/{i}")
        for users, (x, x_counts) in fuzzed_pairs(15, seed=i):
            vocab = sorted({u for c in users.values() for u in c})
            removed = set(rng.choice(vocab, size=len(vocab) // 3, replace=False).tolist())

            def strip(counts):
                return {u: c for u, c in counts.items() if u not in removed}
            # the round's own histogram, with the released set removed from every user
            h = round_histogram(users, r, RK, i, removed)
            h2 = round_histogram(dict(users, **{x: x_counts}), r, RK, i, removed)
            diff = {u: h2.get(u, 0.0) - h.get(u, 0.0) for u in set(h) | set(h2)}
            assert norm(diff, "l2") <= 1 + 1e-12
            assert not (set(diff) & removed)
            x_kept = set(sample_items(x, strip(x_counts), MAX_ITEMS, key)) if strip(x_counts) \
                else set()
            assert set(h2) - set(h) <= x_kept


def test_top_k_counts_change_by_one_on_at_most_delta_items():
    from beam_dpsu.dp.mechanisms.topk import item_user_counts
    for users, (x, x_counts) in fuzzed_pairs(20, seed=7):
        h = item_user_counts(users, MAX_ITEMS, RK)
        h2 = item_user_counts(dict(users, **{x: x_counts}), MAX_ITEMS, RK)
        diff = {u: h2.get(u, 0) - h.get(u, 0) for u in set(h) | set(h2)}
        assert all(d in (0, 1) for d in diff.values())
        assert sum(diff.values()) <= MAX_ITEMS
