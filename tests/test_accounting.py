"""zCDP composition and conversion, against the DP-SIPS paper's Table 4."""
import math

import pytest

from beam_dpsu.dp.privacy import accounting as acc


@pytest.mark.parametrize("rho,eps,delta_dp,order", [
    (0.001, 0.14, 5.00e-5, 77.03), (0.1, 1.765, 4.96e-5, 9.86), (0.5, 4.41, 4.90e-5, 5.127)])
def test_table4(rho, eps, delta_dp, order):
    got = acc.zcdp_to_dp_delta(rho, 1e-5, eps)
    # The table prints three digits and its ε are themselves rounded: agree to 0.2%.
    assert got == pytest.approx(delta_dp, rel=2e-3)
    _, a = acc.zcdp_delta_prime(rho, eps)
    assert a == pytest.approx(order, rel=2e-3)


def test_delta_prime_is_the_minimum_over_a_grid():
    rho, eps = 0.1, 1.765
    dprime, _ = acc.zcdp_delta_prime(rho, eps)
    grid = [1 + 10 ** (k / 400) for k in range(-1600, 681)]   # a from 1 + 1e-4 to about 50
    brute = min(math.exp((a - 1) * (a * rho - eps)) / (a - 1) * (1 - 1 / a) ** a for a in grid)
    assert dprime <= brute * (1 + 1e-9)
    assert dprime >= brute * (1 - 1e-3)


@pytest.mark.parametrize("rho", [1e-14, 1e-10, 1e-6, 1e-3, 0.1, 1.0, 100.0])
@pytest.mark.parametrize("eps", [0.0, 1e-6, 0.01, 1.0, 5.0, 50.0])
def test_delta_prime_is_never_below_its_exact_value_at_the_order_found(rho, eps):
    # Any order a > 1 gives a valid δ'; the stated one must be at least the exact
    # expression at the returned a (mpmath, 60 digits, the plain formula).
    import mpmath
    dprime, a = acc.zcdp_delta_prime(rho, eps)
    if dprime == 1.0:   # capped: trivially valid (ρ = 100: the order found rounds to 1)
        return
    with mpmath.workdps(60):
        A, R, E = mpmath.mpf(a), mpmath.mpf(rho), mpmath.mpf(eps)
        exact = mpmath.exp((A - 1) * (A * R - E)) / (A - 1) * (1 - 1 / A) ** A
        assert mpmath.mpf(dprime) >= exact
        # and the margin is small: within 1e-11 of it (or the smallest double, when
        # the exact value is below it)
        assert mpmath.mpf(dprime) <= max(exact * (1 + mpmath.mpf("1e-11")),
                                         mpmath.mpf(5e-324))


def test_epsilon_inverse_round_trip():
    eps = acc.zcdp_to_dp_epsilon(0.1, 1e-5, 4.96e-5)
    assert eps == pytest.approx(1.765, abs=2e-3)
    assert acc.zcdp_to_dp_delta(0.1, 1e-5, eps) <= 4.96e-5
    assert acc.zcdp_to_dp_delta(0.1, 1e-5, eps * (1 - 1e-9)) > 4.96e-5 * (1 - 1e-6)


def test_rho_inverse_round_trip():
    rho = acc.dp_to_zcdp_rho(1.765, 4.96e-5, 1e-5)
    assert rho == pytest.approx(0.1, rel=1e-3)
    assert acc.zcdp_to_dp_delta(rho, 1e-5, 1.765) <= 4.96e-5
    assert acc.zcdp_to_dp_delta(rho * 1.001, 1e-5, 1.765) > 4.96e-5


def test_delta_increases_with_rho_and_decreases_with_epsilon():
    assert acc.zcdp_to_dp_delta(0.2, 1e-5, 2) > acc.zcdp_to_dp_delta(0.1, 1e-5, 2)
    assert acc.zcdp_to_dp_delta(0.1, 1e-5, 3) < acc.zcdp_to_dp_delta(0.1, 1e-5, 2)


def test_compose():
    assert acc.compose_zcdp([(0.1, 1e-6), (0.2, 2e-6)]) == pytest.approx((0.3, 3e-6))
    with pytest.raises(ValueError):
        acc.compose_zcdp([(0, 1e-6)])


def test_zcdp_guarantee_convention():
    g = acc.zcdp_guarantee(0.1, 1e-5)
    assert g.delta == 2e-5 and g.rho == 0.1 and g.zcdp_delta == 1e-5
    assert acc.zcdp_to_dp_delta(0.1, 1e-5, g.epsilon) <= 2e-5
    # Sanity against the simple bound ε = ρ + 2√(ρ log(1/δ')), which is looser.
    assert g.epsilon < 0.1 + 2 * math.sqrt(0.1 * math.log(1 / 1e-5))


def test_rho_too_small_for_target_is_an_error():
    # Valid arguments whose target no ρ > 0 reaches in floating point.
    with pytest.raises(ValueError, match="too small for any rho"):
        acc.dp_to_zcdp_rho(1e-300, 1e-5, 0.99999999999e-5)


def test_a_zcdp_delta_outside_the_target_is_an_error():
    with pytest.raises(ValueError, match="must be in"):
        acc.dp_to_zcdp_rho(1.0, 1e-5, 2e-5)
