"""PrivacyBudget: shares, composition arithmetic, over-spending, the stated total."""
import json
import math

import numpy as np
import pytest

from beam_dpsu.dp.privacy import accounting as acc
from beam_dpsu.dp.mechanisms import budget as bud
from beam_dpsu.dp.mechanisms import WeightedGaussian, WeightedGaussianZcdp
from beam_dpsu.dp.mechanisms.sips import Sips


# -- pure composition helpers ---------------------------------------------

def test_basic_composition_sums_epsilons_and_deltas():
    parts = [(0.5, 1e-7), (0.25, 2e-7), (1.25, 0.0)]
    eps, delta = bud.basic_composition(parts)
    assert eps == pytest.approx(math.fsum(e for e, _ in parts), rel=1e-15)
    assert delta == pytest.approx(math.fsum(d for _, d in parts), rel=1e-15)
    assert bud.basic_composition([]) == (0.0, 0.0)
    with pytest.raises(ValueError):
        bud.basic_composition([(-1.0, 0.0)])
    with pytest.raises(ValueError):
        bud.basic_composition([(1.0, 2.0)])


def test_fractions_of_weights():
    assert bud.fractions_of_weights({"keys": 1, "counts": 2}) == pytest.approx(
        {"keys": 1 / 3, "counts": 2 / 3}, rel=1e-15)
    for bad in ({}, {"a": 0}, {"a": -1}, {"a": float("inf")}, {"a": True}):
        with pytest.raises(ValueError):
            bud.fractions_of_weights(bad)


def test_zcdp_composition_adds_rho_then_converts_once():
    parts = [(0.1, 1e-7), (0.2, 2e-7), (0.05, 0.0)]
    g = bud.zcdp_composition_guarantee(parts, 1e-6)
    assert g.rho == pytest.approx(0.35, rel=1e-15)
    assert g.zcdp_delta == pytest.approx(3e-7, rel=1e-15)
    assert g.epsilon == acc.zcdp_to_dp_epsilon(0.35, 3e-7, 1e-6)
    assert g.delta == 1e-6
    # At dp_delta = 2·Σδ it is exactly the library's zcdp_guarantee of the sum.
    assert bud.zcdp_composition_guarantee(parts, 6e-7).epsilon == pytest.approx(
        acc.zcdp_guarantee(0.35, 3e-7).epsilon, rel=1e-12)
    # Converting once is tighter than converting each part and adding.
    separate = sum(acc.zcdp_to_dp_epsilon(r, d, d + 1e-6 / 3) for r, d in parts)
    assert g.epsilon < separate
    assert bud.zcdp_composition_guarantee([], 1e-6).epsilon == 0.0


def test_zcdp_composition_agrees_with_a_grid_over_the_renyi_order():
    # Independent computation of the DP-SIPS Corollary 9 conversion: δ' on a
    # fine grid of orders a (numpy), then the smallest ε on a fine ε grid.
    parts = [(0.2, 0.0), (0.3, 0.0)]
    rho, target = 0.5, 1e-6
    g = bud.zcdp_composition_guarantee(parts, target)
    a = 1.0 + np.logspace(-4, 3, 200001)
    def delta_at(eps):
        log_terms = (a - 1) * (a * rho - eps) - np.log(a - 1) + a * np.log1p(-1 / a)
        return float(np.exp(log_terms.min()))
    # delta_at(ε) ≥ the true infimum, so the grid ε is ≥ ours and close to it.
    assert delta_at(g.epsilon * (1 + 1e-6)) == pytest.approx(target, rel=1e-3)
    assert delta_at(g.epsilon * 0.99) > target


def test_zcdp_conversion_agrees_with_dp_accounting():
    # Google's dp-accounting: a Gaussian with noise multiplier σ = 1/√(2ρ) is
    # ρ-zCDP; its RDP accountant converts on a finite grid of orders with the
    # same (Canonne-Kamath-Steinke) bound, so its ε is ≥ ours and within 1%.
    rdp = pytest.importorskip("dp_accounting.rdp")
    import dp_accounting
    for rho, target in ((0.05, 1e-6), (0.5, 1e-5), (2.0, 1e-9)):
        a = rdp.RdpAccountant(orders=list(np.linspace(1.01, 200, 20000)))
        a.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1 / math.sqrt(2 * rho)))
        theirs = a.get_epsilon(target)
        ours = bud.zcdp_composition_guarantee([(rho, 0.0)], target).epsilon
        assert ours <= theirs * (1 + 1e-9)
        assert ours >= theirs * (1 - 1e-2)


@pytest.mark.parametrize("rho,eps,delta_dp", [(0.001, 0.14, 5.00e-5), (0.1, 1.765, 4.96e-5),
                                              (0.5, 4.41, 4.90e-5)])
def test_zcdp_pool_reproduces_dpsips_table4(rho, eps, delta_dp):
    # A pool of ρ with zCDP δ = 1e-5 spent in two releases states Table 4's ε
    # at Table 4's δ (the table prints three digits: 0.5% agreement).
    pool = bud.ZcdpBudget(rho, 1e-5, dp_delta=delta_dp)
    pool.weighted_gaussian("a", max_items=10, fraction=0.5)
    pool.sips("b", max_items=10, fraction=0.5)
    assert pool.guarantee().epsilon == pytest.approx(eps, rel=5e-3)


