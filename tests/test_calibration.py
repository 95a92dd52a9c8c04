"""Calibration against the numbers of docs/mechanisms.md and independent computations."""
import math

import numpy as np
import pytest
from scipy import stats

from beam_dpsu.dp.privacy import calibration as cal

E10 = math.exp(-10)


def rel(a, b):
    return abs(a - b) / abs(b)


# ---- Constants of the authors' code (issue: agree to 8 significant digits) ----

def test_weighted_laplace_thresholds_match_authors():
    assert rel(cal.weighted_laplace_threshold(3, E10, 10), 4.10228427314668) < 1e-8
    assert rel(cal.weighted_laplace_threshold(3, E10, 100), 4.64733351067955) < 1e-8


def test_weighted_gaussian_matches_authors():
    assert rel(cal.weighted_gaussian_sigma(3, E10), 1.33279132940618) < 1e-8
    # The authors' code prints 6.8236609679 because it computes 1 − (1 − δ)^(1/t) naively.
    assert rel(cal.weighted_gaussian_threshold(3, E10, 100), 6.82366098102885) < 1e-8


def test_zcdp_weighted_gaussian_matches_authors():
    assert rel(cal.zcdp_weighted_gaussian_sigma(0.1), 2.23606797749979) < 1e-12
    assert rel(cal.zcdp_weighted_gaussian_threshold(0.1, 1e-5, 100), 11.7260702142162) < 1e-8


# ---- Primitives ----

@pytest.mark.parametrize("delta", [1e-2, 1e-6, 1e-12, 1e-30])
@pytest.mark.parametrize("t", [1, 2, 7, 100, 10 ** 6])
def test_per_item_delta_solves_its_equation(delta, t):
    dt = cal.per_item_delta(delta, t)
    # (1 − δ_t)^t = 1 − δ, checked in log space: t·log1p(−δ_t) = log1p(−δ).
    assert rel(t * math.log1p(-dt), math.log1p(-delta)) < 1e-12
    assert dt <= delta and (t > 1 or dt == pytest.approx(delta, rel=1e-15))


def test_per_item_delta_is_accurate_where_naive_formula_fails():
    # Naively 1 − (1 − 1e-17)^(1/10) is exactly 0 in floating point.
    assert 1 - (1 - 1e-17) ** 0.1 == 0.0
    assert rel(cal.per_item_delta(1e-17, 10), 1e-18) < 1e-12
    arr = cal.per_item_delta(1e-5, np.array([1, 10]))
    assert rel(arr[1], cal.per_item_delta(1e-5, 10)) < 1e-15


def _agm_lhs(sigma, eps, sens):
    # Independent evaluation with scipy's CDF (not the log-space code under test).
    a = sens / (2 * sigma) - eps * sigma / sens
    b = -sens / (2 * sigma) - eps * sigma / sens
    return stats.norm.cdf(a) - math.exp(eps) * stats.norm.cdf(b)


@pytest.mark.parametrize("eps,delta,sens", [(3, E10 / 2, 1), (1, 1e-5, 1), (0.1, 1e-6, 2.5),
                                            (3, 1e-5 / 2, math.sqrt(50)), (8, 1e-9, 1)])
def test_analytic_gaussian_is_the_smallest_valid_sigma(eps, delta, sens):
    sigma = cal.analytic_gaussian_sigma(eps, delta, sens)
    assert _agm_lhs(sigma, eps, sens) <= delta * (1 + 1e-9)
    assert _agm_lhs(sigma * (1 - 1e-7), eps, sens) > delta
    # Scales linearly with the sensitivity.
    assert rel(cal.analytic_gaussian_sigma(eps, delta, 2 * sens), 2 * sigma) < 1e-9


def test_analytic_gaussian_beats_the_classical_bound():
    eps, delta = 0.5, 1e-5
    classical = math.sqrt(2 * math.log(1.25 / delta)) / eps
    assert cal.analytic_gaussian_sigma(eps, delta) < classical


# ---- Thresholds, against a plain-Python evaluation of the spec's formulas ----

def _max_t(dmax, f):
    return max(f(t) for t in range(1, dmax + 1))


def _pid(delta, t):
    return -math.expm1(math.log1p(-delta) / t)


