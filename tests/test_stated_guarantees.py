"""What a release states about its privacy, and the parameters that make a statement void.

* Stated guarantees are rounded UP and shares DOWN: checked against exact decimal
  arithmetic at 2,000 digits (``decimal``, independent of the ``fractions`` the code
  uses); the budget example of the README states at most its budget, exactly.
* ``--epsilon``/``--delta`` (and ``TopKMechanism(k, epsilon, delta)``) are the whole
  release's guarantee on every command; Algorithm 2's per-selection ε is calibrated
  from it (checked against exact arithmetic and a grid over the Rényi order).
* A top-k query that releases fewer than k items says how many and why.
* Δ0 above the bound is refused, large ε and δ are warned about, η below the bound
  is refused (and the cascade it would reopen is shown).

Statistical assertions state their false-failure probability; the command-line runs
use a fixed test seed, so their outcome is deterministic.
"""
import decimal
import json
import math
import random
import sys
from fractions import Fraction

import numpy as np
import pytest

from beam_dpsu.dp.privacy import accounting as acc
from beam_dpsu.dp.mechanisms import budget as bud
from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.privacy import params
from beam_dpsu.dp.data import sequential
from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.dp.mechanisms import (CountGaussian, CountLaplace, TruncatedGeometric,
                                     WeightedGaussian, WeightedGaussianZcdp, WeightedLaplace)
from beam_dpsu.dp.mechanisms.policy import GW, GWKT, PolicyGaussian, PolicyLaplace
from beam_dpsu.dp.mechanisms.sips import Sips
from beam_dpsu.dp.mechanisms.topk import TopKMechanism, top_k_local
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.mechanisms.registry import REGISTRY, make_mechanism
from beam_dpsu.pipelines import arguments, run_budget, select_partitions, top_k

CTX = decimal.Context(prec=2000)  # exact for sums and products of a few doubles


def dec(x) -> decimal.Decimal:
    return decimal.Decimal(x) if not isinstance(x, Fraction) else CTX.divide(
        decimal.Decimal(x.numerator), decimal.Decimal(x.denominator))


def dsum(values) -> decimal.Decimal:
    total = decimal.Decimal(0)
    for v in values:
        total = CTX.add(total, decimal.Decimal(v))
    return total


def is_rounded_up(got: float, exact: decimal.Decimal) -> bool:
    """``got`` is the smallest float ≥ ``exact``."""
    return decimal.Decimal(got) >= exact > decimal.Decimal(math.nextafter(got, -math.inf))


def is_rounded_down(got: float, exact: decimal.Decimal) -> bool:
    return decimal.Decimal(got) <= exact < decimal.Decimal(math.nextafter(got, math.inf))


def random_floats(rng, n):
    return [rng.choice([rng.random(), rng.random() * 1e-5, 0.1 * rng.randint(1, 9),
                        rng.uniform(0, 50)]) for _ in range(n)]


# --------------------------------------------------------------------------
# 1. Rounding: pure functions against exact decimal arithmetic.
# --------------------------------------------------------------------------

def test_sum_up_is_the_exact_sum_rounded_up():
    rng = random.Random(5)
    for _ in range(2000):
        values = random_floats(rng, rng.randint(1, 6))
        assert is_rounded_up(acc.sum_up(values), dsum(values)), values
    # the case of the README budget: 2.4 + 0.6 in floating point is not the exact sum
    assert acc.sum_up([0.1, 0.2]) == 0.30000000000000004
    assert acc.sum_up([]) == 0.0


def test_products_are_rounded_up_and_down():
    rng = random.Random(7)
    for _ in range(2000):
        a, b = random_floats(rng, 1)[0], rng.choice([rng.random(), float(rng.randint(1, 100))])
        exact = CTX.multiply(decimal.Decimal(a), decimal.Decimal(b))
        assert is_rounded_up(acc.product_up(a, b), exact)
        assert is_rounded_down(acc.product_down(a, b), exact)
    # 3 × 0.8 rounds to 2.4000000000000004 in floating point; the share is below the product
    assert 3 * 0.8 == 2.4000000000000004 and bud.share_of(3.0, 0.8) == 2.4