def test_pay_what_you_get_epsilon_is_the_largest_that_fits():
    eps_sel, delta_q, delta_1 = bud.pay_what_you_get_epsilon(1.0, 1e-6, 40, 4)
    assert delta_q == pytest.approx(1e-6 / 8) and delta_1 == pytest.approx(5e-7)
    at = acc.br_composition_guarantee(eps_sel, delta_q, 40, 4, delta_1)
    assert at.epsilon <= 1.0 and at.epsilon == pytest.approx(1.0, rel=1e-9)
    assert at.delta == pytest.approx(1e-6, rel=1e-12)
    assert acc.br_composition_guarantee(eps_sel * (1 + 1e-6), delta_q, 40, 4, delta_1).epsilon > 1.0
    # 40 selections: the bounded-range route beats basic composition (ε/40).
    assert eps_sel > 1.0 / 40


# -- PrivacyBudget ---------------------------------------------------------

def test_shares_by_fraction_build_mechanisms_with_those_parameters():
    budget = bud.PrivacyBudget(epsilon=2.0, delta=1e-6)
    fr = bud.fractions_of_weights({"keys": 1, "counts": 3})
    wg = budget.weighted_gaussian("keys", max_items=20, fraction=fr["keys"])
    share = budget.take("counts", fraction=fr["counts"])
    assert isinstance(wg, WeightedGaussian)
    assert wg.describe() == WeightedGaussian(0.5, 2.5e-7, 20).describe()
    assert (share.epsilon, share.delta) == pytest.approx((1.5, 7.5e-7), rel=1e-15)
    g = budget.guarantee()
    assert (g.epsilon, g.delta) == pytest.approx((2.0, 1e-6), rel=1e-12)
    d = budget.describe()
    json.dumps(d)  # JSON-ready for the public summary
    assert [p["name"] for p in d["parts"]] == ["keys", "counts"]
    assert d["epsilon"] == pytest.approx(math.fsum(p["epsilon"] for p in d["parts"]), rel=1e-15)
    assert d["delta"] == pytest.approx(math.fsum(p["delta"] for p in d["parts"]), rel=1e-15)


def test_overspending_is_rejected_when_the_share_is_taken():
    budget = bud.PrivacyBudget(epsilon=1.0, delta=1e-6)
    budget.weighted_gaussian("a", max_items=5, fraction=0.6)
    with pytest.raises(ValueError, match="overspent by 'b'"):
        budget.weighted_gaussian("b", max_items=5, fraction=0.6)
    with pytest.raises(ValueError, match="overspent"):
        budget.take("c", epsilon=0.3, delta=5e-7)     # δ would be 1.1e-6
    with pytest.raises(ValueError, match="overspent"):
        budget.zcdp("d", epsilon=0.5, delta=1e-7)      # ε would be 1.1
    with pytest.raises(ValueError, match="overspent"):
        budget.pay_what_you_get("e", 10, 2, fraction=0.5)
    # Refused shares were not recorded; the remainder is still available.
    assert budget.allocated.epsilon == pytest.approx(0.6)
    budget.take("f", epsilon=0.4, delta=4e-7)
    assert budget.remaining.epsilon == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        budget.take("g", epsilon=1e-3, delta=1e-9)


def test_bad_share_arguments_are_rejected():
    budget = bud.PrivacyBudget(1.0, 1e-6)
    for kwargs in ({}, {"fraction": 0}, {"fraction": 1.5}, {"fraction": 0.5, "epsilon": 0.1},
                   {"epsilon": 0.1}, {"epsilon": -1, "delta": 1e-7}):
        with pytest.raises(ValueError):
            budget.take("x", **kwargs)
    budget.take("x", fraction=0.1)
    with pytest.raises(ValueError, match="already taken"):
        budget.take("x", fraction=0.1)
    with pytest.raises(ValueError, match="rho"):
        budget.mechanism("y", "weighted-gaussian", fraction=0.1, rho=0.1)
    for bad in ((0, 1e-6), (1.0, 0), (1.0, 1.0)):
        with pytest.raises(ValueError):
            bud.PrivacyBudget(*bad)


def test_registered_mechanisms_take_shares():
    budget = bud.PrivacyBudget(3.0, 1e-6)
    gw = budget.mechanism("gw", "gw", fraction=1 / 3)
    sips = budget.mechanism("sips", "sips", fraction=1 / 3, max_items=10, rounds=2)
    cl = budget.mechanism("cl", "count-laplace", fraction=1 / 3, max_items=10)
    assert gw.guarantee.epsilon == pytest.approx(1.0) and sips.guarantee.epsilon == pytest.approx(1.0)
    assert cl.guarantee.delta == pytest.approx(1e-6 / 3)
    g = budget.guarantee()
    assert (g.epsilon, g.delta) == pytest.approx((3.0, 1e-6), rel=1e-12)


