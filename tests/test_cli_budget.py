"""One privacy budget on the command line --budget-epsilon/--budget-delta,
--share, select's --top-k in the same run, top-k calibrated from a total, and
compare's stated (and capped) total over its trials.

What is checked: the share arithmetic (``parse_shares``) against hand-computed
fractions; the composed totals against independent sums (``math.fsum``) and
the zCDP route of ``budget.zcdp_composition_guarantee``; that every release of
a budget run is EXACTLY the release of the same mechanism calibrated by hand
to its share (same test seed); that over-spending is refused with exit status
2 before anything is created; that stale outputs of every release of a run are
found. No statistical assertion: the seeded releases are compared for equality.
"""
import json
import math
import os
from fractions import Fraction

import pytest

from beam_dpsu.dp.mechanisms import budget as B
from beam_dpsu.dp.privacy.accounting import PrivacyGuarantee, readable_up
from beam_dpsu.pipelines.console import UsageError
from beam_dpsu.pipelines import run_budget
from beam_dpsu.pipelines import compare, select_partitions, top_k

ITEMS = "-items-00000-of-00001"
TOPK = "-top-k-00000-of-00001"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # Item "i<j>" is held by 400 − 70·j users (j = 0..5), every user also has a
    # rare item. Top-3 at ε = 2 (the share below): the 4th count is 190, the
    # Gumbel threshold offset 23 users at noise scale β = 1.5, so i0 beats the
    # threshold by 187 users = 125 β: with Gumbel noise on i0 and on the
    # threshold it is missed with probability < 2·e^-60 (the only outcome the
    # tests below need besides equality of seeded runs; with a fixed seed the
    # runs are deterministic anyway).
    path = tmp_path_factory.mktemp("data") / "budget.tsv"
    lines = []
    for u in range(400):
        for j in range(6):
            if u < 400 - 70 * j:
                lines.append(f"user{u}\ti{j}\n")
        lines.append(f"user{u}\trare{u % 50}\n")
    path.write_text("".join(lines), encoding="utf-8")
    return str(path)


def summary(prefix):
    with open(prefix + ".json", encoding="utf-8") as f:
        return json.load(f)


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


# -- the share arithmetic ------------------------------------------------------

def test_parse_shares_defaults_to_an_equal_split():
    assert run_budget.parse_shares(None, ["select"]) == {"select": 1.0}
    assert run_budget.parse_shares([], ["select", "top-k"]) == {"select": 0.5, "top-k": 0.5}


def test_parse_shares_gives_the_rest_to_releases_without_a_share():
    got = run_budget.parse_shares(["top-k=0.2"], ["select", "top-k"])
    assert got == {"select": pytest.approx(0.8, abs=1e-15), "top-k": 0.2}
    got = run_budget.parse_shares(["a=0.4", "b=0.1"], ["a", "b"])
    assert got == {"a": 0.4, "b": 0.1}  # under-spending is allowed


@pytest.mark.parametrize("texts, fragment", [
    (["select=0.8", "top-k=0.3"], "sum to 1.1 > 1"),
    (["select"], "use NAME=FRACTION"),
    (["=0.5"], "use NAME=FRACTION"),
    (["counts=0.5"], "no release named 'counts'"),
    (["select=0.2", "select=0.3"], "twice"),
    (["select=abc"], "must be a number"),
    (["select=0"], "in (0, 1]"),
    (["select=1.5"], "in (0, 1]"),
    (["select=nan"], "in (0, 1]"),
    (["select=1"], "nothing of the budget for top-k"),
])
def test_parse_shares_refuses_what_cannot_be_meant(texts, fragment):
    with pytest.raises(UsageError, match=None) as e:
        run_budget.parse_shares(texts, ["select", "top-k"])
    assert fragment in str(e.value)


def test_compose_guarantees_basic_and_zcdp_routes():
    parts = [PrivacyGuarantee(0.3, 1e-7), PrivacyGuarantee(1.1, 2e-6), PrivacyGuarantee(0.7, 0)]
    g = B.compose_guarantees(parts)
    # the exact sums, rounded up: the float at or just above each, never below
    for got, values in ((g.epsilon, [0.3, 1.1, 0.7]), (g.delta, [1e-7, 2e-6, 0])):
        exact = sum(map(Fraction, values))
        assert Fraction(got) >= exact > Fraction(math.nextafter(got, -math.inf))
    # all zCDP: the zCDP sum converted once at the same total δ, when smaller
    z = [PrivacyGuarantee(1.0, 1e-6, rho=0.01, zcdp_delta=5e-7)] * 10
    g = B.compose_guarantees(z)
    route = B.zcdp_composition_guarantee([(0.01, 5e-7)] * 10, 1e-5)
    assert g.delta == pytest.approx(1e-5) and g.epsilon == pytest.approx(route.epsilon)
    assert g.epsilon < 10.0  # far below basic composition's 10 · 1.0
    # one (ε, δ) part among zCDP ones: basic composition only
    g = B.compose_guarantees(z[:2] + [PrivacyGuarantee(0.5, 1e-6)])
    assert g.epsilon == pytest.approx(2.5) and "basic" in g.note


