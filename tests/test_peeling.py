"""Discovery, then peeling: top-k and k-hitting sets over an unknown domain.

Each condition of the privacy argument (docs/mechanisms.md section 10) is checked
directly: the budget split never exceeds the total, ε₀ composes to the peeling
share, the peeling scores have monotone ℓ∞ sensitivity 1 on neighbouring
datasets (with any earlier choices), the selection follows the exponential
mechanism's probabilities, and the Beam run releases exactly the Beam-free run.
"""
import fractions
import math
import random

import apache_beam as beam
import numpy as np
import pytest
from scipy import optimize, stats

from beam_dpsu.dp.data.contribution import canonical_items
from beam_dpsu.dp.mechanisms.peeling import (DiscoverPeelHittingSet, DiscoverPeelTopK,
                                             hitting_scores, item_users, peel_top_k,
                                             peeling_epsilon0, peeling_rounds, split_budget,
                                             user_peeling)
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms.peeling import DiscoverThenPeelTransform
from beam_dpsu.transforms.select import SelectPartitions
from beam_dpsu.transforms.write import WriteOneFile
from conftest import local_pipeline


# -- the budget ---------------------------------------------------------------------

@pytest.mark.parametrize("epsilon,delta,share", [
    (1.0, 1e-5, 0.5), (3.0, 1e-5, 0.3), (0.1, 1e-9, 0.7), (0.3, 3e-7, 0.1),
    (1e-3, 1e-12, 0.999), (7.7, 0.3, 1 / 3)])
def test_the_split_never_spends_more_than_the_total(epsilon, delta, share):
    (e1, d1), (e2, d2) = split_budget(epsilon, delta, share)
    assert min(e1, e2, d1, d2) > 0
    F = fractions.Fraction
    assert F(e1) + F(e2) <= F(epsilon) and F(d1) + F(d2) <= F(delta)
    assert e1 == pytest.approx(share * epsilon) and d1 == pytest.approx(share * delta)
    assert e1 + e2 == pytest.approx(epsilon, rel=1e-12)


def test_the_split_holds_for_many_random_budgets():
    rng = random.Random(5)
    F = fractions.Fraction
    for _ in range(2000):
        epsilon, delta = rng.uniform(1e-3, 10), 10 ** rng.uniform(-12, -1)
        share = rng.uniform(0.01, 0.99)
        (e1, d1), (e2, d2) = split_budget(epsilon, delta, share)
        assert F(e1) + F(e2) <= F(epsilon) and F(d1) + F(d2) <= F(delta)


@pytest.mark.parametrize("bad", [0, 1, -0.5, 1.5, float("nan"), True, "0.5"])
def test_the_share_must_be_in_the_open_unit_interval(bad):
    with pytest.raises(ValueError, match="discovery_share"):
        DiscoverPeelTopK(10, 1.0, 1e-5, discovery_share=bad)


# -- ε₀ of one selection --------------------------------------------------------------

def _zcdp_epsilon(rho, delta):
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


@pytest.mark.parametrize("epsilon,delta,k", [
    (0.5, 5e-6, 1), (0.5, 5e-6, 10), (0.5, 5e-6, 200), (1.5, 5e-6, 50), (0.05, 1e-9, 200),
    (5.0, 1e-3, 3)])
def test_epsilon0_composes_to_the_peeling_budget(epsilon, delta, k):
    e0 = peeling_epsilon0(epsilon, delta, k)
    # Basic composition: k·ε₀ ≤ ε; or the zCDP route: k ε₀²/8-zCDP converts to ≤ ε.
    basic = k * e0 <= epsilon
    zcdp = _zcdp_epsilon(k * e0 * e0 / 8, delta) <= epsilon
    assert basic or zcdp
    # ... and it is the largest ε₀ either route allows: solved independently.
    rho = optimize.brentq(lambda r: _zcdp_epsilon(r, delta) - epsilon, 0, epsilon,
                          xtol=1e-300, rtol=1e-15)
    assert e0 == pytest.approx(max(epsilon / k, math.sqrt(8 * rho / k)), rel=1e-9)