@pytest.mark.parametrize("eps,delta,dmax", [(3, E10, 1), (3, E10, 10), (1, 1e-6, 37), (0.5, 1e-8, 300)])
def test_thresholds_match_plain_python(eps, delta, dmax):
    lam = 1 / eps
    assert rel(cal.weighted_laplace_threshold(eps, delta, dmax),
               _max_t(dmax, lambda t: 1 / t + lam * math.log(1 / (2 * _pid(delta, t))))) < 1e-12
    s = cal.weighted_gaussian_sigma(eps, delta)
    assert rel(cal.weighted_gaussian_threshold(eps, delta, dmax),
               _max_t(dmax, lambda t: 1 / math.sqrt(t)
                      + s * stats.norm.isf(_pid(delta / 2, t)))) < 1e-10
    lam_c = dmax / eps
    assert rel(cal.count_laplace_threshold(eps, delta, dmax),
               1 + lam_c * math.log(1 / (2 * _pid(delta, dmax)))) < 1e-12
    sc = cal.count_gaussian_sigma(eps, delta, dmax)
    assert rel(sc, cal.analytic_gaussian_sigma(eps, delta / 2, math.sqrt(dmax))) < 1e-15
    assert rel(cal.count_gaussian_threshold(eps, delta, dmax),
               1 + sc * stats.norm.isf(_pid(delta / 2, dmax))) < 1e-10
    rho = eps ** 2 / 8
    sz = 1 / math.sqrt(2 * rho)
    assert rel(cal.zcdp_weighted_gaussian_threshold(rho, delta, dmax),
               _max_t(dmax, lambda k: 1 / math.sqrt(k) + sz * stats.norm.isf(_pid(delta, k)))) < 1e-10


def test_threshold_max_is_evaluated_across_chunks(monkeypatch):
    whole = cal.weighted_gaussian_threshold(1, 1e-6, 5000)
    monkeypatch.setattr(cal, "_CHUNK", 7)
    assert cal.weighted_gaussian_threshold(1, 1e-6, 5000) == pytest.approx(whole, rel=1e-15)


def test_gw_threshold():
    assert rel(cal.gw_threshold(3, E10), 1 - math.log(2 * E10) / 3) < 1e-15
    assert cal.gw_threshold(1, 0.4999) >= 1
    with pytest.raises(ValueError, match="delta"):
        cal.gw_threshold(1, 0.5)


def test_policy_cutoff():
    assert cal.policy_cutoff(5.0, 2.0, 3) == 11.0
    with pytest.raises(ValueError, match="alpha"):
        cal.policy_cutoff(5.0, 2.0, -1)


# ---- Truncated geometric ----

def test_truncated_geometric_recurrence_and_dp_constraints():
    eps, delta, dmax = 1.0, 1e-6, 4
    p = cal.truncated_geometric_keep_probabilities(eps, delta, dmax, 400)
    e1, d1 = eps / dmax, _pid(delta, dmax)
    # Independent recomputation of the recurrence.
    q = [0.0]
    for _ in range(400):
        q.append(min(math.exp(e1) * q[-1] + d1, 1 - math.exp(-e1) * (1 - q[-1] - d1), 1.0))
    np.testing.assert_allclose(p, q, rtol=1e-12, atol=0)
    assert p[0] == 0 and p[1] == pytest.approx(d1) and p[-1] == 1.0
    assert np.all(np.diff(p) >= 0)
    # (ε', δ')-DP between n and n−1 users, both for keeping and for dropping.
    assert np.all(p[1:] <= math.exp(e1) * p[:-1] + d1 + 1e-15)
    assert np.all(1 - p[:-1] <= math.exp(e1) * (1 - p[1:]) + d1 + 1e-15)


def test_truncated_geometric_single_value():
    probs = cal.truncated_geometric_keep_probabilities(3, E10, 10, 50)
    assert cal.truncated_geometric_keep_probability(3, E10, 10, 17) == probs[17]


# ---- Validation ----

@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "1", None, True])
def test_bad_epsilon_rejected(bad):
    with pytest.raises(ValueError, match="epsilon"):
        cal.weighted_gaussian_threshold(bad, 1e-5, 10)


