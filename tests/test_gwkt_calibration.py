"""GW-KT's Δ0, M and κ from a DP estimate of the private data's scale (docs/gw.md
sections 3 and 5).

Each condition of the argument, tested directly: the estimate's sensitivity on
neighbouring datasets, its noise, the exact split of ε, condition (a′) given the
estimate (Δ0, M, κ and every other user's kept items depend on the DP output and public
data only), the rules against their definitions, the command line equal to the
Beam-free run, and the statement.
"""
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.dp.data.contribution import per_user_counts
from beam_dpsu.dp.mechanisms.activity import (ScaleEstimate, activity_buckets, release_scale,
                                              scale_statistics)
from beam_dpsu.dp.mechanisms.policy import (FRONT_SCALE_RANGE, GWKT, front_margin_for,
                                            front_scale_from_estimate,
                                            max_items_from_estimate)
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.privacy.params import (ACTIVITY_BUCKETS, CALIBRATED_MARGIN_FRACTION,
                                 CALIBRATED_MIN_SCALES, CALIBRATED_WIDTH_DIVISOR,
                                 CALIBRATED_WIDTH_RANGE, DEFAULT_FRONT_MARGIN,
                                 DEFAULT_FRONT_SCALE, FRONT_SCALE_FACTOR,
                                 gw_default_max_items, gwkt_default_max_items)
from beam_dpsu.dp.mechanisms.registry import make_mechanism