def test_epsilon0_never_composes_above_the_budget_on_random_parameters():
    rng = random.Random(11)
    for _ in range(5000):
        epsilon, delta, k = rng.uniform(1e-3, 10), 10 ** rng.uniform(-12, -1), rng.randint(1, 500)
        e0 = peeling_epsilon0(epsilon, delta, k)
        assert k * e0 <= epsilon or _zcdp_epsilon(k * e0 * e0 / 8, delta) <= epsilon


def test_epsilon0_validates_its_arguments():
    for args in [(0, 1e-5, 3), (1.0, 0, 3), (1.0, 1e-5, 0), (1.0, 1e-5, 2.5)]:
        with pytest.raises(ValueError):
            peeling_epsilon0(*args)


# -- neighbouring datasets: the peeling stage's scores ---------------------------------

def _datasets(seed, users=60, items=12):
    rng = random.Random(seed)
    d = {f"u{u}": {f"x{rng.randrange(items)}": 1 for _ in range(rng.randint(1, 6))}
         for u in range(users)}
    neighbour = dict(d)
    neighbour["added"] = {f"x{i}": 1 for i in rng.sample(range(items + 3), rng.randint(1, 15))}
    return d, neighbour


@pytest.mark.parametrize("seed", range(20))
def test_top_k_scores_move_by_at_most_one_upwards(seed):
    d, neighbour = _datasets(seed)
    domain = [f"x{i}" for i in range(14)]
    h, h2 = item_users(d, domain), item_users(neighbour, domain)
    assert set(h) == set(h2) == set(domain)
    assert all(0 <= h2[x] - h[x] <= 1 for x in domain)   # ℓ∞ 1, monotone, any |W_u|


@pytest.mark.parametrize("seed", range(20))
def test_hitting_set_scores_move_by_at_most_one_upwards_after_any_choices(seed):
    d, neighbour = _datasets(seed)
    items = [f"x{i}" for i in range(14)]
    rng = random.Random(seed)
    for _ in range(10):
        chosen = rng.sample(items, rng.randint(0, 6))       # any (public) history
        a = hitting_scores(d.values(), items, chosen)
        b = hitting_scores(neighbour.values(), items, chosen)
        assert np.all(b - a >= 0) and np.all(b - a <= 1)


@pytest.mark.parametrize("seed", range(8))
def test_each_round_scores_the_users_not_yet_hit(seed):
    d, _ = _datasets(seed)
    domain = [f"x{i}" for i in range(12)]
    items = canonical_items(domain)
    chosen = []
    for scores, pick in peeling_rounds(d.values(), domain, 8, 0.5, RunKey.from_test_seed(seed)):
        expected = hitting_scores(d.values(), items, chosen)
        expected[[items.index(c) for c in chosen]] = -np.inf
        assert np.array_equal(scores, expected)
        chosen.append(pick)
    assert len(chosen) == 8 == len(set(chosen))


# -- the selections follow the exponential mechanism -------------------------------------

def test_peel_top_k_picks_first_with_the_softmax_probability():
    # Two items, counts 3 and 1, Gumbel scale 2: P(first is "a") = e^{3/2}/(e^{3/2}+e^{1/2})
    # = 0.7311. Over 20,000 independent keys the count of "a" first lies outside the
    # binomial's 5e-7 and 1 - 5e-7 quantiles with probability below 1e-6.
    p = math.exp(1.5) / (math.exp(1.5) + math.exp(0.5))
    n = 20000
    first_a = sum(peel_top_k({"a": 3, "b": 1}, 1, 2.0, RunKey.from_test_seed(s))[0][1] == "a"
                  for s in range(n))
    lo, hi = stats.binom.ppf(5e-7, n, p), stats.binom.isf(5e-7, n, p)
    assert lo <= first_a <= hi   # false-failure probability < 1e-6


def test_peel_top_k_orders_a_clear_ranking_and_stops_at_the_domain():
    counts = {f"x{i}": 1000 * (10 - i) for i in range(10)}
    rows = peel_top_k(counts, 4, 1.0, RunKey.from_test_seed(1))
    assert rows == [(1, "x0"), (2, "x1"), (3, "x2"), (4, "x3")]
    assert len(peel_top_k(counts, 50, 1.0, RunKey.from_test_seed(1))) == 10
    assert peel_top_k({}, 5, 1.0, RunKey.from_test_seed(1)) == []