@pytest.mark.parametrize("bad", [0, 1, -0.1, 1.5, float("nan"), None])
def test_bad_delta_rejected(bad):
    with pytest.raises(ValueError, match="delta"):
        cal.count_laplace_threshold(1, bad, 10)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "10", None, True])
def test_bad_max_items_rejected(bad):
    with pytest.raises(ValueError, match="max_items_per_user"):
        cal.weighted_laplace_threshold(1, 1e-5, bad)


def test_integral_float_max_items_accepted():
    assert cal.check_max_items(10.0) == 10


# ---------------------------------------------------------------------------
# Cascade-free GW threshold (docs/gw.md section 1.2).
# ---------------------------------------------------------------------------

def _cascade_free_delta_direct(eps, d0, t):
    # Independent evaluation: the product form with plain floats (fine for δ ≳ 1e-6).
    return 1 - (1 - 0.5 * math.exp(-eps * (t - 1))) * (1 - 0.5 * math.exp(-eps * t)) ** (d0 - 1)


@pytest.mark.parametrize("eps,delta", [(3, E10), (1, 1e-3), (0.5, 1e-6), (8, 1e-9), (1, 0.4)])
@pytest.mark.parametrize("d0", [1, 2, 10, 100, 1000])
def test_gw_cascade_free_threshold_is_the_smallest_t_meeting_delta(eps, delta, d0):
    t = cal.gw_cascade_free_threshold(eps, delta, d0)
    bound = cal.gw_cascade_free_threshold_bound(eps, delta, d0)
    assert 1 <= t <= bound * (1 + 2e-11)   # equal for Δ0 = 1, up to rounding and the margin
    # At T the δ expression is at most δ; slightly below T it exceeds δ.
    assert cal.gw_cascade_free_delta(eps, d0, t) <= delta
    assert cal.gw_cascade_free_delta(eps, d0, t - 1e-9 * t) > delta
    if delta >= 1e-6:   # the direct form's rounding error is ≲ Δ0·1e-16, ≤ 1e-7 relative
        assert _cascade_free_delta_direct(eps, d0, t) <= delta * (1 + 1e-7)
        assert _cascade_free_delta_direct(eps, d0, t - 1e-6 * t) > delta
    # The closed form is the union bound: it is tight to within the product's
    # second-order terms, at most (Δ0 p)² with p ≤ δ.
    assert bound - t <= (1 / eps) * 2 * delta * d0 + 1e-12 * bound
    # Independent root finder (scipy's brentq on the direct formula).
    if delta >= 1e-6:
        from scipy.optimize import brentq
        root = brentq(lambda x: _cascade_free_delta_direct(eps, d0, x) - delta, 1.0, bound + 1,
                      xtol=1e-14, rtol=1e-14)
        assert t == pytest.approx(root, rel=1e-9)


def _cascade_free_delta_decimal(eps, d0, t):
    # Independent evaluation at tiny δ: the product form in decimal arithmetic with
    # 450 significant digits, so that 1 − (1 − x) keeps x down to 1e-400 (floats give 0).
    import decimal
    with decimal.localcontext() as ctx:
        ctx.prec = 450
        eps, t, half = decimal.Decimal(eps), decimal.Decimal(t), decimal.Decimal("0.5")
        first = 1 - half * (-eps * (t - 1)).exp()
        rest = (1 - half * (-eps * t).exp()) ** (d0 - 1)
        return 1 - first * rest


@pytest.mark.parametrize("eps,delta,d0", [
    (eps, delta, d0) for delta in (1e-12, 1e-50, 1e-150, 1e-300)
    for eps, d0 in ((0.1, 1), (1, 5), (3, 100), (8, 1000))] + [
    (1e-4, 0.4999, 1), (1e-4, 0.45, 3), (1e-3, 0.4999, 1), (0.01, 0.49, 1)])
