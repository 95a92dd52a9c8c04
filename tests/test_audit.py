"""The empirical privacy auditor: every mechanism passes, every broken variant is caught.

Confidence. Each audit below runs at ``audit.CI_CONFIDENCE = 1 − 1e-8``: all
Clopper–Pearson bounds of one audit hold together with probability ≥ 1 − 1e-8
(Bonferroni inside the audit). If a mechanism is (ε, δ)-DP, its reported lower
bound exceeds ε only when some bound fails, so each "real mechanism passes"
test fails falsely with probability ≤ 1e-8; this file runs fewer than 30
audits, so the aggregate false-failure probability is below 3e-7 ≤ 1e-6.

Power. The broken variants' parameters (``variants.BROKEN_CONFIGS``) put the
lower bound well above ε = 1 (measured 2.7, 2.7 and 2.6 at this confidence).
For it to fall to 1 the distinguishing event's count would have to drop to
well under half its mean (threshold-delta-x100: ≈ 400 expected hits of 4000,
≈ 117 needed), a deviation of about 15 standard deviations: the chance of a
missed detection is far below 1e-6 (about 3e-68).

The cascade (``test_cascade_scenario_*``, ``docs/gw.md`` section 2): the same
neighbouring pair (same order key, same users: both variants get the same
cutoff Γ = 4 − 1/32 through α) is audited for the published and the
cascade-free GW with ``audit.CASCADE_TRIALS`` = 400 runs per side, and the same for the
published and the cascade-free GW-KT (public counts ``audit.cascade_public_counts``, which
give GW-KT GW's walk order on this pair: the published GW-KT's histograms are checked equal
to the published GW's, so the power computation below applies to it unchanged).
Size: the cascade-free GW is (ε, δ)-DP (docs/gw.md), so it fails falsely with
probability ≤ 1e-8 (the audit's confidence). Power: on D no cascade item can be
released (weight 0, checked deterministically below), so the Clopper–Pearson
upper bound on D is ≈ 21/400 for 0 hits; on D′ about 30 items of weight 1/32
are each released w.p. ½e^(−(T−1/32)) ≈ 0.038, so "a cascade item is released"
has p ≈ 0.69 (measured 0.72). The bound stays ≤ ε = 1 only if fewer than about
37% of the 400 runs on D′ release one, 14 standard deviations below the mean:
the chance of missing the published GW's failure is below 1e-40.

Run time: fast mode (``CI_TRIALS`` runs per dataset and scenario), about a
minute in total on a 2-core machine.
"""
import json
import math

import pytest

from beam_dpsu.dp.evaluation import audit
from beam_dpsu.pipelines import audit as audit_cli
from beam_dpsu.dp.mechanisms.base import run_local
from benchmarks import audit_variants as variants
from beam_dpsu.dp.mechanisms import WeightedLaplace
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.mechanisms.registry import REGISTRY, make_mechanism

CI_TRIALS = audit.FAST_TRIALS


@pytest.fixture(scope="module")
def public_counts(tmp_path_factory):
    return variants.write_public_counts(str(tmp_path_factory.mktemp("pub") / "public.tsv"))


def _configs():
    # Resolved at collection time without the public-counts file; gw-kt is added below.
    return [(name, params) for name, params in variants.standard_configs()]


def _id(config):
    name, params = config
    return (name + ("-zcdp" if "rho" in params else "")
            + ("-" + params["tie_break"] if "tie_break" in params else ""))


# ---------------------------------------------------------------------------
# Statistics.
# ---------------------------------------------------------------------------

def test_clopper_pearson_closed_forms():
    n, a = 1000, 1e-3
    lo, hi = audit.clopper_pearson(0, n, a)
    assert lo == 0.0 and math.isclose(hi, 1 - a ** (1 / n), rel_tol=1e-9)
    lo, hi = audit.clopper_pearson(n, n, a)
    assert hi == 1.0 and math.isclose(lo, a ** (1 / n), rel_tol=1e-9)
    lo, hi = audit.clopper_pearson(300, n, a)
    assert 0.25 < lo < 0.3 < hi < 0.35
    with pytest.raises(ValueError):
        audit.clopper_pearson(5, 4, a)