def test_user_peeling_with_negligible_noise_is_the_greedy_hitting_set():
    # x0 has the most users, but x1 and x2 together hit users x0 misses: greedy takes
    # x0, then the best among the users left.
    users = ([{"x0", "x1"}] * 50 + [{"x0"}] * 30 + [{"x2"}] * 40 + [{"x3", "x2"}] * 10
             + [{"x4"}] * 5)
    rows = user_peeling(users, ["x0", "x1", "x2", "x3", "x4"], 3, 1e-6, RunKey.from_test_seed(2))
    assert rows == [(1, "x0"), (2, "x2"), (3, "x4")]


# -- the mechanisms ---------------------------------------------------------------------------

def _per_user(users=3000):
    return {f"u{i}": dict({f"w{j}": 1 for j in range(i % 9 + 1)}, **{f"own{i}": 1})
            for i in range(users)}


def test_the_mechanisms_state_the_whole_budget_and_describe_both_stages():
    m = DiscoverPeelTopK(20, 1.0, 1e-5, max_items=50)
    g = m.guarantee
    assert (g.epsilon, g.delta) == (1.0, 1e-5)
    d = m.describe()
    assert d["discovery"]["epsilon"] + d["peeling"]["epsilon"] <= 1.0
    assert d["peeling"]["epsilon_per_selection"] == peeling_epsilon0(0.5, 5e-6, 20)
    assert d["max_items_per_user"] == 50 and set(d["units"]) >= {"epsilon", "peeling"}
    h = DiscoverPeelHittingSet(5, 3.0, 1e-6, discovery_share=0.25)
    assert h.discovery.guarantee.epsilon == pytest.approx(0.75)


def test_top_k_releases_only_discovered_items_in_rank_order():
    per_user = _per_user()
    m = DiscoverPeelTopK(6, 1.0, 1e-5, max_items=10)
    key = RunKey.from_test_seed(3)
    domain = m.discover_local(per_user, key)
    rows = m.run_local(per_user, key)
    assert [r for r, _ in rows] == list(range(1, len(rows) + 1)) and len(rows) <= 6
    assert {x for _, x in rows} <= domain
    assert not any(x.startswith("own") for _, x in rows)   # a user's own item is never found


def test_hitting_set_chooses_k_distinct_discovered_items():
    per_user = _per_user()
    m = DiscoverPeelHittingSet(6, 1.0, 1e-5, max_items=10)
    key = RunKey.from_test_seed(4)
    rows = m.run_local(per_user, key)
    domain = m.discover_local(per_user, key)
    assert len(rows) == min(6, len(domain)) and len({x for _, x in rows}) == len(rows)
    assert {x for _, x in rows} <= domain and rows[0][1] == "w0"   # w0 hits every user


@pytest.mark.parametrize("mechanism", [DiscoverPeelTopK(6, 1.0, 1e-5, 10),
                                       DiscoverPeelHittingSet(6, 1.0, 1e-5, 10)],
                         ids=["top-k", "hitting-set"])
def test_beam_releases_what_the_local_run_releases(mechanism, tmp_path):
    per_user = _per_user()
    pairs = [(u, x) for u, items in per_user.items() for x in items]
    key = RunKey.from_test_seed(7)
    path = str(tmp_path / "rows")
    with local_pipeline() as p:
        (p | beam.Create(pairs) | SelectPartitions(mechanism, key)
         | beam.Map(repr) | WriteOneFile(path, sorted))
    expected = sorted(repr(r) for r in mechanism.run_local(per_user, key))
    assert open(path).read().splitlines() == expected and expected
    with local_pipeline() as p:
        (p | beam.Create(pairs) | DiscoverThenPeelTransform(mechanism, key)
         | beam.Map(repr) | WriteOneFile(path + "2", sorted))
    assert open(path + "2").read() == open(path).read()