PUBLIC = {f"i{j}": max(1, 3000 // j) for j in range(1, 300)}


@pytest.fixture(scope="module")
def per_user():
    return per_user_counts(synthetic.occurrences(2000, seed=4, max_occurrences=300))


def test_split_epsilon_never_exceeds_the_total():
    rng = np.random.default_rng(1)
    for eps, share in [(3.0, 0.02), (1e-9, 0.5), (0.1, 1e-9)] + [
            (float(e), float(s)) for e, s in zip(10 ** rng.uniform(-3, 1, 2000),
                                                  rng.uniform(1e-6, 0.999, 2000))]:
        a, b = cal.split_epsilon(eps, share)
        assert a > 0 and b > 0 and Fraction(a) + Fraction(b) <= Fraction(eps)
        assert a == pytest.approx(eps * share, rel=1e-12)
    for bad in (0, 1, -0.1, 1.5, True):
        with pytest.raises(ValueError):
            cal.split_epsilon(1.0, bad)


def test_the_estimates_noise_scale_is_its_sensitivity_over_epsilon():
    assert cal.scale_estimate_noise_scale(0.06) == pytest.approx(1 / 0.06, rel=1e-15)
    assert cal.scale_estimate_noise_scale(2.0) == 0.5


def _estimate(users, epsilon=0.1):
    """An estimate whose kept buckets sum to ``users`` (all in the second bucket)."""
    return ScaleEstimate((0.0, float(users), 0.0, 0.0), epsilon)


def test_buckets_against_powers_of_four():
    def by_hand(n):  # the largest b < ACTIVITY_BUCKETS with 4**b <= n, in integers
        b = 0
        while b + 1 < ACTIVITY_BUCKETS and 4 ** (b + 1) <= n:
            b += 1
        return b
    ns = list(range(1, 300)) + [4 ** k + d for k in range(1, 12) for d in (-1, 0, 1)]
    assert activity_buckets(np.array(ns)).tolist() == [by_hand(n) for n in ns]
    with pytest.raises(ValueError):
        activity_buckets(np.array([3, 0]))


def test_one_user_moves_one_bucket_by_one(per_user):
    # neighbouring datasets: D and D + x, whatever x holds (ℓ1 sensitivity 1)
    before = scale_statistics(per_user.values())
    assert before.sum() == len(per_user)
    for x in ({"a": 1}, {f"x{j}": 3 for j in range(5)}, {f"x{j}": 1 for j in range(500)},
              {f"x{j}": 2 for j in range(10 ** 5)}):
        diff = scale_statistics(list(per_user.values()) + [x]) - before
        assert np.abs(diff).sum() == 1 and diff.min() == 0


def test_the_estimate_is_laplace_of_that_scale_in_every_bucket():
    # 4000 independent keys: |noise|/b is Exp(1), mean 1, sd 1; each bucket's mean of
    # 4000 is within 6 standard errors (0.095), each check failing with probability
    # below 3e-9, the buckets' noises uncorrelated (|r| < 6/√4000 likewise): 14 checks,
    # false-failure probability below 1e-7 for the whole test
    scale = cal.scale_estimate_noise_scale(0.5)
    counts = np.array([1000, 30, 0, 7])
    draws = np.array([release_scale(counts, 0.5, RunKey.from_test_seed(s)).buckets
                      for s in range(4000)]) - counts
    for b in range(ACTIVITY_BUCKETS):
        assert abs(np.mean(np.abs(draws[:, b])) / scale - 1) < 0.095
        assert abs(np.mean(draws[:, b])) / scale < 6 * math.sqrt(2 / 4000)
    r = np.corrcoef(draws.T)
    assert np.abs(r[np.triu_indices(ACTIVITY_BUCKETS, 1)]).max() < 6 / math.sqrt(4000)
    with pytest.raises(ValueError):
        release_scale([1, 2, 3], 0.5, RunKey.from_test_seed(1))


def test_the_estimates_reading_against_a_hand_computation():
    eps = 0.1                                   # noise scale 10: a bucket below 20 is empty
    est = ScaleEstimate((30.0, 19.9, 60.0, 10.0), eps)
    assert est.kept().tolist() == [30.0, 0.0, 60.0, 0.0]
    assert est.users == 90.0
    # median: 45 of 90; the first bucket holds 30, so 15/60 into [16, 64)
    assert est.activity_quantile(0.5) == pytest.approx(16 * 4 ** 0.25, rel=1e-12)
    assert est.activity_quantile(0.2) == pytest.approx(4 ** (18 / 30), rel=1e-12)
    empty = ScaleEstimate((-5.0, 3.0, 0.0, 1.0), eps)
    assert empty.users == 1.0 and empty.activity_quantile(0.5) == 1.0
    for bad in ((1.0, 2.0), (1.0, 2.0, math.nan, 0.0)):
        with pytest.raises(ValueError):
            ScaleEstimate(bad, eps)


def test_the_width_and_margin_rules_against_their_definitions():
    low, high = CALIBRATED_WIDTH_RANGE
    for eps in (0.5, 1.0, 3.0, 5.0, 12.0):
        unit = gw_default_max_items(eps)
        for buckets in ((500.0, 0, 0, 0), (0, 500.0, 0, 0), (0, 100.0, 400.0, 0),
                        (0, 0, 0, 500.0), (0, 0, 0, 0)):
            est = ScaleEstimate(buckets, 0.1)
            want = min(high * unit, max(low * unit,
                                        est.activity_quantile(0.5) / CALIBRATED_WIDTH_DIVISOR))
            got = max_items_from_estimate(est, eps)
            assert got == max(1, int(math.floor(want + 0.5)))
            assert 1 <= got <= max(1, round(high * unit))
    for d0 in (1, 2, 3, 5, 10, 16, 20, 33, 100):
        assert front_margin_for(d0) == int(math.floor(CALIBRATED_MARGIN_FRACTION * d0 + 0.5))
        assert 0 <= front_margin_for(d0) <= d0


def test_the_rank_rule_against_its_definition():
    # κ = factor · mean_{k ≤ K} k·c_(k) / N̂, K = ⌊N̂/Γ⌋, computed by hand
    counts = {f"i{j}": c for j, c in enumerate([50, 40, 40, 12, 9, 3, 1])}
    est = _estimate(20.7)
    ranked = sorted(counts.values(), reverse=True)
    k_max = int(20.7 / 5.0)                                   # 4
    want = FRONT_SCALE_FACTOR * sum((k + 1) * ranked[k] for k in range(k_max)) / k_max / 20.7
    assert front_scale_from_estimate(est, counts, 5.0) == pytest.approx(want, rel=1e-12)
    # K at least 1, at most the public items; N̂ at least 1; κ kept in its range
    assert front_scale_from_estimate(_estimate(-40.0), counts, 5.0) == \
        min(FRONT_SCALE_RANGE[1], FRONT_SCALE_FACTOR * 50.0)
    huge = front_scale_from_estimate(_estimate(1e9), counts, 0.5)
    assert huge == max(FRONT_SCALE_RANGE[0], FRONT_SCALE_FACTOR * np.mean(
        [(k + 1) * c for k, c in enumerate(ranked)]) / 1e9)


def test_width_margin_kappa_and_every_kept_set_depend_on_the_estimate_and_public_data_only(
        per_user, monkeypatch):
    # Condition (a′) given the DP output: calibrating on D and on D + x with the same
    # released estimate gives the same Δ0, M and κ, and every user of D keeps the same
    # items in both. The estimate is pinned (the same DP output on both sides); the
    # exact histograms of D and D + x differ.
    from beam_dpsu.dp.mechanisms import policy
    m = GWKT(3.0, 1e-6, PUBLIC, calibration_share=0.02)
    neighbour = dict(per_user)
    neighbour["x"] = {f"i{j}": 1 for j in range(1, 150)}
    assert (scale_statistics(neighbour.values()) != scale_statistics(per_user.values())).any()
    for buckets in ((300.5, 1200.0, 400.0, 100.0), (10.0, 0.0, 0.0, 0.0),
                    (0.0, 0.0, 50.0, 900.0), (0.0, 100.0, 0.0, 0.0)):
        estimate = ScaleEstimate(buckets, m.calibration_epsilon)
        seen = []
        monkeypatch.setattr(policy, "release_scale",
                            lambda hist, eps, key: seen.append(tuple(hist)) or estimate)
        key = RunKey.from_test_seed(9)
        a, b = m.calibrated_on(per_user, key), m.calibrated_on(neighbour, key)
        assert seen[0] != seen[1]                          # the exact statistics differ
        if estimate.informative:
            d0 = max_items_from_estimate(estimate, 3.0)
            want = (d0, front_margin_for(d0), front_scale_from_estimate(estimate, PUBLIC,
                                                                        a.cutoff))
        else:
            want = (gwkt_default_max_items(3.0), DEFAULT_FRONT_MARGIN, DEFAULT_FRONT_SCALE)
        for c in (a, b):
            assert (c.max_items, c.front_margin, c.front_scale) == want
        assert a.rounds == b.rounds and a.cutoff == b.cutoff
        pa_, pb = a.policy(key), b.policy(key)
        for user, counts in per_user.items():
            assert pa_.prepare(user, counts, PUBLIC)[0] == pb.prepare(user, neighbour[user],
                                                                       PUBLIC)[0]


def test_the_guarantee_is_the_exact_composition_of_the_two_stages():
    m = GWKT(3.0, 1e-6, PUBLIC, calibration_share=0.02)
    release_eps = m.rounds[0].noise_scale ** -1            # Laplace scale 1/ε of the release
    assert (m.guarantee.epsilon, m.guarantee.delta) == (3.0, 1e-6)
    assert Fraction(m.calibration_epsilon) + Fraction(release_eps) <= Fraction(3.0)
    assert m.calibration_epsilon == pytest.approx(0.06)
    for buckets in ((0.0, 2000.0, 0.0, 0.0), (2000.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 2000.0)):
        c = m.calibrated(ScaleEstimate(buckets, m.calibration_epsilon))
        # the release's own (ε₂, δ) at the calibrated Δ0: threshold, cutoff, noise
        fixed = GWKT(2.94, 1e-6, PUBLIC, max_items=c.max_items)
        assert c.rounds[0].threshold == fixed.rounds[0].threshold
        assert c.cutoff == fixed.cutoff and c.rounds[0].noise_scale == fixed.rounds[0].noise_scale
        assert (c.guarantee.epsilon, c.guarantee.delta) == (3.0, 1e-6)
    assert m.needs_calibration and not GWKT(3.0, 1e-6, PUBLIC).needs_calibration
    with pytest.raises(ValueError, match="DP estimate"):
        m.policy(RunKey.from_test_seed(1))


def test_an_estimate_of_too_few_users_for_its_noise_keeps_the_fixed_front():
    m = GWKT(3.0, 1e-6, PUBLIC, calibration_share=0.02)
    scale = cal.scale_estimate_noise_scale(m.calibration_epsilon)   # 1/0.06
    floor = CALIBRATED_MIN_SCALES * scale
    weak = ScaleEstimate((0.0, 0.0, floor * 0.99, 0.0), m.calibration_epsilon)
    strong = ScaleEstimate((0.0, 0.0, floor, 0.0), m.calibration_epsilon)
    assert not weak.informative and strong.informative
    c = m.calibrated(weak)
    assert (c.max_items, c.front_margin, c.front_scale) == (
        gwkt_default_max_items(3.0), DEFAULT_FRONT_MARGIN, DEFAULT_FRONT_SCALE)
    assert c.rounds[0].threshold == GWKT(2.94, 1e-6, PUBLIC).rounds[0].threshold
    s = m.calibrated(strong)
    assert (s.max_items, s.front_margin) == (max_items_from_estimate(strong, 3.0),
                                             front_margin_for(s.max_items))
    # an estimate with nothing kept is never informative, however large its ε
    # (N̂ is at least 1 for the rules; what is kept decides)
    for eps in (0.06, 6.0, 600.0):
        assert not ScaleEstimate((0.0, 0.0, 0.0, 0.0), eps).informative
        assert not ScaleEstimate((-3.0, 0.0, -0.5, 0.0), eps).informative


def test_a_width_or_margin_given_is_kept():
    est = ScaleEstimate((0.0, 0.0, 0.0, 5000.0), 0.06)
    free = GWKT(3.0, 1e-6, PUBLIC, calibration_share=0.02).calibrated(est)
    fixed = GWKT(3.0, 1e-6, PUBLIC, calibration_share=0.02, max_items=7,
                 front_margin=1).calibrated(est)
    assert free.max_items == max_items_from_estimate(est, 3.0) != 7
    assert (fixed.max_items, fixed.front_margin) == (7, 1)
    assert fixed.rounds[0].threshold == GWKT(2.94, 1e-6, PUBLIC, max_items=7).rounds[0].threshold


def test_bad_calibration_parameters_are_refused_at_construction():
    for kwargs in ({"calibration_share": 1.0}, {"calibration_share": -0.1},
                   {"calibration_share": 0.02, "front_scale": 12.0},
                   {"calibration_share": 0.02, "kt_selection": "prefix"},
                   {"calibration_share": 0.02, "variant": "published"}):
        with pytest.raises(ValueError):
            GWKT(3.0, 1e-6, PUBLIC, **kwargs)
    with pytest.raises(ValueError):
        GWKT(3.0, 1e-6, PUBLIC, calibration_share=0.02).calibrated(
            _estimate(1.0, epsilon=1.0))   # more ε than the share


def test_the_command_lines_default_is_calibrated_and_flags_choose():
    m = make_mechanism("gw-kt", epsilon=3.0, delta=1e-6, public_counts=PUBLIC)
    assert m.calibration_share == 0.01 and m.needs_calibration
    fixed = make_mechanism("gw-kt", epsilon=3.0, delta=1e-6, public_counts=PUBLIC,
                           front_scale=12.0)
    assert not fixed.calibration_share and fixed.front_scale == 12.0
    off = make_mechanism("gw-kt", epsilon=3.0, delta=1e-6, public_counts=PUBLIC,
                         calibration_share=0.0)
    assert not off.needs_calibration and off.front_scale == 10.0


def _cli_files(per_user, tmp_path):
    """The input (one line per occurrence) and the public counts as files."""
    data = tmp_path / "d.tsv"
    data.write_text("".join(f"{u}\t{i}\n" * n for u, c in per_user.items()
                            for i, n in c.items()))
    public = tmp_path / "pub.tsv"
    public.write_text("".join(f"{i}\t{n}\n" for i, n in PUBLIC.items()))
    return data, public


@pytest.mark.subprocess
def test_the_command_line_equals_the_beam_free_run_and_states_the_share(per_user, tmp_path):
    from beam_dpsu.pipelines import select_partitions
    data, public = _cli_files(per_user, tmp_path)
    out = str(tmp_path / "o")
    summary = select_partitions.run(["--input", str(data), "--output", out, "--mechanism",
                                     "gw-kt", "--epsilon", "3", "--delta", "1e-6",
                                     "--public-counts", str(public), "--insecure-test-seed",
                                     "5", "--quiet", "--tie-break", "item-hash"])
    m = make_mechanism("gw-kt", epsilon=3.0, delta=1e-6, public_counts=PUBLIC,
                       tie_break="item-hash")
    want = sorted(m.run_local(per_user, RunKey.from_test_seed(5)))
    got = open(out + "-items-00000-of-00001", encoding="utf-8").read().splitlines()
    assert want and got == want
    with open(out + ".json", encoding="utf-8") as f:
        stated = json.load(f)
    assert stated["calibration_share"] == 0.01 and stated["calibration_epsilon"] == 0.03
    assert stated["epsilon"] == 3.0 and summary["num_released"] == len(got)
    calibrated = m.calibrated_on(per_user, RunKey.from_test_seed(5))
    assert stated["front_scale"] == calibrated.front_scale   # functions of the DP output
    assert (stated["max_items_per_user"], stated["front_margin"]) == (calibrated.max_items,
                                                             calibrated.front_margin)
    text = json.dumps(stated)
    for value in (*calibrated.scale_estimate.buckets, calibrated.scale_estimate.users):
        assert repr(value) not in text                       # the estimate itself is not
    assert not [f for f in tmp_path.iterdir() if "PRIVATE-run-counts" in f.name]


@pytest.mark.subprocess
def test_with_a_budget_the_statement_describes_the_calibrated_mechanism(per_user, tmp_path):
    from beam_dpsu.pipelines import select_partitions
    data, public = _cli_files(per_user, tmp_path)
    out = str(tmp_path / "o")
    select_partitions.run(["--input", str(data), "--output", out, "--mechanism", "gw-kt",
                           "--budget-epsilon", "3", "--budget-delta", "1e-6",
                           "--public-counts", str(public), "--insecure-test-seed", "5",
                           "--quiet", "--tie-break", "item-hash"])
    with open(out + ".json", encoding="utf-8") as f:
        stated = json.load(f)
    detail = stated["budget"]["parts"][0]["detail"]
    m = make_mechanism("gw-kt", epsilon=3.0, delta=1e-6, public_counts=PUBLIC,
                       tie_break="item-hash")
    c = m.calibrated_on(per_user, RunKey.from_test_seed(5))
    for key, want in (("front_scale", c.front_scale), ("front_margin", c.front_margin),
                      ("cutoff", c.cutoff)):
        assert detail[key] == stated[key] == want
    assert detail["max_items_per_user"] == stated["max_items_per_user"] == c.max_items
    assert c.max_items != m.max_items          # the calibration moved Δ0 (and T with it)


def test_the_estimates_statement_names_the_samplers_floor():
    # the grid Laplace's exponentials stop at 744.4 scales (the smallest double's reach),
    # so the estimate's noise has a largest value: ε-DP up to that 2^-1074 floor, not
    # pure ε-DP; the units say so
    from beam_dpsu.dp.randomness import noise
    top = noise.exponential_from_stream(0, lambda j: 0)                  # U at its smallest
    assert 744.0 < top < 745.0 and math.exp(-top) >= 2.0 ** -1075
    unit = GWKT(3.0, 1e-6, PUBLIC, calibration_share=0.02).describe()["units"][
        "calibration_epsilon"]
    assert "2^-1074" in unit and "not pure" in unit