def test_float_up_and_down_of_fractions():
    rng = random.Random(11)
    for _ in range(2000):
        q = Fraction(rng.randint(1, 10 ** 30), rng.randint(1, 10 ** 30))
        assert is_rounded_up(acc.float_up(q), dec(q))
        assert is_rounded_down(acc.float_down(q), dec(q))
    assert acc.float_up(Fraction(10) ** 400) == math.inf
    with pytest.raises(ValueError):
        acc.float_up(float("nan"))


def test_remaining_and_grant_never_exceed_the_total():
    rng = random.Random(13)
    for _ in range(300):
        total = rng.choice([3.0, 1e-5, 0.3, rng.uniform(0.01, 10)])
        weights = {str(i): rng.uniform(0.1, 5) for i in range(rng.randint(1, 6))}
        granted = []
        for f in bud.fractions_of_weights(weights).values():
            g = bud.grant(bud.share_of(total, f), total, granted)
            assert g is not None and g > 0
            granted.append(g)
        assert dsum(granted) <= decimal.Decimal(total)
        left = bud.remaining_of(total, granted)
        assert is_rounded_down(left, CTX.subtract(decimal.Decimal(total), dsum(granted))) \
            or left == 0.0
    # explicit shares 0.1 + 0.1 + 0.1 of 0.3 exceed it by rounding: the last gets the rest
    granted = [bud.grant(0.1, 0.3, []), bud.grant(0.1, 0.3, [0.1])]
    last = bud.grant(0.1, 0.3, granted)
    assert last < 0.1 and dsum(granted + [last]) <= decimal.Decimal(0.3)
    assert bud.grant(0.2, 0.3, [0.1, 0.1]) is None  # more than rounding: refused


def test_readable_up_is_short_and_never_below():
    assert acc.readable_up(2.9999999999999662) == 3.0
    assert acc.readable_up(1e-05) == 1e-05
    assert acc.readable_up(1.0000000000000003e-05) == 1.00001e-05  # up, not down to 1e-05
    assert acc.readable_up(5.926818015540659) == 5.92682
    assert acc.readable_up(0.0) == 0.0 and acc.figure(3.0) == "3.0"
    rng = random.Random(17)
    for _ in range(3000):
        x = rng.choice([rng.random(), rng.random() * 10 ** rng.randint(-12, 6)])
        r = acc.readable_up(x)
        assert r >= x
        mantissa = f"{decimal.Decimal(repr(r)).normalize():e}".split("e")[0].replace(".", "")
        assert len(mantissa.lstrip("-")) <= 6, (x, r)
        # at most one unit of the sixth significant digit above x
        unit = 10.0 ** (math.floor(math.log10(x)) - 5)
        assert r - x <= unit * (1 + 1e-9), (x, r)


def test_compositions_are_rounded_up():
    rng = random.Random(19)
    for _ in range(300):
        parts = [(rng.uniform(0, 3), rng.uniform(0, 1e-5)) for _ in range(rng.randint(1, 5))]
        eps, delta = bud.basic_composition(parts)
        assert is_rounded_up(eps, dsum(e for e, _ in parts))
        assert is_rounded_up(delta, dsum(d for _, d in parts))
        rho, zdelta = acc.compose_zcdp(parts)
        assert is_rounded_up(rho, dsum(e for e, _ in parts))
        e, k = rng.uniform(0.01, 2), rng.randint(1, 60)
        g = acc.br_composition_guarantee(e, 1e-7, k, 3, 1e-6)
        exact_basic = CTX.multiply(decimal.Decimal(e), k)
        if "basic composition route" in g.note:
            assert is_rounded_up(g.epsilon, exact_basic)
        assert is_rounded_up(g.rho, CTX.divide(CTX.multiply(CTX.multiply(
            decimal.Decimal(e), decimal.Decimal(e)), k), 8))