# -- the empirical audit ----------------------------------------------------------------------

@pytest.mark.parametrize("mechanism", [DiscoverPeelTopK(3, 1.0, 1e-3, max_items=4),
                                       DiscoverPeelHittingSet(3, 1.0, 1e-3, max_items=4)],
                         ids=["top-k", "hitting-set"])
def test_the_auditor_finds_no_epsilon_above_the_claim(mechanism):
    # The auditor's neighbouring pairs (a canary with its own items, items at the
    # discovery threshold, a pile) against the released items of the ranked rows; its
    # bounds hold together with probability 1 - 1e-8, so a false failure is < 1e-8.
    from beam_dpsu.dp.evaluation import audit
    r = audit.audit(mechanism, 400, audit.CI_CONFIDENCE)
    assert r["epsilon_lower_bound"] <= r["claimed_epsilon"], r
    assert r["passed"] and r["claimed_epsilon"] == 1.0


# -- the command line -------------------------------------------------------------------------

def _input(tmp_path):
    path = tmp_path / "in.tsv"
    path.write_text("".join(f"{u}\t{x}\n" for u, items in _per_user(1500).items() for x in items))
    return str(path)


def test_hitting_set_command_writes_ranked_rows_and_states_the_whole_budget(tmp_path, capsys):
    import json
    from beam_dpsu.pipelines import hitting_set
    data = _input(tmp_path)
    out = str(tmp_path / "hs")
    assert hitting_set.main(["--input", data, "--output", out, "--k", "4", "--epsilon", "1",
                             "--delta", "1e-6", "--max-items-per-user", "10",
                             "--insecure-test-seed", "5", "--quiet"]) == 0
    lines = open(out + "-items-00000-of-00001").read().splitlines()
    assert [l.split("\t")[0] for l in lines] == ["1", "2", "3", "4"]
    assert lines[0] == "1\tw0"                              # w0 hits every user
    summary = json.load(open(out + ".json"))
    assert (summary["epsilon"], summary["delta"], summary["k"]) == (1.0, 1e-6, 4)
    assert summary["discovery"]["epsilon"] + summary["peeling"]["epsilon"] <= 1.0
    # the same release as the Beam-free run under the same seed
    m = DiscoverPeelHittingSet(4, 1.0, 1e-6, 10)
    per_user = _per_user(1500)
    assert [f"{r}\t{x}" for r, x in m.run_local(per_user, RunKey.from_test_seed(5))] == lines


@pytest.mark.parametrize("flags,message", [
    (["--k", "0"], "k"), (["--k", "3", "--discovery-share", "1"], "discovery"),
    (["--k", "3", "--k-bar", "9"], "k-bar")])