def test_gw_cascade_free_threshold_at_tiny_delta_against_decimal_arithmetic(eps, delta, d0):
    # The solver inverts the library's log1p/expm1 form in floats; here δ(T) comes
    # from the plain product in 450-digit decimals instead. At T the exact δ(T) is at
    # most δ (the double the caller passed, exactly): the solver's float error (up to
    # 1.7e-13 relative in T, at small ε and δ near 1/2) is covered by its margin. A relative step of 1e-9 below T
    # exceeds δ (it changes δ(T) by a factor of about e^(ε·T·1e-9)).
    import decimal
    t = cal.gw_cascade_free_threshold(eps, delta, d0)
    target = decimal.Decimal(delta)
    assert _cascade_free_delta_decimal(eps, d0, t) <= target
    # ... and the margin costs almost nothing: below T by 1e-13 relative, the exact
    # δ(T) is still within a relative 1e-10 of δ
    assert _cascade_free_delta_decimal(eps, d0, t * (1 - 1e-13)) <= target * (
        1 + decimal.Decimal("1e-10"))
    assert _cascade_free_delta_decimal(eps, d0, t * (1 - 1e-9)) > target
    if d0 == 1:   # the published closed form, evaluated in decimals too
        closed = 1 - (2 * target).ln() / decimal.Decimal(eps)
        assert abs(decimal.Decimal(t) - closed) <= closed * decimal.Decimal("2e-11")  # margin


def test_gw_cascade_free_threshold_with_one_item_is_the_published_threshold():
    # Δ0 = 1: 1 − (1 − ½e^(−ε(T−1))) = ½e^(−ε(T−1)) ≤ δ  ⇔  T ≥ 1 − log(2δ)/ε.
    for eps, delta in [(3, E10), (1, 1e-3), (0.1, 0.2)]:
        assert cal.gw_cascade_free_threshold(eps, delta, 1) == pytest.approx(
            cal.gw_threshold(eps, delta), rel=2e-11)   # the solver's margin: 1e-11
        assert cal.gw_cascade_free_threshold_bound(eps, delta, 1) == pytest.approx(
            cal.gw_threshold(eps, delta), rel=1e-15)


def test_gw_cascade_free_threshold_grows_with_max_items_and_matches_spec_numbers():
    ts = [cal.gw_cascade_free_threshold(3, E10, d0) for d0 in (1, 10, 30, 100, 300)]
    assert ts == sorted(ts) and ts[0] < ts[-1]
    # ε = 3, δ = e^-10: the published T is 1 + (10 − log 2)/3 = 4.1023; the
    # extra is at most log(1 + (Δ0 − 1)e^-3)/3 (0.5949 for Δ0 = 100).
    assert ts[0] == pytest.approx(1 + (10 - math.log(2)) / 3, rel=2e-11)
    extra = math.log(1 + 99 * math.exp(-3)) / 3
    assert ts[3] - ts[0] == pytest.approx(extra, abs=1e-5) and ts[3] - ts[0] <= extra


def test_gw_cascade_free_threshold_tiny_delta_and_validation():
    # δ = 1e-300: the log1p/expm1 forms keep full precision (the direct form gives 0).
    t = cal.gw_cascade_free_threshold(1, 1e-300, 5)
    assert math.isfinite(t) and cal.gw_cascade_free_delta(1, 5, t) <= 1e-300
    assert cal.gw_cascade_free_delta(1, 5, t * (1 - 1e-9)) > 1e-300
    with pytest.raises(ValueError, match="delta"):
        cal.gw_cascade_free_threshold(1, 0.5, 3)
    with pytest.raises(ValueError, match="max_items"):
        cal.gw_cascade_free_threshold(1, 1e-3, 0)
    with pytest.raises(ValueError, match="epsilon"):
        cal.gw_cascade_free_threshold(0, 1e-3, 3)
    with pytest.raises(ValueError, match="threshold"):
        cal.gw_cascade_free_delta(1, 3, 0.5)
    with pytest.raises(ValueError, match="eta"):
        cal.check_eta(0.0)
    with pytest.raises(ValueError, match="eta"):
        cal.check_eta(1.0)
    assert cal.check_eta(0.05) == 0.05


# -- Φ without scipy.special (the launcher no longer imports it) ----------------------

def test_log_ndtr_matches_scipy_in_both_tails():
    from scipy import special
    xs = np.concatenate([-np.logspace(-8, 6, 3000), np.logspace(-8, 1.6, 1500),
                         np.linspace(-40.0, 10.0, 5001), [0.0, -20.0, -19.999999]])
    for x in xs:
        got, want = cal.log_ndtr(x), float(special.log_ndtr(x))
        assert abs(got - want) <= 1e-13 * abs(want) + 1e-300, (x, got, want)
    assert cal.log_ndtr(math.inf) == 0.0 and cal.log_ndtr(-math.inf) == -math.inf