def test_an_unproven_variant_is_refused_and_takes_nothing():
    budget = bud.PrivacyBudget(3.0, 1e-6)
    with pytest.raises(ValueError, match="not proven"):
        budget.mechanism("gw", "gw", fraction=0.5, variant="published", allow_unproven=True)
    assert budget.mechanism("gw", "gw", fraction=1.0).proven  # the whole budget is left


def test_zcdp_pool_composes_in_zcdp_and_fits_its_share():
    budget = bud.PrivacyBudget(epsilon=2.0, delta=1e-6)
    pool = budget.zcdp("selection", fraction=0.5)        # share (1, 5e-7)
    rho = acc.dp_to_zcdp_rho(1.0, 5e-7, 2.5e-7)
    assert pool.rho == pytest.approx(rho, rel=1e-12) and pool.delta == pytest.approx(2.5e-7)
    wg = pool.weighted_gaussian("round-a", max_items=10, fraction=0.25)
    sips = pool.sips("round-b", max_items=10, fraction=0.75, rounds=2)
    assert isinstance(wg, WeightedGaussianZcdp) and isinstance(sips, Sips)
    assert wg.calibration.rho == pytest.approx(rho / 4) and sips.rho == pytest.approx(rho * 3 / 4)
    with pytest.raises(ValueError, match="overspent"):
        pool.take("more", rho=rho * 1e-3, delta=1e-12)
    g = pool.guarantee()
    assert g.epsilon == pytest.approx(acc.zcdp_to_dp_epsilon(rho, 2.5e-7, 5e-7), rel=1e-12)
    assert g.epsilon <= 1.0 * (1 + 1e-9) and g.epsilon == pytest.approx(1.0, rel=1e-6)
    # The same two releases as separate (ε, δ) shares would each convert on their own.
    separate = (acc.zcdp_guarantee(rho / 4, 2.5e-7 / 4).epsilon
                + acc.zcdp_guarantee(rho * 3 / 4, 2.5e-7 * 3 / 4).epsilon)
    assert g.epsilon < separate
    budget.take("counts", fraction=0.5)
    total = budget.guarantee()
    assert total.epsilon == pytest.approx(g.epsilon + 1.0, rel=1e-12)
    assert total.delta == pytest.approx(1e-6, rel=1e-12)
    json.dumps(budget.describe())


def test_partly_spent_zcdp_pool_states_what_was_spent():
    pool = bud.ZcdpBudget(0.5, 1e-6)
    assert pool.dp_delta == 2e-6 and pool.guarantee().epsilon == 0.0
    pool.take("half", fraction=0.5)
    assert pool.guarantee().epsilon == pytest.approx(
        acc.zcdp_to_dp_epsilon(0.25, 5e-7, 2e-6), rel=1e-12)
    with pytest.raises(ValueError):
        bud.ZcdpBudget(0.5, 1e-6, dp_delta=1e-6)


def test_pay_what_you_get_share_charges_top_k_selections():
    budget = bud.PrivacyBudget(epsilon=2.0, delta=1e-6)
    topk = budget.pay_what_you_get("top-k", max_selections=20, max_queries=2, fraction=0.5)
    g = topk.guarantee()
    assert g.epsilon <= 1.0 * (1 + 1e-12) and g.epsilon == pytest.approx(1.0, rel=1e-9)
    assert g.delta == pytest.approx(5e-7, rel=1e-12)
    topk.record(10, 3)                                    # charged 4 selections
    assert topk.remaining_selections == 16
    with pytest.raises(ValueError):
        topk.check(17)
    total = budget.guarantee()
    assert total.epsilon == pytest.approx(g.epsilon, rel=1e-12)   # the only part
    assert budget.describe()["parts"][0]["detail"]["spent_selections"] == 4


def test_pay_what_you_get_epsilon_rejects_bad_counts():
    for sel, q in ((0, 1), (1, 0), (2.0, 1), (True, 1)):
        with pytest.raises(ValueError):
            bud.pay_what_you_get_epsilon(1.0, 1e-6, sel, q)


def test_restate_shows_a_calibrated_copy_with_the_same_guarantee():
    from beam_dpsu.dp.mechanisms.activity import ScaleEstimate
    from beam_dpsu.dp.mechanisms.policy import GWKT
    public = {f"i{j}": max(1, 3000 // j) for j in range(1, 300)}
    b = bud.PrivacyBudget(3.0, 1e-6)
    m = b.mechanism("select", "gw-kt", fraction=1.0, public_counts=public)
    c = m.calibrated(ScaleEstimate((0.0, 0.0, 5000.0, 0.0), m.calibration_epsilon))
    assert b.describe()["parts"][0]["detail"]["front_scale"] is None   # before
    b.restate("select", c)
    detail = b.describe()["parts"][0]["detail"]
    assert (detail["front_scale"], detail["max_items_per_user"]) == (c.front_scale,
                                                                     c.max_items)
    with pytest.raises(ValueError, match="no .* release named"):
        b.restate("other", c)
    with pytest.raises(ValueError, match="states"):
        b.restate("select", GWKT(2.0, 1e-6, public))