def test_the_readme_budget_states_at_most_its_budget_and_never_below_its_parts():
    budget = bud.PrivacyBudget(3.0, 1e-5)
    select = budget.mechanism("select", "weighted-gaussian", fraction=0.8)
    pool = budget.pay_what_you_get("top-k", max_selections=50, max_queries=1, fraction=0.2)
    g = budget.guarantee()
    assert g.epsilon <= 3.0 and g.delta <= 1e-5           # exactly, no tolerance
    parts = [select.guarantee, pool.guarantee()]
    assert is_rounded_up(g.epsilon, dsum(p.epsilon for p in parts))
    assert is_rounded_up(g.delta, dsum(p.delta for p in parts))
    assert "within the budget (3.0, 1e-05)" in g.note
    d = budget.describe()
    assert dsum(p["share_epsilon"] for p in d["parts"]) <= 3
    assert dsum(p["share_delta"] for p in d["parts"]) <= decimal.Decimal(1e-5)


@pytest.mark.parametrize("fractions", [(0.8, 0.2), (0.7, 0.3), (1 / 3, 1 / 3, 1 / 3),
                                       (0.1,) * 10])
def test_any_split_of_a_budget_states_at_most_the_budget(fractions):
    for total in ((3.0, 1e-5), (1.0, 1e-6), (0.3, 3e-7)):
        budget = bud.PrivacyBudget(*total)
        for i, f in enumerate(fractions):
            budget.take(f"r{i}", fraction=f)
        g = budget.guarantee()
        assert g.epsilon <= total[0] and g.delta <= total[1]


def test_a_fully_spent_zcdp_pool_never_states_more_than_its_share():
    # The conversion of the pool's full ρ back to ε stops within 1e-13 of the root and
    # lands above the share in most of these cases; the pool states the share then.
    rng = random.Random(23)
    above = 0
    for _ in range(30):
        epsilon, delta = rng.uniform(0.1, 5), 10 ** rng.uniform(-9, -4)
        budget = bud.PrivacyBudget(epsilon, delta)
        pool = budget.zcdp("z", fraction=1)
        pool.take("all", fraction=1)
        above += pool.guarantee().epsilon > epsilon
        g = budget.guarantee()
        assert g.epsilon <= epsilon and g.delta <= delta
    assert above > 0  # the case the cap is for does occur


def test_a_zcdp_pool_states_at_most_its_share():
    budget = bud.PrivacyBudget(2.0, 1e-6)
    pool = budget.zcdp("z", fraction=0.5)
    pool.weighted_gaussian("a", max_items=10, fraction=0.5)
    pool.sips("b", max_items=10, fraction=0.5, rounds=2)
    part = budget.describe()["parts"][0]
    assert part["epsilon"] <= part["share_epsilon"] and part["delta"] <= part["share_delta"]
    g = budget.guarantee()
    assert g.epsilon <= 2.0 and g.delta <= 1e-6


# --------------------------------------------------------------------------
# 2. --epsilon is the whole release's guarantee, top-k included.
# --------------------------------------------------------------------------

def grid_zcdp_epsilon(rho: float, target: float) -> float:
    """Independent conversion (numpy): the smallest ε on a grid with δ'(ε) ≤ target, δ'
    minimised over a grid of Rényi orders (≥ the true δ', so this ε is ≥ the true one)."""
    a = 1.0 + np.logspace(-5, 4, 100001)
    lo, hi = 0.0, 100.0
    for _ in range(80):
        eps = 0.5 * (lo + hi)
        log_terms = (a - 1) * (a * rho - eps) - np.log(a - 1) + a * np.log1p(-1 / a)
        if np.exp(log_terms.min()) <= target:
            hi = eps
        else:
            lo = eps
    return hi