def test_normal_isf_matches_scipy_from_1e300_to_one():
    from scipy import special
    ps = np.concatenate([np.logspace(-300, math.log10(0.4999), 12000),
                         np.linspace(1e-6, 0.999, 4000)])
    assert ps.size <= cal._PURE_ISF_MAX_SIZE  # the pure path
    got, want = cal.normal_isf(ps), -special.ndtri(ps)
    assert np.all(np.abs(got - want) <= 1e-14 * np.abs(want)), ps[np.argmax(np.abs(got - want))]
    assert isinstance(cal.normal_isf(1e-5), float)
    assert cal.normal_isf(1e-5) == pytest.approx(4.264890793922825, rel=1e-15)
    # scipy's path: a large array, and p below what AS241 was fitted on
    big = np.linspace(1e-9, 0.1, cal._PURE_ISF_MAX_SIZE + 1)
    assert np.array_equal(cal.normal_isf(big), -special.ndtri(big))
    assert cal.normal_isf(1e-310) == -special.ndtri(1e-310)


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 1.0, 3.0, 10.0, 50.0])
@pytest.mark.parametrize("delta", [1e-300, 1e-50, 1e-12, 1e-6, 1e-3, 0.3])
def test_analytic_gaussian_sigma_agrees_with_the_scipy_computation(epsilon, delta, monkeypatch):
    # The same bisection with scipy's log Φ: σ agrees to the conditioning of the
    # formula (log Φ(a) − log Φ(b) cancels when ε is small and δ tiny: 5e-11 at
    # ε = 0.01, δ = 1e-300; about 1e-13 for ε ≥ 0.1 and δ ≥ 1e-12).
    from scipy import special
    ours = cal.analytic_gaussian_sigma(epsilon, delta, 2.0)
    monkeypatch.setattr(cal, "log_ndtr", lambda x: float(special.log_ndtr(x)))
    theirs = cal.analytic_gaussian_sigma(epsilon, delta, 2.0)
    tol = 1e-12 if epsilon >= 0.1 and delta >= 1e-12 else 1e-10
    assert ours == pytest.approx(theirs, rel=tol)


@pytest.mark.parametrize("epsilon", [0.01, 0.01362, 0.1, 1.0, 3.0, 10.0, 50.0])
@pytest.mark.parametrize("delta", [1e-300, 1e-250, 1e-240, 1e-100, 1e-50, 1e-12, 1e-6, 1e-3,
                                   0.3])
@pytest.mark.parametrize("sensitivity", [1.0, 2.0, 1000 ** 0.5])
def test_analytic_gaussian_sigma_meets_the_exact_condition_in_90_digits(epsilon, delta,
                                                                       sensitivity):
    # Balle and Wang's condition evaluated with mpmath at 90 digits (Φ as mpmath's
    # ncdf, no log-space code): at the returned σ it holds exactly (the float root
    # alone falls short by up to 2.7e-11 at ε = 0.01, δ = 1e-250 and 1e-240); 1e-7
    # below it fails, so σ is no larger than needed beyond its 3e-9 margin.
    import mpmath
    with mpmath.workdps(90):
        def lhs(sigma):
            s, e, d = mpmath.mpf(sigma), mpmath.mpf(epsilon), mpmath.mpf(sensitivity)
            return (mpmath.ncdf(d / (2 * s) - e * s / d)
                    - mpmath.exp(e) * mpmath.ncdf(-d / (2 * s) - e * s / d))
        sigma = cal.analytic_gaussian_sigma(epsilon, delta, sensitivity)
        assert lhs(sigma) <= mpmath.mpf(delta)
        assert lhs(sigma * (1 - 1e-7)) > mpmath.mpf(delta)