# -- select: a key set and a top-k from one budget --------------------------------

def test_select_with_top_k_releases_exactly_the_hand_calibrated_releases(data, tmp_path, capsys):
    out = str(tmp_path / "run")
    rc = select_partitions.main([
        "--input", data, "--output", out, "--mechanism", "weighted-gaussian",
        "--max-items-per-user", "4", "--budget-epsilon", "8", "--budget-delta", "1e-5",
        "--top-k", "3", "--share", "top-k=0.25", "--insecure-test-seed", "11", "--quiet"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    s = summary(out)
    # the stated total: basic composition of the two parts, within the budget
    parts = s["budget"]["parts"]
    assert [p["name"] for p in parts] == ["select", "top-k"]
    assert (s["epsilon"], s["delta"]) == (8.0, 1e-5)  # the budget as given
    for key in ("epsilon", "delta"):  # the exact sum rounded up: never below the parts
        spent = s.get("spent_" + key, s[key])
        assert spent == pytest.approx(math.fsum(p[key] for p in parts), rel=1e-15)
        assert Fraction(spent) >= sum(Fraction(p[key]) for p in parts)
        assert spent <= s[key]                   # exactly: within the budget
    assert printed["epsilon"] == readable_up(s["epsilon"]) == 8.0  # readable, rounded up
    assert printed["top_k"]["num_released"] == s["top_k"]["num_released"] >= 1
    # every count's file (the top-k's released count too) was read and deleted
    assert not [f for f in os.listdir(tmp_path) if "PRIVATE-run-counts" in f]
    # the key set: exactly the release of the mechanism calibrated to 3/4 of the budget
    assert (s["release_epsilon"], s["release_delta"]) == (6.0, pytest.approx(7.5e-6))
    alone = str(tmp_path / "alone")
    assert select_partitions.main([
        "--input", data, "--output", alone, "--mechanism", "weighted-gaussian",
        "--max-items-per-user", "4", "--epsilon", repr(s["release_epsilon"]),
        "--delta", repr(s["release_delta"]), "--insecure-test-seed", "11", "--quiet"]) == 0
    assert lines(out + ITEMS) == lines(alone + ITEMS) and len(lines(out + ITEMS)) > 5
    assert s["num_released"] == len(lines(out + ITEMS))
    assert s["threshold"] == summary(alone)["threshold"]
    # the top-k: exactly Algorithm 2 at the per-selection ε of its pay-what-you-get pool,
    # which is the calibration of `top-k --epsilon 2 --delta 2.5e-6` (its share)
    eps_sel, delta_q, _ = B.pay_what_you_get_epsilon(2.0, 2.5e-6, 3, 1)
    assert s["top_k"]["epsilon_per_selection"] == pytest.approx(eps_sel, rel=1e-12)
    ranked = lines(out + TOPK)
    assert ranked[0] == "1\ti0" and len(ranked) == s["top_k"]["num_released"]
    assert [l.split("\t")[0] for l in ranked] == [str(r + 1) for r in range(len(ranked))]
    alone_k = str(tmp_path / "alone-k")
    assert top_k.main(["--input", data, "--output", alone_k, "--k", "3",
                       "--epsilon-per-selection", repr(s["top_k"]["epsilon_per_selection"]),
                       "--delta", repr(delta_q), "--insecure-test-seed", "11", "--quiet"]) == 0
    assert ranked == lines(alone_k + ITEMS)
    whole_k = str(tmp_path / "whole-k")
    assert top_k.main(["--input", data, "--output", whole_k, "--k", "3",
                       "--epsilon", repr(parts[1]["share_epsilon"]),
                       "--delta", repr(parts[1]["share_delta"]), "--insecure-test-seed", "11",
                       "--quiet"]) == 0
    assert ranked == lines(whole_k + ITEMS)
    assert summary(whole_k)["epsilon_per_selection"] == s["top_k"]["epsilon_per_selection"]
    assert parts[1]["detail"]["spent_selections"] == s["top_k"]["charge"]["selections"]
    assert s["top_k"]["items_file"] == "run" + TOPK
    # the key set's own statement moved beside the total, which is the run's
    assert s["release_guarantee"] == summary(alone)["guarantee"]
    assert "basic composition" in s["guarantee"] and "EVERYTHING" in s["units"]["epsilon"]


def test_key_set_and_top_k_draw_from_distinct_purposes(monkeypatch, tmp_path):
    # Independent randomness (what composition needs): under one run key the
    # key set's and the top-k's subkeys are derived for disjoint purposes.
    from beam_dpsu.dp.randomness import noise
    from beam_dpsu.dp.mechanisms.base import run_local
    from beam_dpsu.dp.mechanisms.registry import REGISTRY, make_mechanism
    from beam_dpsu.dp.mechanisms.topk import TopKMechanism
    used = []
    original = noise.RunKey.subkey

    def recording(self, purpose):
        used.append(purpose)
        return original(self, purpose)

    monkeypatch.setattr(noise.RunKey, "subkey", recording)
    per_user = {f"u{u}": {f"i{j}": 1 for j in range(u % 7 + 1)} for u in range(200)}
    counts = tmp_path / "public.tsv"
    counts.write_text("".join(f"i{j}\t{10 - j}\n" for j in range(7)), encoding="utf-8")
    select_purposes = set()
    for name in sorted(REGISTRY):
        kw = {"public_counts": str(counts)} if name == "gw-kt" else {}
        used.clear()
        mech = make_mechanism(name, epsilon=1.0, delta=1e-6, **kw)
        run_local(per_user, mech, noise.RunKey.from_test_seed(1))
        assert used, name
        select_purposes |= set(used)
    used.clear()
    TopKMechanism(k=3, epsilon=1.0, delta=1e-6).run_local(per_user, noise.RunKey.from_test_seed(1))
    topk_purposes = set(used)
    assert topk_purposes and not (topk_purposes & select_purposes)


def test_overspending_shares_exit_2_before_anything_is_created(data, tmp_path, capsys):
    out = str(tmp_path / "sub" / "run")
    rc = select_partitions.main([
        "--input", data, "--output", out, "--mechanism", "weighted-gaussian",
        "--budget-epsilon", "1", "--budget-delta", "1e-6", "--top-k", "3",
        "--share", "select=0.8", "--share", "top-k=0.3"])
    assert rc == 2 and "more than the budget" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "sub")


@pytest.mark.parametrize("flags, fragment", [
    (["--top-k", "3", "--epsilon", "1", "--delta", "1e-6"], "--budget-epsilon"),
    (["--budget-epsilon", "1", "--budget-delta", "1e-6", "--epsilon", "1"], "cannot be given"),
    (["--budget-epsilon", "1"], "give both"),
    (["--epsilon", "1", "--delta", "1e-6", "--share", "select=1"], "--share needs"),
    (["--epsilon", "1", "--delta", "1e-6", "--top-k-bar", "4"], "needs --top-k"),
    (["--budget-epsilon", "0", "--budget-delta", "1e-6"], "--budget-epsilon"),
    (["--budget-epsilon", "1", "--budget-delta", "1e-6", "--top-k", "3", "--top-k-bar", "2"],
     "--top-k-bar"),
    (["--budget-epsilon", "1", "--budget-delta", "1e-6", "--top-k-bar", "5"], "needs --top-k"),
    (["--budget-epsilon", "1", "--budget-delta", "1e-6", "--top-k-max-items", "3"],
     "needs --top-k"),
    (["--budget-epsilon", "1", "--budget-delta", "1e-6", "--share", "top-k=0.5"],
     "needs --top-k"),
    (["--budget-epsilon", "1", "--budget-delta", "1e-6", "--top-k", "3",
      "--top-k-max-items", "0"], "--top-k-max-items"),
])
def test_budget_flag_mistakes_exit_2(data, tmp_path, capsys, flags, fragment):
    rc = select_partitions.main(["--input", data, "--output", str(tmp_path / "x"),
                                 "--mechanism", "weighted-gaussian"] + flags)
    assert rc == 2 and fragment in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_stale_top_k_release_is_found_and_overwritten(data, tmp_path, capsys):
    out = str(tmp_path / "run")
    base = ["--input", data, "--output", out, "--mechanism", "weighted-gaussian",
            "--insecure-test-seed", "2", "--quiet"]
    with_top = base[:-3] + ["--budget-epsilon", "2", "--budget-delta", "1e-5", "--top-k", "3",
                            "--insecure-test-seed", "2", "--quiet"]
    assert select_partitions.main(with_top) == 0
    assert os.path.exists(out + TOPK)
    # even without the summaries and the key set, the top-k file is an earlier release
    for suffix in (".json", ".PRIVATE-run-details.json", ITEMS):
        os.remove(out + suffix)
    capsys.readouterr()
    assert select_partitions.main(base + ["--epsilon", "1", "--delta", "1e-6"]) == 2
    assert "earlier run" in capsys.readouterr().err
    assert select_partitions.main(base + ["--epsilon", "1", "--delta", "1e-6",
                                          "--overwrite"]) == 0
    assert not os.path.exists(out + TOPK)


def test_another_runs_prefix_never_names_a_top_k_file(data, tmp_path):
    # A run under PREFIX.top-k (or PREFIX-top-k) writes files that no --top-k run
    # under PREFIX writes or deletes: the names cannot collide.
    out = str(tmp_path / "run")
    for other in (out + ".top-k", out + "-top-k"):
        assert top_k.main(["--input", data, "--output", other, "--k", "2", "--epsilon", "1",
                           "--delta", "1e-6", "--insecure-test-seed", "1", "--quiet"]) == 0
    before = sorted(os.listdir(tmp_path))
    assert select_partitions.main([
        "--input", data, "--output", out, "--mechanism", "weighted-gaussian",
        "--budget-epsilon", "2", "--budget-delta", "1e-5", "--top-k", "2",
        "--insecure-test-seed", "1", "--quiet"]) == 0
    after = sorted(os.listdir(tmp_path))
    assert set(before) < set(after)
    assert set(after) - set(before) == {"run" + ITEMS, "run.json", "run.PRIVATE-run-details.json",
                                        "run" + TOPK}


def test_select_with_sips_from_a_budget_states_its_conversion(data, tmp_path):
    out = str(tmp_path / "run")
    assert select_partitions.main([
        "--input", data, "--output", out, "--mechanism", "sips", "--budget-epsilon", "1",
        "--budget-delta", "1e-6", "--insecure-test-seed", "1", "--quiet"]) == 0
    s = summary(out)
    part = s["budget"]["parts"][0]
    assert part["share_epsilon"] == 1.0 and part["share_delta"] == 1e-6
    # DP-SIPS takes the largest ρ whose conversion gives the share: its stated
    # ε is the share's (up to the bisection), at δ = the share's δ
    from beam_dpsu.dp.privacy.accounting import zcdp_to_dp_epsilon
    assert s["release_rho"] > 0 and s["release_zcdp_delta"] == pytest.approx(5e-7)
    assert zcdp_to_dp_epsilon(s["release_rho"], s["release_zcdp_delta"], 1e-6) == \
        pytest.approx(s["release_epsilon"], rel=1e-9)
    assert 0.999 < s["release_epsilon"] <= 1.0 * (1 + 1e-12)
    assert s["epsilon"] == s["release_epsilon"] and "zCDP" in s["release_guarantee"]


# -- top-k: the query's total ---------------------------------------------------

def test_top_k_from_a_total_gets_the_largest_per_selection_epsilon(data, tmp_path):
    out = str(tmp_path / "run")
    assert top_k.main(["--input", data, "--output", out, "--k", "4", "--budget-epsilon", "1",
                       "--budget-delta", "1e-6", "--insecure-test-seed", "5", "--quiet"]) == 0
    s = summary(out)
    eps_sel, _, _ = B.pay_what_you_get_epsilon(1.0, 1e-6, 4, 1)
    assert s["epsilon_per_selection"] == pytest.approx(eps_sel, rel=1e-12)
    assert s["epsilon"] <= 1.0 * (1 + 1e-9) and s["epsilon"] > 0.99  # the largest that fits
    assert s["budget"]["budget_epsilon"] == 1.0
    assert s["budget"]["parts"][0]["detail"]["spent_selections"] == s["charge"]["selections"]


def test_top_k_with_counts_from_a_total(data, tmp_path):
    out = str(tmp_path / "run")
    assert top_k.main(["--input", data, "--output", out, "--k", "3", "--with-counts",
                       "--max-items-per-user", "3", "--budget-epsilon", "0.5",
                       "--budget-delta", "1e-6", "--insecure-test-seed", "5", "--quiet"]) == 0
    s = summary(out)
    assert (s["epsilon"], s["delta"]) == (0.5, 1e-6)


def test_top_k_needs_a_guarantee(data, tmp_path, capsys):
    assert top_k.main(["--input", data, "--output", str(tmp_path / "x"), "--k", "3"]) == 2
    assert "--budget-epsilon" in capsys.readouterr().err


# -- compare: the total of its trials -------------------------------------------

def test_compare_states_the_total_of_its_trials(data, tmp_path, capsys):
    out = str(tmp_path / "cmp")
    assert compare.main(["--input", data, "--output", out, "--mechanisms",
                         "weighted-gaussian,count-laplace", "--epsilons", "0.5,1",
                         "--delta", "1e-6", "--trials", "2", "--quiet"]) == 0
    with open(os.path.join(out, "results.PRIVATE.json"), encoding="utf-8") as f:
        cost = json.load(f)["privacy_cost"]
    assert cost["releases"] == 8
    assert cost["epsilon"] == pytest.approx(math.fsum([0.5, 1, 0.5, 1] * 2))
    assert cost["delta"] == pytest.approx(8e-6) and cost["budget_epsilon"] is None
    with open(os.path.join(out, "results.PRIVATE.md"), encoding="utf-8") as f:
        assert "cost together" in f.read()


def test_compare_zcdp_trials_compose_in_zcdp(data, tmp_path):
    out = str(tmp_path / "cmp")
    assert compare.main(["--input", data, "--output", out, "--mechanisms", "sips",
                         "--epsilon", "1", "--delta", "1e-6", "--trials", "4",
                         "--budget-epsilon", "3", "--budget-delta", "1e-5", "--quiet"]) == 0
    with open(os.path.join(out, "results.PRIVATE.json"), encoding="utf-8") as f:
        cost = json.load(f)["privacy_cost"]
    assert "zCDP" in cost["composition"] and cost["epsilon"] < 4.0
    assert cost["delta"] == pytest.approx(4e-6) and cost["budget_epsilon"] == 3.0


def test_compare_counts_a_mechanism_or_epsilon_listed_twice_twice(data, tmp_path, capsys):
    rc = compare.main(["--input", data, "--output", str(tmp_path / "cmp"), "--mechanisms",
                       "weighted-gaussian,weighted-gaussian", "--epsilons", "1,1",
                       "--delta", "1e-6", "--trials", "2", "--budget-epsilon", "7",
                       "--budget-delta", "1e-5"])
    assert rc == 2 and "would spend ε = 8" in capsys.readouterr().err


def test_compare_past_its_budget_exits_2_before_reading(tmp_path, capsys):
    missing = str(tmp_path / "no-such-input.tsv")  # not read: the budget check comes first
    rc = compare.main(["--input", missing, "--output", str(tmp_path / "cmp"), "--mechanisms",
                       "weighted-gaussian", "--epsilon", "1", "--delta", "1e-6",
                       "--trials", "5", "--budget-epsilon", "4", "--budget-delta", "1e-5"])
    err = capsys.readouterr().err
    assert rc == 2 and "would spend ε = 5" in err and "--budget-epsilon 4" in err
    assert not os.path.exists(tmp_path / "cmp")


def test_a_run_never_deletes_or_counts_another_runs_items(data, tmp_path):
    # Beam's file sink deletes what matches its output glob before writing, and
    # a glob PREFIX-items-* also matches the items of a run under PREFIX-items-x:
    # neither the sink, the stale-output check nor --overwrite may touch them.
    # (Weighted Gaussian at ε = 1, Δ0 = 4: i0's weight is at least 400 · 4/7 · 1/2
    # ≈ 114 against T ≈ 23, σ ≈ 4.4, missed with probability Φ̄(20) < 1e-80; and
    # the runs are seeded.) Both assertions fail with Beam's templated sink.
    out = str(tmp_path / "run")
    other = out + "-items-x"
    assert select_partitions.main(["--input", data, "--output", other, "--mechanism",
                                   "weighted-gaussian", "--max-items-per-user", "4", "--epsilon", "1", "--delta", "1e-6",
                                   "--insecure-test-seed", "1", "--quiet"]) == 0
    kept = lines(other + ITEMS)
    for extra in ([], ["--overwrite"]):  # a first run, then one over it
        assert select_partitions.main(["--input", data, "--output", out, "--mechanism",
                                       "weighted-gaussian", "--max-items-per-user", "4", "--epsilon", "1", "--delta", "1e-6",
                                       "--insecure-test-seed", "1", "--quiet"] + extra) == 0
        assert lines(other + ITEMS) == kept and len(kept) > 0
        assert summary(out)["num_released"] == len(lines(out + ITEMS))