@pytest.mark.parametrize("k", [1, 5, 20, 50])
@pytest.mark.parametrize("epsilon,delta", [(0.5, 1e-6), (3.0, 1e-5), (0.05, 1e-9)])
def test_top_k_epsilon_is_the_whole_query(k, epsilon, delta):
    m = TopKMechanism(k, epsilon, delta)
    assert (m.guarantee.epsilon, m.guarantee.delta) == (m.epsilon, m.delta) == (epsilon, delta)
    eps_sel, delta_q = m.epsilon_per_selection, m.delta_per_query
    assert delta_q == delta / 2 and m.conversion_delta == delta / 2
    # its composition over k selections is within (ε, δ), and it is the largest
    c = acc.br_composition_guarantee(eps_sel, delta_q, k, 1, delta / 2)
    assert c.epsilon <= epsilon and c.delta <= delta and c == m.composition
    bigger = acc.br_composition_guarantee(eps_sel * (1 + 1e-9), delta_q, k, 1, delta / 2)
    assert bigger.epsilon > epsilon
    # independent check of the composition: basic composition exactly (Fraction), the
    # zCDP route with a grid over the Rényi orders (its ε is ≥ the true one, within 1%)
    basic = Fraction(eps_sel) * k
    zcdp = grid_zcdp_epsilon(k * eps_sel ** 2 / 8, delta / 2)
    assert min(basic, Fraction(zcdp) * Fraction(1 - 1e-2)) <= Fraction(epsilon)
    assert min(basic, Fraction(zcdp)) >= Fraction(epsilon) * Fraction(1 - 1e-2)
    if k == 1:  # one selection: basic composition, so ε itself per selection
        assert eps_sel == epsilon
    # the threshold uses δ/2 and the Gumbel the calibrated ε
    assert m.threshold_offset == cal.gumbel_threshold_offset(eps_sel, delta / 2, m.k_bar)
    d = m.describe()
    assert (d["epsilon"], d["delta"]) == (epsilon, delta)
    assert d["epsilon_per_selection"] == eps_sel and d["calibrated_from"] == "epsilon"
    assert "whole query" in d["epsilon_meaning"]


def test_epsilon_per_selection_keeps_the_old_meaning():
    old = TopKMechanism(20, epsilon_per_selection=0.5, delta=1e-6)
    g = acc.br_composition_guarantee(0.5, 1e-6, 20, 1, 1e-6)
    assert (old.epsilon, old.delta) == (g.epsilon, g.delta)
    assert acc.readable_up(old.epsilon) == 5.92682 and old.delta == 2e-6
    assert old.noise_scale == 2.0 and old.describe()["calibrated_from"] == "epsilon_per_selection"
    # the whole-query calibration and the per-selection one it computes release the same
    whole = TopKMechanism(20, 0.5, 1e-6)
    same = TopKMechanism(20, epsilon_per_selection=whole.epsilon_per_selection,
                         delta=whole.delta_per_query)
    per_user = {f"u{u}": {f"i{j}": 1 for j in range(u % 30)} for u in range(3000)}
    key = RunKey.from_test_seed(4)
    assert top_k_local(per_user, whole, key) == top_k_local(per_user, same, key)
    # Algorithm 1's epsilon was already the whole query's
    counts = TopKMechanism(5, 0.5, 1e-6, max_items=3, with_counts=True)
    assert (counts.epsilon, counts.delta) == (0.5, 1e-6) and counts.epsilon_per_selection is None


def test_budget_pool_is_the_whole_query_calibration():
    budget = bud.PrivacyBudget(2.0, 1e-6)
    pool = budget.pay_what_you_get("top-k", max_selections=10, max_queries=1, fraction=1)
    m = TopKMechanism(10, 2.0, 1e-6)
    assert (pool.epsilon, pool.delta) == (m.epsilon_per_selection, m.delta_per_query)
    assert acc.pay_what_you_get_epsilon is bud.pay_what_you_get_epsilon


