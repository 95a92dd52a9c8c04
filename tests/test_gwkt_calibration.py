"""GW-KT's κ from a DP estimate of the private data's scale (docs/gw.md section 5).

Each condition of the argument, tested directly: the estimate's sensitivity on
neighbouring datasets, its noise, the exact split of ε, condition (a′) given the
estimate (κ and every other user's kept items depend on the DP output and public data
only), the command line equal to the Beam-free run, and the statement.
"""
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from beam_dpsu.dp import calibration as cal
from beam_dpsu.dp import synthetic
from beam_dpsu.dp.contribution import per_user_counts
from beam_dpsu.dp.mechanisms.policy import (FRONT_SCALE_RANGE, GWKT, ScaleEstimate,
                                            front_scale_from_estimate, release_scale,
                                            scale_statistics)
from beam_dpsu.dp.noise import RunKey
from beam_dpsu.dp.params import CALIBRATED_FRONT_MARGIN, FRONT_SCALE_FACTOR
from beam_dpsu.dp.registry import make_mechanism

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


def test_one_user_moves_the_count_by_one(per_user):
    # neighbouring datasets: D and D + x, whatever x holds
    before = scale_statistics(per_user.values())
    for x in ({}, {"a": 1}, {f"x{j}": 3 for j in range(500)}):
        assert scale_statistics(list(per_user.values()) + [x]) - before == 1


def test_the_estimate_is_laplace_of_that_scale():
    # 4000 independent keys: |noise|/b is Exp(1), mean 1, sd 1; the mean of 4000 is
    # within 6 standard errors (0.095) with false-failure probability below 1e-8
    scale = cal.scale_estimate_noise_scale(0.5)
    draws = np.array([release_scale(1000, 0.5, RunKey.from_test_seed(s)).users
                      for s in range(4000)])
    assert abs(np.mean(np.abs(draws - 1000)) / scale - 1) < 0.095
    assert abs(np.mean(draws - 1000)) / scale < 6 * math.sqrt(2 / 4000)


def test_the_rank_rule_against_its_definition():
    # κ = factor · mean_{k ≤ K} k·c_(k) / N̂, K = ⌊N̂/Γ⌋, computed by hand
    counts = {f"i{j}": c for j, c in enumerate([50, 40, 40, 12, 9, 3, 1])}
    est = ScaleEstimate(users=20.7, epsilon=0.1)
    ranked = sorted(counts.values(), reverse=True)
    k_max = int(20.7 / 5.0)                                   # 4
    want = FRONT_SCALE_FACTOR * sum((k + 1) * ranked[k] for k in range(k_max)) / k_max / 20.7
    assert front_scale_from_estimate(est, counts, 5.0) == pytest.approx(want, rel=1e-12)
    # K at least 1, at most the public items; N̂ at least 1; κ kept in its range
    assert front_scale_from_estimate(ScaleEstimate(-40.0, 0.1), counts, 5.0) == \
        min(FRONT_SCALE_RANGE[1], FRONT_SCALE_FACTOR * 50.0)
    huge = front_scale_from_estimate(ScaleEstimate(1e9, 0.1), counts, 0.5)
    assert huge == max(FRONT_SCALE_RANGE[0], FRONT_SCALE_FACTOR * np.mean(
        [(k + 1) * c for k, c in enumerate(ranked)]) / 1e9)


def test_kappa_and_every_kept_set_depend_on_the_estimate_and_public_data_only(per_user):
    # Condition (a′) given the DP output: with the same estimate, GW-KT on D and on
    # D + x has the same κ, and every user of D keeps the same items in both.
    m = GWKT(3.0, 1e-6, PUBLIC, calibration_share=0.02)
    estimate = ScaleEstimate(users=2000.5, epsilon=m.calibration_epsilon)
    neighbour = dict(per_user)
    neighbour["x"] = {f"i{j}": 1 for j in range(1, 150)}
    a, b = m.calibrated(estimate), m.calibrated(estimate)
    assert a.front_scale == b.front_scale == front_scale_from_estimate(
        estimate, PUBLIC, m.cutoff)
    assert a.front_margin == CALIBRATED_FRONT_MARGIN
    key = RunKey.from_test_seed(9)
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
    fixed = GWKT(2.94, 1e-6, PUBLIC, max_items=m.max_items)
    assert m.rounds[0].threshold == fixed.rounds[0].threshold   # the release's own (ε, δ)
    assert m.needs_calibration and not GWKT(3.0, 1e-6, PUBLIC).needs_calibration
    with pytest.raises(ValueError, match="DP estimate"):
        m.policy(RunKey.from_test_seed(1))


def test_bad_calibration_parameters_are_refused_at_construction():
    for kwargs in ({"calibration_share": 1.0}, {"calibration_share": -0.1},
                   {"calibration_share": 0.02, "front_scale": 12.0},
                   {"calibration_share": 0.02, "kt_selection": "prefix"},
                   {"calibration_share": 0.02, "variant": "published"}):
        with pytest.raises(ValueError):
            GWKT(3.0, 1e-6, PUBLIC, **kwargs)
    with pytest.raises(ValueError):
        GWKT(3.0, 1e-6, PUBLIC, calibration_share=0.02).calibrated(
            ScaleEstimate(1.0, epsilon=1.0))   # more ε than the share


def test_the_command_lines_default_is_calibrated_and_flags_choose():
    m = make_mechanism("gw-kt", epsilon=3.0, delta=1e-6, public_counts=PUBLIC)
    assert m.calibration_share == 0.02 and m.needs_calibration
    fixed = make_mechanism("gw-kt", epsilon=3.0, delta=1e-6, public_counts=PUBLIC,
                           front_scale=12.0)
    assert not fixed.calibration_share and fixed.front_scale == 12.0
    off = make_mechanism("gw-kt", epsilon=3.0, delta=1e-6, public_counts=PUBLIC,
                         calibration_share=0.0)
    assert not off.needs_calibration and off.front_scale == 10.0


@pytest.mark.subprocess
def test_the_command_line_equals_the_beam_free_run_and_states_the_share(per_user, tmp_path):
    from beam_dpsu.pipelines import select_partitions
    data = tmp_path / "d.tsv"
    data.write_text("".join(f"{u}\t{i}\n" * n for u, c in per_user.items()
                            for i, n in c.items()))
    public = tmp_path / "pub.tsv"
    public.write_text("".join(f"{i}\t{n}\n" for i, n in PUBLIC.items()))
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
    assert stated["calibration_share"] == 0.02 and stated["calibration_epsilon"] == 0.06
    assert stated["epsilon"] == 3.0 and summary["num_released"] == len(got)
    calibrated = m.calibrated_on(per_user, RunKey.from_test_seed(5))
    assert stated["front_scale"] == calibrated.front_scale   # a function of the DP output
    text = json.dumps(stated)
    assert repr(calibrated.scale_estimate.users) not in text  # the estimate itself is not
    assert not [f for f in tmp_path.iterdir() if "PRIVATE-run-counts" in f.name]