def test_hitting_set_command_refuses_bad_parameters_with_one_line(tmp_path, capsys, flags,
                                                                  message):
    from beam_dpsu.pipelines import hitting_set
    rc = hitting_set.main(["--input", _input(tmp_path), "--output", str(tmp_path / "o"),
                           "--epsilon", "1", "--delta", "1e-6", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert not list(tmp_path.glob("o*"))


def test_top_k_discover_peel_releases_the_beam_free_rows_and_refuses_k_bar(tmp_path, capsys):
    import json
    from beam_dpsu.pipelines import top_k
    data = _input(tmp_path)
    out = str(tmp_path / "tk")
    assert top_k.main(["--input", data, "--output", out, "--k", "5", "--method",
                       "discover-peel", "--epsilon", "1", "--delta", "1e-6",
                       "--max-items-per-user", "10", "--insecure-test-seed", "9"]) == 0
    lines = open(out + "-items-00000-of-00001").read().splitlines()
    m = DiscoverPeelTopK(5, 1.0, 1e-6, 10)
    expected = [f"{r}\t{x}" for r, x in m.run_local(_per_user(1500), RunKey.from_test_seed(9))]
    assert lines == expected and len(lines) == 5
    summary = json.load(open(out + ".json"))
    assert summary["mechanism"] == "top-k-discover-peel" and summary["epsilon"] == 1.0
    assert summary["released_of_k"] == "5 of 5"
    capsys.readouterr()
    for bad in (["--k-bar", "9"], ["--with-counts"], ["--epsilon-per-selection", "0.1"]):
        rc = top_k.main(["--input", data, "--output", str(tmp_path / "x"), "--k", "5",
                         "--method", "discover-peel", "--delta", "1e-6", "--epsilon", "1",
                         *bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "does not apply to --method discover-peel" in err[0]


# -- the utility measures and compare --task top-k|hitting-set ----------------------------------

def test_top_k_measures_against_a_hand_computation():
    from beam_dpsu.dp.evaluation import utility
    per_user = {"a": {"x": 1, "y": 1}, "b": {"x": 1}, "c": {"z": 1}, "d": {"x": 1, "z": 1}}
    holders = utility.users_per_item(per_user)
    assert holders == {"x": 3, "y": 1, "z": 2} and utility.user_item_pairs(per_user) == 6
    # k = 2: the top two hold 3 + 2 = 5 pairs; releasing x and y covers 3 + 1.
    assert utility.top_k_missing_mass(holders, ["x", "y"], 2, 6) == pytest.approx(1 / 6)
    assert utility.top_k_missing_mass(holders, [], 2, 6) == pytest.approx(5 / 6)
    assert utility.k_relative_error(holders, ["x", "y"], 2) == 1      # N_(2) = 2, min 1
    assert utility.k_relative_error(holders, ["x"], 2) == 2           # fewer than k: N_(2)
    assert utility.k_relative_error(holders, ["x", "z"], 5) == 0      # N_(5) = 0 past items
    assert utility.users_hit_share(per_user, ["z"]) == 0.5
    assert utility.greedy_hitting_set(per_user, 5) == ["x", "z"]      # then nobody is left


def test_compare_ranks_top_k_methods_and_hitting_sets(tmp_path, capsys):
    import json
    import os
    from beam_dpsu.pipelines import compare
    data = _input(tmp_path)
    for task, methods, key in (("top-k", "limited-domain,limited-domain:k_bar=20,discover-peel",
                                "top_k_missing_mass_mean"),
                               ("hitting-set", "discover-peel:max_items=10", "users_hit_mean")):
        out = str(tmp_path / task)
        assert compare.main(["--input", data, "--output", out, "--task", task, "--k", "4",
                             "--mechanisms", methods, "--epsilon", "1", "--delta", "1e-6",
                             "--trials", "2", "--quiet"]) == 0
        summary = json.load(open(os.path.join(out, "results.PRIVATE.json")))
        rows = [r for r in summary["results"] if r["epsilon"] is not None]
        assert summary["task"] == task and len(rows) == len(methods.split(","))
        assert all(0 <= r[key] <= 1 for r in rows)
        assert open(os.path.join(out, "results.PRIVATE.md")).read().startswith("# PRIVATE")
    hit = json.load(open(tmp_path / "hitting-set" / "results.PRIVATE.json"))["results"]
    assert hit[0]["mechanism"].startswith("greedy") and hit[0]["users_hit_mean"] == 1.0
    capsys.readouterr()
    for bad, message in ((["--task", "top-k"], "needs --k"),
                         (["--task", "top-k", "--k", "3", "--mechanisms", "gw"], "unknown method"),
                         (["--k", "3"], "--k applies")):
        argv = ["--input", data, "--output", str(tmp_path / "x"), "--epsilon", "1",
                "--delta", "1e-6", "--mechanisms", "discover-peel", *bad]
        assert compare.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_the_audit_command_builds_both_mechanisms(capsys):
    import json
    from beam_dpsu.pipelines import audit as audit_cli
    for name in ("top-k-discover-peel", "hitting-set"):
        assert audit_cli.main(["--mechanism", name, "--k", "3", "--epsilon", "1", "--delta",
                               "1e-3", "--max-items-per-user", "4", "--trials", "100",
                               "--quiet"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["mechanism"] == name and report["claimed_epsilon"] == 1.0
    assert audit_cli.main(["--mechanism", "hitting-set", "--epsilon", "1",
                           "--delta", "1e-3"]) == 2
    assert "needs --k" in capsys.readouterr().err