def test_epsilon_from_bounds_subtracts_delta():
    assert audit.epsilon_from_bounds(0.5, 0.1, 0.0) == pytest.approx(math.log(5))
    assert audit.epsilon_from_bounds(0.5, 0.1, 0.3) == pytest.approx(math.log(2))
    assert audit.epsilon_from_bounds(0.01, 0.1, 0.02) == 0.0
    assert audit.epsilon_from_bounds(0.1, 0.5, 0.0) == 0.0  # floored at 0


def test_best_bound_checks_complements_and_both_directions():
    ev = [audit.Event("x", frozenset({"x"}))]
    # x happens on D almost always, never on D': the bound comes from "x" (D vs D').
    b = audit.best_bound([990], [0], 1000, ev, 0.0, 1e-6)
    assert b["event"] == "x" and b["direction"] == "D vs D'" and b["epsilon_lower_bound"] > 3
    # x never on D, always on D': both "x" (D' vs D) and "not x" (D vs D') are extreme.
    b = audit.best_bound([0], [1000], 1000, ev, 0.0, 1e-6)
    assert b["epsilon_lower_bound"] > 3


# ---------------------------------------------------------------------------
# Scenarios.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("position", audit.POSITIONS)
def test_canary_is_placed_where_asked_in_the_real_user_order(position):
    from beam_dpsu.dp.data import sequential as policies
    m = make_mechanism("gw", epsilon=1.0, delta=1e-2)
    sc = audit.build_scenario(m, "near-cutoff", position)
    _, d_prime = sc.datasets()
    key = audit.PinnedOrderKey(sc.order_key)
    order = sorted(d_prime, key=lambda u: policies.user_sort_key(key.subkey("order"), u))
    want = {"first": 0, "middle": (len(order) - 1) // 2, "last": len(order) - 1}[position]
    assert order.index(sc.canary_id) == want
    # Only the order is pinned: everything else is fresh in every run.
    other = audit.PinnedOrderKey(sc.order_key)
    assert other.subkey("order") == key.subkey("order")
    assert other.subkey("noise/0") != key.subkey("noise/0")
    assert not key.seeded


def test_canary_placement_gives_up_on_a_key_and_build_scenario_draws_another(monkeypatch):
    # CI once failed here: under some order keys one background user hashes so
    # low that no canary id lands before it in any affordable number of tries.
    users = [f"pile-u{i}" for i in range(200)]
    with pytest.raises(audit.PlacementError):
        audit.place_canary(b"k" * 32, users, "first", max_tries=0)
    keys = []

    def narrow_for_the_first_three_keys(order_key, background, position, **kw):
        # Deterministic: the real placer fails under ~1.4% of keys for this
        # scenario's 9 users, which would make the count below flaky.
        keys.append(order_key)
        if len(keys) <= 3:
            raise audit.PlacementError("slot too narrow")
        return "canary-stub"

    monkeypatch.setattr(audit, "place_canary", narrow_for_the_first_three_keys)
    m = WeightedLaplace(1.0, 1e-3, 8)
    sc = audit.build_scenario(m, "pile", "first")
    assert len(keys) == 4 and len(set(keys)) == 4 and sc.order_key == keys[-1]
    assert sc.canary_id == "canary-stub"
    # A key the caller chose is the caller's: no silent redraw.
    keys.clear()

    def always_narrow(order_key, background, position, **kw):
        keys.append(order_key)
        raise audit.PlacementError("slot too narrow")

    monkeypatch.setattr(audit, "place_canary", always_narrow)
    with pytest.raises(audit.PlacementError):
        audit.build_scenario(m, "pile", "first", order_key=b"x" * 32)
    assert keys == [b"x" * 32]


def test_canary_placement_is_exact_for_every_position_and_never_reuses_an_id():
    import secrets
    users = [f"u{i}" for i in range(50)] + ["canary-0", "canary-1"]
    placed = 0
    for _ in range(20):
        key = secrets.token_bytes(32)
        ranked = sorted(audit._sort_key(key, u) for u in users)
        for position, want in (("first", 0), ("middle", len(users) // 2), ("last", len(users))):
            try:
                cid = audit.place_canary(key, users, position)
            except audit.PlacementError:
                continue  # a narrow slot under this key (probability < 1/65 each)
            assert cid not in users
            k = audit._sort_key(key, cid)
            assert sum(1 for r in ranked if r < k) == want
            placed += 1
    # Each of the 60 placements fails with probability < 1/65; more than 30
    # failures has probability below C(60,30)·65^-30 < 1e-36.
    assert placed >= 30


def test_scenarios_are_neighbours_and_the_canary_is_the_only_difference():
    m = WeightedLaplace(1.0, 1e-3, 8)
    for name in audit.SCENARIOS:
        sc = audit.build_scenario(m, name)
        d, d_prime = sc.datasets()
        assert set(d_prime) - set(d) == {sc.canary_id}
        assert all(d_prime[u] == d[u] for u in d)
    unique = audit.build_scenario(m, "unique")
    assert len(unique.canary) == 8  # Δ0 canary-only items
    assert not any(i in c for c in unique.background.values() for i in unique.canary)


def test_auditor_runs_the_core_code_path(monkeypatch):
    calls = []
    real = run_local

    def spy(per_user, mechanism, run_key=None):
        calls.append(type(run_key))
        return real(per_user, mechanism, run_key)

    monkeypatch.setattr(audit, "run_local", spy)
    audit.audit(WeightedLaplace(1.0, 1e-3, 4), 5, plan=[("unique", "first")])
    assert len(calls) == 10 and set(calls) == {audit.PinnedOrderKey}


# ---------------------------------------------------------------------------
# Every registered mechanism passes (fast mode).
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("config", _configs(), ids=_id)
def test_every_registered_mechanism_passes(config):
    name, params = config
    m = make_mechanism(name, **params)
    r = audit.audit(m, CI_TRIALS, audit.CI_CONFIDENCE)
    assert r["epsilon_lower_bound"] <= r["claimed_epsilon"], r
    assert r["passed"] and r["trials"] == CI_TRIALS and r["claimed_delta"] == m.guarantee.delta


@pytest.mark.parametrize("tie_break", ["item-hash", "first-occurrence"])
def test_gw_kt_passes(public_counts, tie_break):
    m = make_mechanism("gw-kt", epsilon=1.0, delta=1e-3, public_counts=public_counts,
                       tie_break=tie_break)
    r = audit.audit(m, CI_TRIALS, audit.CI_CONFIDENCE)
    assert r["epsilon_lower_bound"] <= r["claimed_epsilon"], r


def test_sequential_policies_are_audited_in_every_position():
    assert {"policy-laplace", "policy-gaussian", "gw", "gw-kt"} <= set(REGISTRY)
    plan = audit.default_plan(make_mechanism("gw", epsilon=1.0, delta=1e-3))
    assert {p for _, p in plan} == set(audit.POSITIONS)
    assert {s for s, _ in plan} == set(audit.SCENARIOS)
    names = {name for name, _ in variants.standard_configs()}
    assert {"policy-laplace", "policy-gaussian", "gw"} <= names


def test_every_tie_break_is_audited(public_counts):
    # The registry's default tie-break and each other one: an embedded pipeline's
    # GW and GW-KT (the constructors' default) must be audited too.
    from beam_dpsu.dp.data.sequential import TIE_BREAKS
    for name in ("gw", "gw-kt"):
        made = [make_mechanism(n, **params)
                for n, params in variants.standard_configs(public_counts) if n == name]
        assert sorted(m.tie_break for m in made) == sorted(TIE_BREAKS), name


# ---------------------------------------------------------------------------
# The cascade: the published GW fails, the cascade-free GW passes, same trials.
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cascade():
    (n1, published), (n2, cascade_free) = audit.cascade_configs()
    pub = make_mechanism(n1, **published)
    free = make_mechanism(n2, **cascade_free)
    assert pub.variant == "published" and not pub.proven and free.proven
    assert pub.cutoff == pytest.approx(audit.CASCADE_CUTOFF, abs=1e-12)
    assert free.cutoff == pytest.approx(audit.CASCADE_CUTOFF, abs=1e-12)
    sc = audit.build_scenario(pub, "cascade")
    # The same pair for both variants (same users, same pinned order).
    again = audit.build_scenario(free, "cascade", order_key=sc.order_key)
    assert again.datasets() == sc.datasets() and again.canary_id == sc.canary_id
    return pub, free, sc


def test_cascade_scenario_makes_items_x_does_not_hold_non_zero(cascade):
    pub, free, sc = cascade
    d, d_prime = sc.datasets()
    key = audit.PinnedOrderKey(sc.order_key)
    order = sorted(d_prime, key=lambda u: audit._sort_key(sc.order_key, u))
    conv = [u for u in order if "e" in d_prime[u] and len(d_prime[u]) == 3]
    # Pinned order: every setup user, then x, then every converter.
    assert order.index(sc.canary_id) == len(order) - len(conv) - 1
    cascade_items = set().union(*(ev.items for ev in sc.events))
    h = pub.histogram_local(d, key)
    hp = pub.histogram_local(d_prime, key)
    assert not cascade_items & set(h)                       # none touched without x
    new = {u: w for u, w in hp.items() if u in cascade_items}
    assert len(new) >= 29 and sum(new.values()) <= 1.0      # ~30 new items, ℓ1 bound holds
    assert sum(abs(hp.get(u, 0.0) - h.get(u, 0.0)) for u in set(h) | set(hp)) <= 1 + 1e-9
    # The cascade-free GW: every c-j has positive weight in both (step 1), no new item.
    hf, hfp = free.histogram_local(d, key), free.histogram_local(d_prime, key)
    assert cascade_items <= set(hf) and set(hfp) - set(hf) <= set(sc.canary)


@pytest.fixture(scope="module")
def cascade_kt(cascade, tmp_path_factory):
    """The published and the cascade-free GW-KT on the GW cascade pair (same order key)."""
    path = audit.write_cascade_public_counts(str(tmp_path_factory.mktemp("kt") / "pub.tsv"))
    configs = audit.cascade_configs(public_counts=path)
    assert [n for n, _ in configs] == ["gw", "gw", "gw-kt", "gw-kt"]
    pub = make_mechanism("gw-kt", **configs[2][1])
    free = make_mechanism("gw-kt", **configs[3][1])
    assert pub.variant == "published" and not pub.proven and free.proven
    assert free.kt_selection == "front"            # the default K_i selection
    assert pub.cutoff == pytest.approx(audit.CASCADE_CUTOFF, abs=1e-12)
    assert free.cutoff == pytest.approx(audit.CASCADE_CUTOFF, abs=1e-12)
    sc = cascade[2]
    again = audit.build_scenario(free, "cascade", order_key=sc.order_key)
    assert again.datasets() == sc.datasets() and again.canary_id == sc.canary_id
    return pub, free, sc


def test_cascade_scenario_makes_gw_kt_spill_as_gw(cascade, cascade_kt):
    """The public counts give GW-KT GW's walk order on this pair: the same cascade (the
    published histograms are equal) and no new item but x's for the cascade-free one."""
    pub, free, sc = cascade_kt
    d, d_prime = sc.datasets()
    key = audit.PinnedOrderKey(sc.order_key)
    cascade_items = set().union(*(ev.items for ev in sc.events))
    hp = pub.histogram_local(d_prime, key)
    assert hp == cascade[0].histogram_local(d_prime, key)
    assert len(cascade_items & set(hp)) >= 29 and not cascade_items & set(pub.histogram_local(d, key))
    hf, hfp = free.histogram_local(d, key), free.histogram_local(d_prime, key)
    assert cascade_items <= set(hf) and set(hfp) - set(hf) <= set(sc.canary)


@pytest.mark.parametrize("pair", ["cascade", "cascade_kt"])
def test_cascade_scenario_fails_the_published_and_passes_the_cascade_free(pair, request):
    """GW (``cascade``) and GW-KT (``cascade_kt``): the same audit of both variants."""
    pub, free, sc = request.getfixturevalue(pair)
    r_pub = audit.audit(pub, audit.CASCADE_TRIALS, audit.CI_CONFIDENCE, scenarios=[sc])
    r_free = audit.audit(free, audit.CASCADE_TRIALS, audit.CI_CONFIDENCE, scenarios=[sc])
    assert r_pub["epsilon_lower_bound"] > r_pub["claimed_epsilon"] and not r_pub["passed"], r_pub
    assert r_pub["p_d"] == 0.0 and r_pub["scenario"] == "cascade"
    assert r_free["epsilon_lower_bound"] <= r_free["claimed_epsilon"] and r_free["passed"], \
        r_free


def test_cli_runs_the_published_variant_only_with_allow_unproven(capsys):
    base = ["--mechanism", "gw", "--epsilon", "1", "--delta", "0.1", "--variant", "published",
            "--trials", "20", "--scenarios", "cascade"]
    assert audit_cli.main(base) == 2
    err = capsys.readouterr().err.strip()
    assert "--allow-unproven" in err and len(err.splitlines()) == 1
    alpha = audit.cascade_configs()[0][1]["alpha"]
    assert audit_cli.main(base + ["--alpha", repr(alpha), "--allow-unproven"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scenario"] == "cascade" and report["runs"] == 40


# ---------------------------------------------------------------------------
# Every deliberately broken variant is caught (fast mode).
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("config", variants.BROKEN_CONFIGS, ids=lambda c: c[0])
def test_broken_variant_is_caught(config):
    variant, name, params, plan, trials = config
    assert name in REGISTRY
    real = make_mechanism(name, **params)
    broken = variants.BROKEN[variant](real)
    assert broken.guarantee.epsilon == real.guarantee.epsilon  # same claim, one bug
    r = audit.audit(broken, trials, audit.CI_CONFIDENCE, plan=plan)
    assert r["epsilon_lower_bound"] > r["claimed_epsilon"], r
    assert not r["passed"]


def test_broken_variants_differ_from_the_real_mechanism_only_by_the_bug():
    real = make_mechanism("weighted-laplace", epsilon=1.0, delta=1e-3, max_items=8)
    bad = variants.threshold_delta_x100(real)
    assert bad.calibration.noise_scale == real.calibration.noise_scale
    assert bad.calibration.threshold < real.calibration.threshold
    assert real.calibration.threshold == make_mechanism(
        "weighted-laplace", epsilon=1.0, delta=1e-3, max_items=8).calibration.threshold
    # Zero-weight keys: same release as the real mechanism when every key has weight.
    per_user = {f"u{i}": {"a": 1} for i in range(30)}
    key = RunKey.from_test_seed(3)
    assert variants.ZeroWeightKeys(real).run_local(per_user, key) == run_local(
        per_user, real, key)
    gw = make_mechanism("gw", epsilon=1.0, delta=1e-2, variant="published",
                        allow_unproven=True)
    closest = variants.closest_to_cutoff_greedy(gw)
    # One item per user: the walk order cannot matter, so the releases agree.
    assert closest.run_local(per_user, key) == run_local(per_user, gw, key)
    with pytest.raises(ValueError):
        variants.closest_to_cutoff_greedy(real)


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------

def test_cli_prints_one_json_object(capsys):
    rc = audit_cli.main(["--mechanism", "weighted-laplace", "--epsilon", "1", "--delta", "1e-3",
                     "--max-items-per-user", "4", "--trials", "50", "--scenarios", "unique"])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    report = json.loads(out[0])
    for key in ("mechanism", "claimed_epsilon", "claimed_delta", "epsilon_lower_bound",
                "trials", "event", "confidence", "passed"):
        assert key in report, key
    assert report["mechanism"] == "weighted-laplace" and report["trials"] == 50
    assert report["confidence"] == audit.DEFAULT_CONFIDENCE and report["broken"] is None


def test_cli_broken_variant(capsys):
    rc = audit_cli.main(["--mechanism", "weighted-laplace", "--epsilon", "1", "--delta", "1e-3",
                     "--max-items-per-user", "8", "--trials", "3000", "--scenarios", "unique",
                     "--broken", "threshold-delta-x100"], broken=variants.BROKEN)
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["broken"] == "threshold-delta-x100"
    assert report["epsilon_lower_bound"] > 1.0


@pytest.mark.parametrize("argv", [
    ["--mechanism", "nope", "--epsilon", "1", "--delta", "1e-3"],
    ["--mechanism", "weighted-laplace", "--epsilon", "-1", "--delta", "1e-3"],
    ["--mechanism", "weighted-laplace", "--epsilon", "1"],
    ["--mechanism", "weighted-laplace", "--epsilon", "1", "--delta", "1e-3", "--trials", "0"],
    ["--mechanism", "weighted-laplace", "--epsilon", "1", "--delta", "1e-3",
     "--confidence", "1.5"],
    ["--mechanism", "weighted-laplace", "--epsilon", "1", "--delta", "1e-3",
     "--scenarios", "bogus"],
    ["--mechanism", "weighted-laplace", "--epsilon", "1", "--delta", "0.1",
     "--broken", "threshold-delta-x100"],
    ["--mechanism", "weighted-laplace", "--epsilon", "1", "--delta", "1e-3",
     "--broken", "closest-to-cutoff-greedy"],
    ["--mechanism", "weighted-laplace", "--epsilon", "1", "--delta", "1e-3", "--bogus"],
])
def test_cli_bad_parameters_exit_2_with_one_line(argv, capsys):
    assert audit_cli.main(argv, broken=variants.BROKEN) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("beam_dpsu.pipelines.audit: error:") and len(err.splitlines()) == 1