def test_the_gaussian_thresholds_agree_with_the_scipy_computation(monkeypatch):
    from scipy import special
    ours = [cal.weighted_gaussian_threshold(3.0, 1e-5, 100),
            cal.count_gaussian_threshold(1.0, 1e-8, 30),
            cal.zcdp_weighted_gaussian_threshold(0.1, 1e-6, 1000)]
    monkeypatch.setattr(cal, "log_ndtr", lambda x: float(special.log_ndtr(x)))
    monkeypatch.setattr(cal, "normal_isf", lambda p: -special.ndtri(p))
    theirs = [cal.weighted_gaussian_threshold(3.0, 1e-5, 100),
              cal.count_gaussian_threshold(1.0, 1e-8, 30),
              cal.zcdp_weighted_gaussian_threshold(0.1, 1e-6, 1000)]
    assert ours == pytest.approx(theirs, rel=1e-13)


def test_a_gaussian_calibration_imports_no_scipy_special():
    # The launcher of a command line calibrates before its first stage: importing
    # scipy.special took about 0.33 s of it.
    import subprocess
    import sys
    code = ("import sys; from beam_dpsu.dp.privacy import calibration as c; "
            "c.weighted_gaussian_threshold(3.0, 1e-5, 100); c.count_gaussian_threshold(1, 1e-6, 10); "
            "print('scipy.special' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(__import__("os").environ,
                                               PYTHONPATH=str(__import__("pathlib").Path(
                                                   __file__).resolve().parents[1])))
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_check_flag_takes_only_booleans():
    import numpy as np
    assert cal.check_flag(True, "f") is True and cal.check_flag(np.bool_(False), "f") is False
    for bad in ("no", "", 0, 1, 1.0, None, [True]):
        with pytest.raises(ValueError, match="f must be True or False"):
            cal.check_flag(bad, "f")


@pytest.mark.parametrize("epsilon", [1e-3, 1e-5, 1e-7, 1e-10, 1e-12])
@pytest.mark.parametrize("delta", [1e-300, 1e-100, 1e-20, 1e-5])
def test_analytic_gaussian_sigma_holds_where_its_condition_cancels_in_floats(epsilon, delta):
    # A tiny ε with a tiny δ: the two terms of Balle and Wang's condition cancel to about
    # 1/(εσ²) of each, beyond what the 3e-9 margin absorbs (the float root's condition
    # measured 3e-5 above δ at ε = 1e-6, δ = 1e-100). σ then comes from
    # gaussian_log_delta_bound: the exact condition holds in 80 digits, and σ is within
    # 1% of the smallest that meets it.
    import mpmath
    with mpmath.workdps(80):
        def lhs(sigma):
            s, e = mpmath.mpf(sigma), mpmath.mpf(epsilon)
            return mpmath.ncdf(1 / (2 * s) - e * s) - mpmath.exp(e) * mpmath.ncdf(-1 / (2 * s) - e * s)
        sigma = cal.analytic_gaussian_sigma(epsilon, delta)
        assert lhs(sigma) <= mpmath.mpf(delta)
        assert lhs(sigma * 0.99) > mpmath.mpf(delta)
        assert lhs(cal.analytic_gaussian_sigma(epsilon, delta, 3.0) / 3) <= mpmath.mpf(delta)


def test_the_gaussian_delta_bound_is_above_the_exact_delta_in_60_digits():
    # gaussian_log_delta_bound (Birnbaum's bound on Mills' ratio, no subtraction) is at
    # least the exact δ everywhere, and within a relative 1.5/(εσ)² of it where εσ² is
    # large and εσ above 3 (Birnbaum's bound errs by about 1/u³ on u + 1/u; at u ≈ 0 the
    # bound is 20% high)
    import mpmath
    rng = np.random.default_rng(5)
    points = [(10 ** rng.uniform(-1, 13), 10 ** rng.uniform(-12, 1)) for _ in range(300)]
    with mpmath.workdps(60):
        for sigma, epsilon in points:
            s, e = mpmath.mpf(sigma), mpmath.mpf(epsilon)
            exact = mpmath.ncdf(1 / (2 * s) - e * s) - mpmath.exp(e) * mpmath.ncdf(-1 / (2 * s) - e * s)
            if not exact > mpmath.mpf(1e-320):   # far below any δ a mechanism accepts
                continue
            excess = cal.gaussian_log_delta_bound(sigma, epsilon) - float(mpmath.log(exact))
            assert excess >= 0, (sigma, epsilon)
            if epsilon * sigma ** 2 > 1e6 and epsilon * sigma > 3:   # in the tail
                assert excess < 1.5 / (epsilon * sigma) ** 2, (sigma, epsilon)