@pytest.fixture(scope="module")
def ranked_data(tmp_path_factory):
    # a, b, c held by 1000, 900 and 800 users; every user also holds one item of its
    # own. Top-10 at the whole query's (2, 1e-6): ε per selection ≈ 0.27, threshold
    # offset ≈ 1 + ln(10/5e-7)/0.27 ≈ 63 above h_(11) = 1. c beats it by > 700 users
    # (> 190 Gumbel scales: missed with probability < e^-190); a user's own item (1
    # user) beats it with probability expit(-0.27·63) < 4e-8, so more than 3 items
    # are released with probability < 7 · 4e-8 < 3e-7. The runs are seeded anyway.
    path = tmp_path_factory.mktemp("ranked") / "ranked.tsv"
    lines = []
    for u in range(1000):
        for item, n in (("a", 1000), ("b", 900), ("c", 800)):
            if u < n:
                lines.append(f"user{u}\t{item}\n")
        lines.append(f"user{u}\town{u}\n")
    path.write_text("".join(lines), encoding="utf-8")
    return str(path)


def summary(prefix):
    with open(prefix + ".json", encoding="utf-8") as f:
        return json.load(f)


def items(prefix, kind="items"):
    with open(f"{prefix}-{kind}-00000-of-00001", encoding="utf-8") as f:
        return f.read().splitlines()


def test_top_k_cli_epsilon_is_the_whole_query_and_equals_its_budget_route(ranked_data, tmp_path,
                                                                          capsys):
    base = ["--input", ranked_data, "--k", "10", "--insecure-test-seed", "3", "--quiet"]
    whole, budgeted, per_sel = (str(tmp_path / n) for n in ("whole", "budget", "per"))
    assert top_k.main(base + ["--output", whole, "--epsilon", "2", "--delta", "1e-6"]) == 0
    printed = json.loads(capsys.readouterr().out)
    s = summary(whole)
    assert (s["epsilon"], s["delta"]) == (2.0, 1e-6) == (printed["epsilon"], printed["delta"])
    assert s["epsilon_per_selection"] == TopKMechanism(10, 2.0, 1e-6).epsilon_per_selection
    assert top_k.main(base + ["--output", budgeted, "--budget-epsilon", "2",
                              "--budget-delta", "1e-6"]) == 0
    assert items(whole) == items(budgeted) == ["1\ta", "2\tb", "3\tc"]
    assert summary(budgeted)["epsilon_per_selection"] == s["epsilon_per_selection"]
    # the old meaning, explicitly: the statement is the composition of 10 selections
    assert top_k.main(base + ["--output", per_sel, "--epsilon-per-selection", "2",
                              "--delta", "1e-6"]) == 0
    p = summary(per_sel)
    g = acc.br_composition_guarantee(2.0, 1e-6, 10, 1, 1e-6)
    assert p["epsilon_per_selection"] == 2.0 and (p["epsilon"], p["delta"]) == (g.epsilon, g.delta)
    assert p["epsilon"] == 20.0  # 10 selections of 2: basic composition is the better route


@pytest.mark.parametrize("argv,fragment", [
    (["--epsilon", "1", "--epsilon-per-selection", "0.1", "--delta", "1e-6"], "give one"),
    (["--epsilon-per-selection", "0.1", "--delta", "1e-6", "--with-counts",
      "--max-items-per-user", "3"], "Algorithm 2 only"),
    (["--epsilon-per-selection", "0.1", "--budget-epsilon", "1", "--budget-delta", "1e-6"],
     "--epsilon-per-selection"),
    (["--epsilon-per-selection", "0", "--delta", "1e-6"], "--epsilon-per-selection"),
    (["--delta", "1e-6"], "--epsilon"),
])
def test_top_k_epsilon_flags_mistakes_exit_2(argv, fragment, tmp_path, capsys):
    rc = top_k.main(["--input", str(tmp_path / "none.tsv"), "--output", str(tmp_path / "o"),
                     "--k", "3"] + argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and fragment in err and len(err.splitlines()) == 1, err


def test_help_says_epsilon_is_the_whole_query(capsys):
    with pytest.raises(SystemExit):
        arguments.top_k_parser().parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "whole query" in out and "--epsilon-per-selection" in out


# --------------------------------------------------------------------------
# 3. A top-k query that stops early says so.
# --------------------------------------------------------------------------

def test_release_note_says_how_many_of_k_and_why():
    m = TopKMechanism(50, 0.6, 2e-6)
    note = m.release_note(32)
    assert note.startswith("released 32 of k = 50 items: the next candidate's noisy count "
                           "fell below the noisy threshold")
    assert "pay what you get: only the 33 selections made are charged" in note
    assert m.release_note(50) == "released 50 of k = 50 items"
    counts = TopKMechanism(5, 1.0, 1e-6, max_items=3, with_counts=True)
    assert "whole query whatever it releases" in counts.release_note(2)
    for bad in (-1, 51, 2.0, True):
        with pytest.raises(ValueError):
            m.release_note(bad)


def test_top_k_says_on_stderr_and_in_the_summary_how_many_were_released(ranked_data, tmp_path,
                                                                        capsys):
    out = str(tmp_path / "t")
    assert top_k.main(["--input", ranked_data, "--output", out, "--k", "10", "--epsilon", "2",
                       "--delta", "1e-6", "--insecure-test-seed", "3"]) == 0
    err = capsys.readouterr().err
    s = summary(out)
    assert s["num_released"] == 3 and s["released_of_k"] == "3 of 10"
    assert s["stop_reason"] == TopKMechanism(10, 2.0, 1e-6).release_note(3)
    assert "released 3 of k = 10 items: the next candidate's noisy count fell below" in err
    assert "only the 4 selections made are charged" in err
    quiet = str(tmp_path / "q")
    assert top_k.main(["--input", ranked_data, "--output", quiet, "--k", "10", "--epsilon",
                       "2", "--delta", "1e-6", "--insecure-test-seed", "3", "--quiet"]) == 0
    assert "released 3 of k" not in capsys.readouterr().err


def test_the_readme_budget_example_on_the_command_line(tmp_path, capsys):
    data = str(tmp_path / "x.tsv")
    synthetic.write_tsv(data, 2000)
    out = str(tmp_path / "o")
    assert select_partitions.main([
        "--input", data, "--output", out, "--mechanism", "weighted-gaussian",
        "--budget-epsilon", "3", "--budget-delta", "1e-5", "--top-k", "50",
        "--share", "select=0.8", "--share", "top-k=0.2", "--insecure-test-seed", "1"]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    s = summary(out)
    # readable figures printed, exact ones in the JSON, never above the budget
    assert (printed["epsilon"], printed["delta"]) == (3.0, 1e-05)
    assert (s["epsilon"], s["delta"]) == (3.0, 1e-5)   # the budget as given states it
    spent = s.get("spent_epsilon", s["epsilon"])       # the parts' exact sum, rounded up
    assert spent <= 3.0 and s.get("spent_delta", s["delta"]) <= 1e-5
    assert is_rounded_up(spent, dsum(p["epsilon"] for p in s["budget"]["parts"]))
    assert "within the budget (3.0, 1e-05)" in s["guarantee"]
    # the top-k says how many of its 50 came out and why, on stderr and in the JSON
    n = s["top_k"]["num_released"]
    assert n < 50 and s["top_k"]["released_of_k"] == f"{n} of 50"
    assert printed["top_k"]["released_of_k"] == f"{n} of 50"
    assert f"top-k: released {n} of k = 50 items: the next candidate's noisy count" in \
        captured.err
    assert "pay what you get" in s["top_k"]["stop_reason"]


# --------------------------------------------------------------------------
# 4. Δ0 above its bound is refused; large ε and δ are warned about.
# --------------------------------------------------------------------------

def test_check_max_items_bound():
    assert params.MAX_MAX_ITEMS == 10 ** 6
    assert cal.check_max_items(10 ** 6) == 10 ** 6
    for bad in (10 ** 6 + 1, 10 ** 20, 1e20):
        with pytest.raises(ValueError, match="at most 1,000,000"):
            cal.check_max_items(bad)


@pytest.mark.parametrize("build", [
    lambda d: TruncatedGeometric(1, 1e-6, d), lambda d: CountLaplace(1, 1e-6, d),
    lambda d: CountGaussian(1, 1e-6, d), lambda d: WeightedLaplace(1, 1e-6, d),
    lambda d: WeightedGaussian(1, 1e-6, d), lambda d: WeightedGaussianZcdp(0.1, 1e-6, d),
    lambda d: Sips(0.1, 1e-6, d), lambda d: Sips.from_dp(1, 1e-6, d),
    lambda d: PolicyLaplace(1, 1e-6, d), lambda d: PolicyGaussian(1, 1e-6, d),
    lambda d: GW(1, 1e-6, max_items=d), lambda d: GWKT(1, 1e-6, {"a": 3}, max_items=d),
    lambda d: TopKMechanism(3, 1, 1e-6, max_items=d),
    lambda d: TopKMechanism(3, 1, 1e-6, max_items=d, with_counts=True),
    lambda d: bud.PrivacyBudget(1, 1e-6).weighted_gaussian("x", max_items=d, fraction=1),
])
def test_every_constructor_refuses_a_delta0_above_the_bound(build):
    with pytest.raises(ValueError, match="at most 1,000,000"):
        build(10 ** 6 + 1)
    assert build(10 ** 6) is not None  # the bound itself is accepted


def test_registry_refuses_a_delta0_above_the_bound():
    for name, entry in REGISTRY.items():
        if "max_items" not in entry.accepts or "public_counts" in entry.accepts:
            continue
        with pytest.raises(ValueError, match="at most 1,000,000"):
            make_mechanism(name, epsilon=1, delta=1e-6, max_items=10 ** 6 + 1)


def test_command_line_refuses_a_huge_delta0_at_once(tmp_path, capsys):
    import time
    start = time.time()
    rc = select_partitions.main(["--input", str(tmp_path / "none.tsv"), "--output",
                                 str(tmp_path / "o"), "--mechanism", "weighted-gaussian",
                                 "--epsilon", "1", "--delta", "1e-6",
                                 "--max-items-per-user", str(10 ** 20)])
    err = capsys.readouterr().err
    assert rc == 2 and "--max-items-per-user must be at most 1,000,000" in err
    assert len(err.strip().splitlines()) == 1 and time.time() - start < 30
    with pytest.raises(SystemExit):
        arguments.select_parser().parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "1,000,000" in help_text and "warning above 10" in help_text
    assert "warning above 0.001" in help_text


def test_guarantee_warnings_levels():
    assert params.WARN_EPSILON_ABOVE == 10 and params.WARN_DELTA_ABOVE == 1e-3
    assert cal.guarantee_warnings(10, 1e-3) == []           # at the levels: no warning
    assert cal.guarantee_warnings(1, 1e-6) == []
    one = cal.guarantee_warnings(10.5, 1e-6)
    assert len(one) == 1 and one[0].startswith("epsilon = 10.5 is above 10")
    two = cal.guarantee_warnings(1e6, 0.5)
    assert len(two) == 2 and two[1].startswith("delta = 0.5 is above 0.001")
    assert all("\n" not in w for w in two)


@pytest.mark.parametrize("argv,warned", [
    (["--mechanism", "weighted-gaussian", "--epsilon", "1e6", "--delta", "0.5"], 2),
    (["--mechanism", "weighted-gaussian", "--epsilon", "1", "--delta", "1e-6"], 0),
    (["--mechanism", "weighted-gaussian", "--budget-epsilon", "20", "--budget-delta", "1e-6"],
     1),
])
def test_select_warns_about_a_weak_guarantee_and_runs(argv, warned, tmp_path, capsys):
    data = str(tmp_path / "in.tsv")
    synthetic.write_tsv(data, 200, 3)
    assert select_partitions.main(["--input", data, "--output", str(tmp_path / "o"),
                                   "--quiet"] + argv) == 0
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("WARNING: ")]
    assert len(lines) == warned, err


def test_top_k_warns_about_a_weak_guarantee(ranked_data, tmp_path, capsys):
    assert top_k.main(["--input", ranked_data, "--output", str(tmp_path / "o"), "--k", "3",
                       "--epsilon", "50", "--delta", "1e-6", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert [l for l in err.splitlines() if l.startswith("WARNING: ")] == [
        "WARNING: " + cal.guarantee_warnings(50, 1e-6)[0]]
    assert run_budget.warn_guarantee(1.0, 1e-6) == []


# --------------------------------------------------------------------------
# 5. η below its bound is refused: it would reopen the cascade.
# --------------------------------------------------------------------------

def test_check_eta_bound():
    assert params.MIN_ETA == 1e-12
    assert cal.check_eta(1e-12) == 1e-12
    for bad in (5e-324, 1e-13, 0.0, 1.0):
        with pytest.raises(ValueError, match=r"eta must be a number in \[1e-12, 1\)"):
            cal.check_eta(bad)
    # at the bounds, step 1's smallest raise η/Δ0 is a normal double
    assert params.MIN_ETA / params.MAX_MAX_ITEMS >= sys.float_info.min


def _cascade(eta):
    """The smallest cascade (docs/gw.md section 2) through the cascade-free update:
    users s {a}, (x {a}), c {a: 2, b: 1} with K_c = (a, b); Γ = 2. Returns H[b], H′[b]."""
    out = []
    for users in ([["a"], ["a", "b"]], [["a"], ["a"], ["a", "b"]]):
        hist = {}
        for walk in users:
            sequential.apply_cascade_free(hist, walk, 2.0, eta, 1.0 - eta)
        out.append(hist.get("b", 0.0))
    return out


def test_an_underflowing_eta_reopens_the_cascade_and_the_bound_closes_it():
    h, h_x = _cascade(5e-324)      # η/2 underflows to 0.0: b is new with x, outside K_x
    assert h == 0.0 and h_x == 1.0
    h, h_x = _cascade(params.MIN_ETA)
    assert h > 0.0 and h_x > 0.0    # b is in the support with and without x


@pytest.mark.parametrize("build", [
    lambda: GW(1, 1e-6, eta=5e-324),
    lambda: GWKT(1, 1e-6, {"a": 3}, eta=5e-324),
    lambda: make_mechanism("gw", epsilon=1, delta=1e-6, eta=5e-324),
    lambda: bud.PrivacyBudget(1, 1e-6).mechanism("gw", "gw", fraction=1, eta=1e-13),
])
def test_gw_constructors_refuse_a_tiny_eta(build):
    with pytest.raises(ValueError, match="eta"):
        build()


def test_gw_command_line_refuses_a_tiny_eta(tmp_path, capsys):
    rc = select_partitions.main(["--input", str(tmp_path / "none.tsv"), "--output",
                                 str(tmp_path / "o"), "--mechanism", "gw", "--epsilon", "1",
                                 "--delta", "1e-6", "--eta", "5e-324"])
    err = capsys.readouterr().err
    assert rc == 2 and "--eta must be a number in [1e-12, 1)" in err


def test_front_scale_advice_uses_public_numbers_only():
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[1]
    gw_md = " ".join((root / "docs" / "gw.md").read_text(encoding="utf-8").split())
    doc = " ".join(GWKT.__doc__.split())
    for text in (gw_md, doc):
        assert "public users / private users" not in text
        assert "κ/r is the matching value" not in text
    assert "only from public or DP-released numbers" in gw_md
    assert "from numbers already released with DP" in doc
    assert "public or DP-released" in params.MECHANISM_PARAMS["front_scale"].help
