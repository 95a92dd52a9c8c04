"""Privacy calibration: thresholds and noise scales as small pure functions.

Every function here is deterministic, has no Beam dependency and is unit-tested
against the numbers of ``docs/mechanisms.md`` (sections 2 and 3)
and against independent computations. Logs are natural.

Neighbouring datasets differ by adding or removing one user with all of their
records; ``max_items`` is the contribution bound Δ0 (the number of distinct
items a user keeps after sampling).
"""
from __future__ import annotations

import math
import statistics
from fractions import Fraction
from typing import Callable, Optional

import numpy as np

from beam_dpsu.dp.privacy.params import (MAX_MAX_ITEMS, MIN_ETA, MIN_PER_ITEM_DELTA, WARN_DELTA_ABOVE,
                                 WARN_EPSILON_ABOVE)

__all__ = ["check_epsilon", "check_delta", "check_rho", "check_max_items", "check_eta", "check_flag",
           "guarantee_warnings", "check_sensitivity", "check_resolvable_delta", "bisect", "per_item_delta", "normal_isf", "log_ndtr",
           "analytic_gaussian_sigma", "gaussian_log_delta", "gaussian_log_delta_bound",
           "estimate_then_gaussian_log_delta",
           "gaussian_epsilon_after_estimate", "zcdp_gaussian_sigma", "count_laplace_scale",
           "count_laplace_threshold", "count_gaussian_sigma", "count_gaussian_threshold",
           "weighted_laplace_scale", "weighted_laplace_threshold", "weighted_gaussian_sigma",
           "weighted_gaussian_threshold", "zcdp_weighted_gaussian_sigma",
           "zcdp_weighted_gaussian_threshold", "gw_threshold", "gw_cascade_free_delta",
           "gw_cascade_free_threshold_bound", "gw_cascade_free_threshold", "policy_cutoff",
           "truncated_geometric_parameters", "truncated_geometric_keep_probabilities",
           "truncated_geometric_keep_probability", "check_positive_int", "check_rounds",
           "check_ratio", "round_fractions", "round_budgets", "DEFAULT_K_BAR_FACTOR",
           "default_k_bar", "gumbel_threshold_offset",
           "topk_laplace_scale", "TOPK_MAX_LAPLACE_SCALE", "laplace_difference_tail", "laplace_tail_offset",
           "laplace_threshold_offset", "split_epsilon", "scale_estimate_noise_scale"]


# Largest Δ0 whose threshold maximum is evaluated in one numpy array; larger
# bounds are evaluated in chunks of this size.
_CHUNK = 1 << 20


# --------------------------------------------------------------------------
# Validation helpers (shared by every calibration and by the transforms).
# --------------------------------------------------------------------------

def check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    """Returns ``epsilon`` as a float, or raises ValueError unless 0 < ε < inf."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number > 0, got {epsilon!r}")
    eps = float(epsilon)
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"{name} must be a finite number > 0, got {epsilon!r}")
    return eps


def check_delta(delta: float, name: str = "delta", upper: float = 1.0) -> float:
    """Returns ``delta`` as a float, or raises ValueError unless 0 < δ < upper."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number in (0, {upper:g}), got {delta!r}")
    d = float(delta)
    if not (0.0 < d < upper):
        raise ValueError(f"{name} must be in (0, {upper:g}), got {delta!r}")
    return d


def check_rho(rho: float, name: str = "rho") -> float:
    """Returns ``rho`` as a float, or raises ValueError unless 0 < ρ < inf."""
    return check_epsilon(rho, name)


def check_max_items(max_items: int, name: str = "max_items_per_user") -> int:
    """Returns Δ0 as an int, or raises ValueError unless 1 ≤ Δ0 ≤ ``params.MAX_MAX_ITEMS``.

    Every mechanism's constructor (and every calibration taking Δ0) checks Δ0 here,
    so the Python API refuses what the command line refuses. The upper bound
    (10^6) keeps the calibration fast (thresholds maximise over t = 1..Δ0) and the
    parameter meaningful (docs/mechanisms.md, "Parameters that make a guarantee
    meaningless").
    """
    if isinstance(max_items, bool) or not isinstance(max_items, (int, np.integer)):
        if isinstance(max_items, float) and max_items.is_integer():
            max_items = int(max_items)
        else:
            raise ValueError(f"{name} must be an integer >= 1, got {max_items!r}")
    if max_items < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {max_items!r}")
    if max_items > MAX_MAX_ITEMS:
        raise ValueError(f"{name} must be at most {MAX_MAX_ITEMS:,}, got {max_items!r}: a "
                         f"larger bound bounds no user in practice, and calibrating for it "
                         f"takes minutes and raises every threshold")
    return int(max_items)


def check_eta(eta: float, name: str = "eta") -> float:
    """Returns η as a float, or raises ValueError unless ``params.MIN_ETA`` ≤ η < 1.

    η is the cascade-free GW's step-1 budget. Step 1 raises each of the ≤ Δ0 kept
    items below the cutoff by at least η/Δ0; with η ≥ 1e-12 and Δ0 ≤ 10^6 that is
    ≥ 1e-18, a normal double, so a zero weight always becomes strictly positive
    (docs/gw.md, "η in floating point"). A smaller η (5e-324) underflows to a raise
    of 0.0 and breaks the support condition the proof rests on.
    """
    if isinstance(eta, bool) or not isinstance(eta, (int, float, np.floating, np.integer)) \
            or not (MIN_ETA <= float(eta) < 1.0):
        raise ValueError(f"{name} must be a number in [{MIN_ETA:g}, 1), got {eta!r} (a "
                         f"smaller η underflows in step 1 and the proof no longer holds)")
    return float(eta)


def guarantee_warnings(epsilon: float, delta: float) -> list:
    """One line per way a stated (ε, δ) protects little; empty when neither applies.

    ε above ``params.WARN_EPSILON_ABOVE`` (10): the output may be e^ε times likelier
    with one user than without (e^10 ≈ 22,000). δ above ``params.WARN_DELTA_ABOVE``
    (1e-3): δ is the probability that the ε bound fails outright. The command line
    prints these on stderr and still runs; the Python API does not warn.
    """
    out = []
    if epsilon is not None and float(epsilon) > WARN_EPSILON_ABOVE:
        out.append(f"epsilon = {float(epsilon):g} is above {WARN_EPSILON_ABOVE:g}: the output "
                   f"may be e^{float(epsilon):g} times likelier with any one user than without, "
                   f"so this guarantee protects almost nothing")
    if delta is not None and float(delta) > WARN_DELTA_ABOVE:
        out.append(f"delta = {float(delta):g} is above {WARN_DELTA_ABOVE:g}: delta is the "
                   f"probability that the guarantee fails outright (a release may then expose "
                   f"a user), and it should be far below 1/(number of users)")
    return out


def check_sensitivity(sensitivity: float, name: str = "sensitivity") -> float:
    """Returns a positive finite sensitivity as a float, or raises ValueError."""
    return check_epsilon(sensitivity, name)


# --------------------------------------------------------------------------
# Section 1: calibration primitives.
# --------------------------------------------------------------------------

def bisect(below: Callable[[float], bool], lo: float, hi: float, iterations: int = 200,
           rel_tol: float = 0.0):
    """Narrows ``[lo, hi]`` around the point where a monotone predicate changes.

    ``below(x)`` must be True on the ``lo`` side of the point and False on the
    ``hi`` side (it is not evaluated at the ends). Each step evaluates the
    midpoint and moves the end on its side there; it stops after
    ``iterations`` steps, when no float lies strictly between the ends, or
    when ``hi − lo ≤ rel_tol·hi``. Returns ``(lo, hi)``: a calibration that
    must satisfy its condition returns the end on the satisfying side.
    """
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if below(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= rel_tol * hi:
            break
    return lo, hi


def per_item_delta(delta: float, t):
    """The per-item delta δ_t = 1 − (1 − δ)^(1/t).

    Computed as ``-expm1(log1p(-δ)/t)``, which keeps full precision when δ is
    small (the naive formula loses about log10(1/δ) digits). ``t`` may be an
    int or a numpy array of positive numbers.
    """
    delta = check_delta(delta)
    return -np.expm1(np.log1p(-delta) / np.asarray(t, dtype=float)) if np.ndim(t) else \
        -math.expm1(math.log1p(-delta) / float(t))


def check_resolvable_delta(delta: float, items: int, share: float = 1.0,
                           name: str = "delta") -> float:
    """``delta``, or ValueError unless the per-item δ it gives, ``per_item_delta(share·δ,
    items)``, is at least ``params.MIN_PER_ITEM_DELTA`` (2^-1020): the one line names
    the smallest δ supported for that number of items.

    Args:
      delta: the δ the user stated (0 < δ < 1).
      items: how many items share it (Δ0, or k̄ for top-k's candidates), ≥ 1.
      share: the fraction of δ the items' releases may use (½ for the Gaussian
        mechanisms, whose other half pays the noise's own δ).
    """
    delta = check_delta(delta, name)
    if per_item_delta(share * delta, items) < MIN_PER_ITEM_DELTA:
        smallest = _ceil_3_digits(-math.expm1(items * math.log1p(-MIN_PER_ITEM_DELTA)) / share)
        raise ValueError(
            f"{name} = {delta:g} is too small for {items} items (per user, or top-k's "
            f"candidates): each item's share "
            f"would be below 2^-1020, which the release probabilities (doubles) cannot "
            f"resolve; the smallest {name} supported here is {smallest}")
    return delta


def _ceil_3_digits(x: float) -> str:
    """``x`` > 0 written with 3 significant digits, rounded up (never below ``x``)."""
    exponent = math.floor(math.log10(x))
    for digits in (math.ceil(x / 10.0 ** (exponent - 2)), None):
        text = f"{digits / 100:.2f}e{exponent}" if digits else f"{x * (1 + 1e-6):.3g}"
        if float(text) >= x:
            return text
    return text


def _special():
    # scipy.special is imported only where the pure functions below do not apply:
    # its import takes about 0.33 s, which a command line's launcher would pay
    # before its first stage, and every Beam worker imports this module (its
    # checks) and never needs it.
    from scipy import special
    return special


#: ``normal_isf`` computes arrays larger than this (or with p below
#: ``_SMALLEST_P``) with ``scipy.special.ndtri``; smaller ones element by element.
_PURE_ISF_MAX_SIZE = 20_000
#: Below this p, ``statistics.NormalDist.inv_cdf`` leaves the range its
#: algorithm (Wichura's AS241) was fitted on.
_SMALLEST_P = 1e-300
_STANDARD_NORMAL = statistics.NormalDist()


def normal_isf(p):
    """Φ⁻¹(1 − p), accurate for tiny ``p`` (never ``ppf(1 − p)``): −Φ⁻¹(p) by symmetry.

    ``p``: a number or an array of numbers in (0, 1); returns a float or an
    array of floats. Φ⁻¹ is ``statistics.NormalDist().inv_cdf`` (Wichura's
    AS241, relative error about 1e-16) for up to ``_PURE_ISF_MAX_SIZE``
    values of at least ``_SMALLEST_P``, else ``scipy.special.ndtri``; the
    tests check the two agree to 1e-14 (relative) over p from 1e-300 to 0.5.
    """
    arr = np.asarray(p, dtype=float)
    if arr.size > _PURE_ISF_MAX_SIZE or not np.all((arr >= _SMALLEST_P) & (arr < 1.0)):
        out = -_special().ndtri(arr)
    else:
        inv_cdf = _STANDARD_NORMAL.inv_cdf
        out = -np.fromiter((inv_cdf(v) for v in arr.ravel().tolist()), dtype=float,
                           count=arr.size).reshape(arr.shape)
    return float(out) if np.ndim(p) == 0 else out


_SQRT_HALF = math.sqrt(0.5)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def log_ndtr(x: float) -> float:
    """log Φ(x), the log of the standard normal CDF, accurate in both tails.

    x > 0: log1p(−erfc(x/√2)/2) (Φ(−x) = erfc(x/√2)/2 is small there);
    −20 < x ≤ 0: log(erfc(−x/√2)/2), where ``math.erfc`` keeps full relative
    precision (down to about 1e-88); x ≤ −20: the asymptotic series
    Φ(x) = φ(x)/(−x)·Σₖ (−1)ᵏ(2k−1)!!/x²ᵏ, whose first 12 terms leave an error
    below 1e-18 there. The tests compare it with ``scipy.special.log_ndtr``.
    """
    x = float(x)
    if x > 0.0:
        return math.log1p(-0.5 * math.erfc(x * _SQRT_HALF))
    if x > -20.0:
        return math.log(0.5 * math.erfc(-x * _SQRT_HALF))
    if x == -math.inf:
        return -math.inf
    z = 1.0 / (x * x)
    term = total = 1.0
    for k in range(1, 12):
        term *= -(2 * k - 1) * z
        total += term
    return -0.5 * x * x - math.log(-x) - _LOG_SQRT_2PI + math.log(total)


def _gaussian_log_delta_and_error(sigma: float, epsilon: float):
    """``gaussian_log_delta`` and a bound on its relative error: ε + log Φ(b) − log Φ(a)
    cancels (to about −1/(εσ²) when εσ² is large), so the float terms' errors, about
    10^-15 of their sizes, are divided by what is left (inf where nothing is left)."""
    a = 1.0 / (2.0 * sigma) - epsilon * sigma
    b = -1.0 / (2.0 * sigma) - epsilon * sigma
    # Φ(a) − e^ε Φ(b) written as Φ(a)·(1 − exp(ε + logΦ(b) − logΦ(a))).
    log_pa, log_pb = log_ndtr(a), log_ndtr(b)
    diff_log = epsilon + log_pb - log_pa  # always < 0 for a Gaussian
    if diff_log >= 0:
        return -math.inf, math.inf
    error = 1e-15 * (abs(log_pa) + abs(log_pb) + abs(epsilon) + 1.0) / min(1.0, -diff_log)
    return log_pa + math.log(-math.expm1(diff_log)), error


def gaussian_log_delta_bound(sigma: float, epsilon: float) -> float:
    """An upper bound on ``gaussian_log_delta`` for ε ≥ 0 with no cancelling subtraction:
    δ = Φ(a)·(1 − e^−y), y = log Φ(a) − log Φ(b) − ε ≤ (a − b)·(φ/Φ)(b) − ε (φ/Φ falls),
    and (φ/Φ)(−u) < (u + √(u² + 4))/2 (Birnbaum's bound on Mills' ratio), u = −b; so
    δ ≤ Φ(a)·(1/(2σ²) + 2/(σ(u + √(u² + 4)))). Tight to a relative 1/(εσ²) where εσ² is
    large, the regime where ``gaussian_log_delta``'s two terms cancel."""
    a = 1.0 / (2.0 * sigma) - epsilon * sigma
    u = epsilon * sigma + 1.0 / (2.0 * sigma)
    return log_ndtr(a) + math.log(0.5 / (sigma * sigma) + 2.0 / (sigma * (u + math.hypot(u, 2.0))))


def gaussian_log_delta(sigma: float, epsilon: float) -> float:
    """log δ(ε) of the Gaussian mechanism of noise σ at ℓ2-sensitivity 1, for any real ε:
    δ(ε) = Φ(1/(2σ) − εσ) − e^ε·Φ(−1/(2σ) − εσ) (Balle and Wang 2018, Theorem 8), the
    smallest δ for which it is (ε, δ)-DP; −inf where that underflows to 0. σ in units of
    the sensitivity (σ/Δ2 for sensitivity Δ2).
    """
    return _gaussian_log_delta_and_error(sigma, epsilon)[0]


def _agm_excess_log(sigma: float, epsilon: float, delta: float, sensitivity: float) -> float:
    """Sign of Φ(a) − e^ε·Φ(b) − δ, computed in a numerically safe way.

    Returns a value > 0 when the Gaussian with scale ``sigma`` is NOT
    (ε, δ)-DP for ℓ2-sensitivity ``sensitivity`` and ≤ 0 when it is.
    """
    return max(gaussian_log_delta(sigma / sensitivity, epsilon), -1e300) - math.log(delta)


#: ``analytic_gaussian_sigma``'s margin above the float root (relative): about 100 times
#: the largest shortfall of the float root measured against a 90-digit computation
#: (2.7e-11, at ε = 0.01 and δ around 1e-250).
_AGM_MARGIN = 3e-9


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """AGM(ε, δ, Δ2): the smallest σ making the Gaussian mechanism (ε, δ)-DP.

    Balle and Wang (2018), "Improving the Gaussian mechanism for differential
    privacy": the smallest σ with
    ``Φ(Δ2/(2σ) − εσ/Δ2) − e^ε·Φ(−Δ2/(2σ) − εσ/Δ2) ≤ δ``.
    Found by bisection in log σ to a relative precision of about 1e-15. The
    float evaluation of the inequality subtracts two nearly equal values of
    log Φ, so the upper end of the final bracket can be below the exact minimum
    by up to about 3e-11 (relative, at ε = 0.01 and δ around 1e-250; about 1e-13
    for ε ≥ 0.1): the returned σ is that end raised by ``_AGM_MARGIN`` (3e-9
    relative), so it is never below the exact minimum (the tests check it against a
    90-digit computation). Where the float condition's own error bound is above a tenth
    of what that margin absorbs (ε below about 10^-3 with δ below about 10^-20), σ is
    instead the smallest whose ``gaussian_log_delta_bound`` is at most δ (a bound of the
    left side without its cancelling subtraction). See docs/mechanisms.md.

    Args:
      epsilon: ε > 0.
      delta: 0 < δ < 1.
      sensitivity: the ℓ2-sensitivity Δ2 > 0 (default 1).
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    sensitivity = check_sensitivity(sensitivity)

    def ok(log_sigma: float) -> bool:
        return _agm_excess_log(math.exp(log_sigma) * sensitivity, epsilon, delta, sensitivity) <= 0

    lo, hi = math.log(1e-6), math.log(1.0)
    while ok(lo):
        lo -= 10.0
        if lo < -700:
            raise ValueError("analytic Gaussian calibration failed: σ would be below 1e-300")
    while not ok(hi):
        hi += 2.0
        if hi > 700:
            raise ValueError("analytic Gaussian calibration failed: σ would exceed 1e300")
    _, hi = bisect(lambda x: not ok(x), lo, hi)
    unit = math.exp(hi)
    log_delta, error = _gaussian_log_delta_and_error(unit, epsilon)
    # how much δ falls when σ rises by the margin: d log δ / d log σ, measured
    elasticity = (log_delta - gaussian_log_delta(unit * 1.001, epsilon)) / math.log(1.001)
    if not error <= _AGM_MARGIN * elasticity / 10.0:
        # A tiny ε with a tiny δ: the two terms of the condition cancel beyond what the
        # margin absorbs (δ(σ) measured 3e-5 above δ at ε = 1e-6, δ = 1e-100): the
        # smallest σ whose bound without the subtraction is at most δ.
        def tail_ok(log_sigma: float) -> bool:
            return gaussian_log_delta_bound(math.exp(log_sigma), epsilon) <= math.log(delta)

        lo = hi
        while not tail_ok(hi):
            hi += 1.0
            if hi > 700:
                raise ValueError("analytic Gaussian calibration failed: σ would exceed 1e300")
        _, hi = bisect(lambda x: not tail_ok(x), lo, hi)
    return math.exp(hi) * sensitivity * (1.0 + _AGM_MARGIN)


def estimate_then_gaussian_log_delta(sigma: float, epsilon: float,
                                     estimate_epsilon: float) -> float:
    """log of the δ at ε of an ``estimate_epsilon``-DP mechanism followed (adaptively) by
    the Gaussian mechanism of noise σ (ℓ2-sensitivity 1): p·δ_σ(ε − ε₁) + (1 − p)·δ_σ(ε + ε₁),
    p = e^ε₁/(1 + e^ε₁), δ_σ = ``gaussian_log_delta``'s δ.

    Every ε₁-DP mechanism is dominated by randomized response of ε₁ (Kairouz, Oh and
    Viswanath 2015, Theorem 2.1), whose privacy loss is +ε₁ with probability p and −ε₁
    otherwise; the δ of a composition of dominating pairs at ε is the expectation over the
    first's privacy loss L₁ of the second's δ at ε − L₁ (docs/mechanisms.md section 12).

    Where the float evaluation of a term cannot be trusted to a relative 10^-8 (a tiny ε
    with a huge σ, where the terms of δ_σ cancel), that term is ``gaussian_log_delta_bound``
    (an upper bound without the subtraction; +inf where ε ± ε₁ < 0).
    """
    e1 = float(estimate_epsilon)
    log_p, log_q = -math.log1p(math.exp(-e1)), -math.log1p(math.exp(e1))
    first, second = (_trusted_log_delta(sigma, x) for x in (epsilon - e1, epsilon + e1))
    return float(np.logaddexp(log_p + first, log_q + second))


def _trusted_log_delta(sigma: float, epsilon: float) -> float:
    """``gaussian_log_delta`` where its float error is at most ``_COMPOSED_TRUST``, else
    ``gaussian_log_delta_bound`` (+inf for ε < 0, where no bound is derived)."""
    value, error = _gaussian_log_delta_and_error(sigma, epsilon)
    if error <= _COMPOSED_TRUST:
        return value
    return gaussian_log_delta_bound(sigma, epsilon) if epsilon >= 0 else math.inf


#: ``gaussian_epsilon_after_estimate``'s relative margin on δ, far above the largest
#: relative error ``estimate_then_gaussian_log_delta`` accepts (``_COMPOSED_TRUST``);
#: tests/test_auto_bound.py checks the built releases in 50 and 80 digits.
_COMPOSED_MARGIN = 1e-6
_COMPOSED_TRUST = 1e-8


def gaussian_epsilon_after_estimate(epsilon: float, delta: float,
                                    estimate_epsilon: float) -> Optional[float]:
    """The largest ε′ (to a relative 1e-12, on the safe side) such that an
    ``estimate_epsilon``-DP estimate followed by the Gaussian mechanism of σ = AGM(ε′, δ, 1)
    is (ε, δ)-DP together (``estimate_then_gaussian_log_delta`` ≤ δ·(1 − 10^-6)); None
    where even ε′ = ε − ε₁ does not pass that check (basic composition is then the route).

    A mechanism whose noise is one Gaussian of σ = AGM(ε, δ, Δ2), built at ε′ instead of
    ε, then pays for the estimate about ε₁²-order instead of ε₁ (basic composition):
    ε = 1, δ = 5e-6, ε₁ = 0.02 raises σ by 0.3%, against 1.9% at ε − ε₁.

    Args:
      epsilon: ε > 0 of the pair (the Gaussian's own ε target without the estimate).
      delta: δ of the Gaussian part, 0 < δ < 1.
      estimate_epsilon: ε₁ of the estimate, 0 < ε₁ < ε.
    """
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    e1 = check_epsilon(estimate_epsilon, "the estimate's epsilon")
    if not e1 < epsilon:
        raise ValueError(f"the estimate's epsilon ({e1!r}) must be below epsilon ({epsilon!r})")
    limit = math.log(delta) + math.log1p(-_COMPOSED_MARGIN)

    def ok(e2: float) -> bool:
        return estimate_then_gaussian_log_delta(
            analytic_gaussian_sigma(e2, delta), epsilon, e1) <= limit

    lo = epsilon - e1  # basic composition leaves (1 − p)·(δ − δ_σ(ε + ε₁)) of room
    if not ok(lo):
        return None
    lo, _ = bisect(ok, lo, epsilon, rel_tol=1e-12)  # lo: the start or a point that passed
    return lo


def zcdp_gaussian_sigma(rho: float, sensitivity: float = 1.0) -> float:
    """σ = Δ2/√(2ρ): the Gaussian scale that is ρ-zCDP for ℓ2-sensitivity Δ2."""
    rho = check_rho(rho)
    sensitivity = check_sensitivity(sensitivity)
    return sensitivity / math.sqrt(2.0 * rho)


def _max_over_t(max_items: int, term: Callable[[np.ndarray], np.ndarray]) -> float:
    """max_{t = 1..Δ0} term(t), evaluated vectorised in chunks."""
    best = -math.inf
    start = 1
    while start <= max_items:
        stop = min(max_items, start + _CHUNK - 1)
        t = np.arange(start, stop + 1, dtype=float)
        best = max(best, float(np.max(term(t))))
        start = stop + 1
    return best


# --------------------------------------------------------------------------
# Section 2: thresholds of the histogram-and-threshold family.
# --------------------------------------------------------------------------

def count_laplace_scale(epsilon: float, max_items: int) -> float:
    """Laplace scale λ = Δ0/ε of Count Laplace (each kept item gets +1)."""
    return check_max_items(max_items) / check_epsilon(epsilon)


def count_laplace_threshold(epsilon: float, delta: float, max_items: int) -> float:
    """Count Laplace threshold T = 1 + λ·log(1/(2·δ_Δ0)), λ = Δ0/ε."""
    epsilon, max_items = check_epsilon(epsilon), check_max_items(max_items)
    delta = check_resolvable_delta(delta, max_items)
    lam = count_laplace_scale(epsilon, max_items)
    return 1.0 + lam * -math.log(2.0 * per_item_delta(delta, max_items))


def count_gaussian_sigma(epsilon: float, delta: float, max_items: int) -> float:
    """Count Gaussian σ = AGM(ε, δ/2, √Δ0)."""
    epsilon, delta, max_items = check_epsilon(epsilon), check_delta(delta), check_max_items(max_items)
    return analytic_gaussian_sigma(epsilon, delta / 2.0, math.sqrt(max_items))


def count_gaussian_threshold(epsilon: float, delta: float, max_items: int) -> float:
    """Count Gaussian threshold T = 1 + σ·Φ⁻¹(1 − δ'_Δ0), δ' the per-item delta of δ/2."""
    check_resolvable_delta(delta, check_max_items(max_items), 0.5)
    sigma = count_gaussian_sigma(epsilon, delta, max_items)
    return 1.0 + sigma * float(normal_isf(per_item_delta(delta / 2.0, max_items)))


def weighted_laplace_scale(epsilon: float) -> float:
    """Laplace scale λ = 1/ε of Weighted Laplace, Policy Laplace and GW (ℓ1 budget 1)."""
    epsilon = check_epsilon(epsilon)
    scale = 1.0 / epsilon
    while Fraction(1) / Fraction(scale) > Fraction(epsilon):
        scale = math.nextafter(scale, math.inf)
    return scale


def weighted_laplace_threshold(epsilon: float, delta: float, max_items: int) -> float:
    """Weighted Laplace threshold T = max_{t=1..Δ0} [1/t + λ·log(1/(2δ_t))], λ = 1/ε."""
    epsilon, max_items = check_epsilon(epsilon), check_max_items(max_items)
    delta = check_resolvable_delta(delta, max_items)
    lam = 1.0 / epsilon
    return _max_over_t(
        max_items, lambda t: 1.0 / t - lam * np.log(2.0 * per_item_delta(delta, t)))


def weighted_gaussian_sigma(epsilon: float, delta: float) -> float:
    """Weighted Gaussian σ = AGM(ε, δ/2, 1) (ℓ2 budget 1 per user)."""
    return analytic_gaussian_sigma(check_epsilon(epsilon), check_delta(delta) / 2.0, 1.0)


def weighted_gaussian_threshold(epsilon: float, delta: float, max_items: int) -> float:
    """Weighted Gaussian threshold T = max_t [1/√t + σ·Φ⁻¹(1 − δ'_t)], δ' from δ/2."""
    max_items = check_max_items(max_items)
    check_resolvable_delta(delta, max_items, 0.5)
    sigma = weighted_gaussian_sigma(epsilon, delta)
    half = check_delta(delta) / 2.0
    return _max_over_t(
        max_items, lambda t: 1.0 / np.sqrt(t) + sigma * normal_isf(per_item_delta(half, t)))


def zcdp_weighted_gaussian_sigma(rho: float) -> float:
    """Weighted Gaussian (zCDP) σ = 1/√(2ρ)."""
    return zcdp_gaussian_sigma(rho, 1.0)


def zcdp_weighted_gaussian_threshold(rho: float, delta: float, max_items: int) -> float:
    """Weighted Gaussian (zCDP) threshold T = max_k [1/√k + σ·Φ⁻¹(1 − δ_k)], all of δ.

    The mechanism is δ-approximate ρ-zCDP (DP-SIPS Algorithm 2).
    """
    rho, max_items = check_rho(rho), check_max_items(max_items)
    delta = check_resolvable_delta(delta, max_items)
    sigma = zcdp_weighted_gaussian_sigma(rho)
    return _max_over_t(
        max_items, lambda k: 1.0 / np.sqrt(k) + sigma * normal_isf(per_item_delta(delta, k)))


def adaptive_sigmas(epsilon: float, delta: float, shares) -> list:
    """The Gaussian σ of each stage of adaptive weighting, from (ε, δ) and the stages'
    shares (positive, summing to at most 1).

    The stages together are one Gaussian mechanism of σ = AGM(ε, δ/2, 1) (adaptive
    composition of Gaussian mechanisms adds their precisions 1/σ_i², Dong, Roth and Su
    2019): stage i gets the precision share_i/σ², i.e. σ_i = σ/√share_i, raised by a
    relative 10^-12 so that Σ 1/σ_i² ≤ 1/σ² holds in spite of rounding
    (docs/mechanisms.md section 11).
    """
    shares = [float(x) for x in shares]
    if not shares or any(not (x > 0 and math.isfinite(x)) for x in shares) or \
            sum(shares) > 1.0 + 1e-12:
        raise ValueError(f"stage shares must be positive and sum to at most 1, got {shares!r}")
    sigma = weighted_gaussian_sigma(epsilon, delta)
    return [sigma / math.sqrt(x) * (1.0 + 1e-12) for x in shares]


def adaptive_threshold(sigma: float, delta: float, max_items: int,
                       share: float = 0.0, boost: float = 1.0) -> float:
    """T = max_t [m(t) + σ·Φ⁻¹(1 − δ′_t)], δ′ the per-item δ of ``delta``
    (``per_item_delta``) and m(t) = s/√t + (1 − s)·min(1, γ/√t) (s = ``share``, γ =
    ``boost``; s = 0, γ = 1: Weighted Gaussian's 1/√t): t values of means at most m(t)
    plus independent N(0, σ²) noise are all below T but with probability at most
    ``delta``. Adaptive weighting's release statistic of an added user's t new items has
    means at most m(t) (docs/mechanisms.md section 11).

    Args:
      sigma: σ > 0 of the statistic's noise.
      delta: the probability allowed, 0 < delta < 1.
      max_items: Δ0.
      share: s in [0, 1), the estimate's weight in the statistic.
      boost: γ ≥ 1, the most a user's weight on an item exceeds its 1/√k.
    """
    sigma = check_sensitivity(sigma, "sigma")
    max_items = check_max_items(max_items)
    delta = check_resolvable_delta(delta, max_items)
    share, boost = float(share), float(boost)
    if not (0.0 <= share < 1.0 and boost >= 1.0 and math.isfinite(boost)):
        raise ValueError(f"need 0 <= share < 1 and a finite boost >= 1, got {share!r}, {boost!r}")

    def term(t):
        root = np.sqrt(t)
        return (share / root + (1.0 - share) * np.minimum(1.0, boost / root)
                + sigma * normal_isf(per_item_delta(delta, t)))

    # raised by a relative 10^-12: the float evaluation of Φ⁻¹ errs by about 10^-15, which
    # put the exact release probability at the maximising t that much above ``delta``
    return _max_over_t(max_items, term) * (1.0 + _ADAPTIVE_MARGIN)


#: ``adaptive_threshold``'s relative margin (tests/test_adaptive.py checks the exact
#: release probabilities against each share without any tolerance).
_ADAPTIVE_MARGIN = 1e-12


def adaptive_levels(cutoff: float, count: int, ratio: float = 2.0) -> list:
    """The estimate's levels ``[C·r^j for j = 0..count−1]`` (C > 0, count ≥ 1, r > 1)."""
    if not (math.isfinite(cutoff) and cutoff > 0):
        raise ValueError(f"cutoff must be finite and > 0, got {cutoff!r}")
    count = check_positive_int(count, "levels")
    if not (math.isfinite(ratio) and ratio > 1):
        raise ValueError(f"level ratio must be > 1, got {ratio!r}")
    return [cutoff * ratio ** j for j in range(count)]


def gw_threshold(epsilon: float, delta: float) -> float:
    """GW threshold T = 1 − λ·log(2δ), λ = 1/ε; requires δ < 1/2 so that T ≥ 1."""
    epsilon = check_epsilon(epsilon)
    delta = check_resolvable_delta(check_delta(delta, upper=0.5), 1)
    return 1.0 - math.log(2.0 * delta) / epsilon


def _cascade_free_log_escape(epsilon: float, max_items: int, t: float) -> float:
    """log P[no new item is released] at threshold ``t`` in the worst case of 3.3a.

    ``log[(1 − ½·e^(−ε(t−1)))·(1 − ½·e^(−εt))^(Δ0−1)]``, each factor as
    ``log1p(−½·exp(·))`` so that it keeps full precision when δ is tiny.
    """
    return (math.log1p(-0.5 * math.exp(-epsilon * (t - 1.0)))
            + (max_items - 1) * math.log1p(-0.5 * math.exp(-epsilon * t)))


def gw_cascade_free_delta(epsilon: float, max_items: int, threshold: float) -> float:
    """The δ of the cascade-free GW (3.3a) at a given threshold T ≥ 1.

    ``1 − (1 − ½·e^(−ε(T−1)))·(1 − ½·e^(−εT))^(Δ0−1)``: the largest chance that
    at least one of the ≤ Δ0 items only the added user made non-zero is
    released, when their weights sum to at most 1 (the worst case is one item
    of weight 1 and Δ0 − 1 items of weight → 0; ``docs/gw.md``). Computed as
    ``−expm1(log(...))`` (accurate for δ down to the smallest floats).
    """
    epsilon, max_items = check_epsilon(epsilon), check_max_items(max_items)
    t = float(threshold)
    if not (t >= 1.0 and math.isfinite(t)):
        raise ValueError(f"threshold must be a finite number >= 1, got {threshold!r}")
    return -math.expm1(_cascade_free_log_escape(epsilon, max_items, t))


def gw_cascade_free_threshold_bound(epsilon: float, delta: float, max_items: int) -> float:
    """Closed-form upper bound on the cascade-free GW threshold (union bound).

    ``1 + (1/ε)·log((1 + (Δ0 − 1)·e^(−ε)) / (2δ))``: the threshold at which
    ``½·e^(−ε(T−1)) + (Δ0 − 1)·½·e^(−εT) = δ``, which bounds the exact δ
    expression from above (``1 − Π(1 − p_j) ≤ Σ p_j``). Equals the published
    ``1 − log(2δ)/ε`` for Δ0 = 1.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, upper=0.5)
    max_items = check_max_items(max_items)
    return 1.0 + (math.log1p((max_items - 1) * math.exp(-epsilon)) - math.log(2.0 * delta)) \
        / epsilon


#: ``gw_cascade_free_threshold``'s margin above the float root (relative): about 60
#: times its largest shortfall measured in exact arithmetic (1.7e-13, at ε = 1e-4 and δ
#: near 1/2; 4e-14 at δ = 1e-300).
_ROOT_MARGIN = 1e-11


def gw_cascade_free_threshold(epsilon: float, delta: float, max_items: int) -> float:
    """Threshold T of the cascade-free GW and GW-KT (``docs/gw.md`` section 1.2).

    The smallest ``T`` with ``1 − (1 − ½·e^(−ε(T−1)))·(1 − ½·e^(−εT))^(Δ0−1) ≤ δ``
    (``gw_cascade_free_delta``), found by bisection on
    ``[1, gw_cascade_free_threshold_bound]``: the left side is decreasing in T,
    is ≥ ½ > δ at T = 1, and is ≤ δ at the bound. The returned value is the
    upper end of the final bracket raised by ``_ROOT_MARGIN`` (1e-11 relative):
    the float evaluation of the left side errs by a few ulps, so the bracket's
    end alone can be below the exact root by up to about 1.7e-13 (relative).

    Args:
      epsilon: ε > 0 (the Laplace scale is λ = 1/ε).
      delta: 0 < δ < 1/2 (so that T ≥ 1 and the Laplace tail formula holds for
        every new item, whose weight is ≤ 1). Smaller δ raises T.
      max_items: Δ0 ≥ 1, the items a user keeps (K_i). Larger Δ0 raises T by
        at most ``log(1 + (Δ0 − 1)·e^(−ε))/ε``.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, upper=0.5)
    max_items = check_max_items(max_items)
    check_resolvable_delta(delta, max_items)
    log_target = math.log1p(-delta)       # need log P[no new item released] ≥ log(1 − δ)
    lo, hi = 1.0, gw_cascade_free_threshold_bound(epsilon, delta, max_items)
    while _cascade_free_log_escape(epsilon, max_items, hi) < log_target:
        hi = hi * (1 + 1e-12) + 1e-12      # the closed form rounded below the exact root
    _, hi = bisect(lambda t: _cascade_free_log_escape(epsilon, max_items, t) < log_target,
                   lo, hi)
    return hi * (1.0 + _ROOT_MARGIN)


def policy_cutoff(threshold: float, noise_scale: float, alpha: float) -> float:
    """Γ = T + α·(λ or σ): the cutoff of the sequential policies (α ≥ 0)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)) \
            or not (float(alpha) >= 0 and math.isfinite(float(alpha))):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    return float(threshold) + float(alpha) * float(noise_scale)


# --------------------------------------------------------------------------
# Truncated geometric ("magic") partition selection.
# --------------------------------------------------------------------------

def truncated_geometric_parameters(epsilon: float, delta: float, max_items: int):
    """(ε', δ') = (ε/Δ0, δ_Δ0) of the truncated geometric selection, each rounded down
    (never above its exact value, so Δ0 decisions compose to at most (ε, δ))."""
    epsilon, max_items = check_epsilon(epsilon), check_max_items(max_items)
    delta = check_resolvable_delta(delta, max_items)
    eps1 = math.nextafter(epsilon / max_items, 0.0)  # the division is correctly rounded
    delta1 = per_item_delta(delta, max_items) * (1.0 - _PER_ITEM_DELTA_MARGIN)
    return eps1, delta1


#: ``per_item_delta``'s float evaluation is within a few units in the last place of its
#: exact value (the tests check 1e-15 against 60 digits); this relative margin rounds it
#: down wherever a per-item δ' must not exceed its exact value.
_PER_ITEM_DELTA_MARGIN = 1e-13


def _down(x: float, steps: int = 2) -> float:
    for _ in range(steps):
        x = math.nextafter(x, -math.inf)
    return x


def _up(x: float, steps: int = 2) -> float:
    for _ in range(steps):
        x = math.nextafter(x, math.inf)
    return x


def truncated_geometric_keep_probabilities(epsilon: float, delta: float, max_items: int,
                                           up_to: int) -> np.ndarray:
    """p(0), …, p(up_to): the probability of keeping an item with n users.

    Desfontaines, Voss and Gipson, "Differentially private partition selection":
    ``p(0) = 0``, ``p(n) = min(e^ε'·p(n−1) + δ', 1 − e^−ε'·(1 − p(n−1) − δ'), 1)``
    with ε' = ε/Δ0 and δ' = δ_Δ0. Each step is rounded down (e^ε' and δ' taken below
    their exact values, e^−ε' above, each float result moved two units in the last
    place the safe way), so every p(n) is at most the exact recurrence's value of its
    predecessor and the two per-item conditions hold exactly for the doubles returned:
    ``p(n) ≤ e^ε'·p(n−1) + δ'`` and ``1 − p(n−1) ≤ e^ε'·(1 − p(n)) + δ'``. p(n) is 1
    only where ``1 − p(n−1) ≤ δ'`` holds in exact arithmetic; where δ' is below the
    doubles' resolution near 1 the sequence stops just short of 1 (a keep probability
    rounded down, never up). The sequence is non-decreasing; once it stops changing
    the rest of the array repeats its last value.
    """
    eps1, delta1 = truncated_geometric_parameters(epsilon, delta, max_items)
    if isinstance(up_to, bool) or int(up_to) != up_to or up_to < 0:
        raise ValueError(f"up_to must be an integer >= 0, got {up_to!r}")
    up_to = int(up_to)
    out = np.zeros(up_to + 1, dtype=float)
    grow = _down(math.exp(eps1))     # ≤ e^ε'
    shrink = _up(math.exp(-eps1))    # ≥ e^−ε'
    exact_delta1 = Fraction(delta1)
    p = 0.0
    for n in range(1, up_to + 1):
        if 1.0 - p <= 2.0 * delta1 and Fraction(1) - Fraction(p) <= exact_delta1:
            out[n:] = 1.0
            break
        rise = _down(grow * p + delta1)
        fall = _down(1.0 - _up(shrink * _up(1.0 - p - delta1)))
        new = max(min(rise, fall), p)
        if new == p:
            out[n:] = p
            break
        p = out[n] = new
    return out


def truncated_geometric_keep_probability(epsilon: float, delta: float, max_items: int,
                                         n: int) -> float:
    """p(n) for a single user count n (see truncated_geometric_keep_probabilities)."""
    return float(truncated_geometric_keep_probabilities(epsilon, delta, max_items, n)[n])


# --------------------------------------------------------------------------
# Integer and boolean parameters.
# --------------------------------------------------------------------------

def check_positive_int(value, name: str) -> int:
    """``value`` as an int; ValueError unless it is an integer ≥ 1 (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_flag(value, name: str) -> bool:
    """``value`` as a bool; ValueError unless it is True or False (numpy's bool too):
    a string such as ``'no'`` would otherwise read as True."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


# --------------------------------------------------------------------------
# DP-SIPS: the split of (ρ, δ) over the rounds (docs/mechanisms.md section 5).
# --------------------------------------------------------------------------

def check_rounds(rounds: int) -> int:
    """The number of DP-SIPS rounds I: an integer ≥ 1."""
    return check_positive_int(rounds, "rounds")


def check_ratio(ratio: float) -> float:
    """The DP-SIPS budget ratio r: a finite number > 0."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) \
            or not (ratio > 0 and math.isfinite(ratio)):
        raise ValueError(f"ratio must be a finite number > 0, got {ratio!r}")
    return float(ratio)


def round_fractions(rounds: int, ratio: float) -> list:
    """f_i = r^(I−1−i)·(1 − r)/(1 − r^I) for i = 0..I−1 (1/I each when r = 1).

    The fractions are positive and sum to 1; with r < 1 they increase.
    """
    rounds, ratio = check_rounds(rounds), check_ratio(ratio)
    if ratio == 1.0:
        return [1.0 / rounds] * rounds
    # (1 − r)/(1 − r^I) computed stably for r near 1 and for r > 1.
    norm = math.expm1(math.log(ratio)) / math.expm1(rounds * math.log(ratio))
    return [ratio ** (rounds - 1 - i) * norm for i in range(rounds)]


#: ``round_budgets`` scales its shares down by this factor, so that their exact sums
#: stay within the totals whatever the products' and fractions' rounding (a few ulps
#: per round; without it, Σρ_i exceeded ρ by up to 1e-14 relative).
_SHARES_DOWN = 1.0 - 1e-12


def round_budgets(rho: float, delta: float, rounds: int, ratio: float) -> list:
    """[(ρ_i, δ_i)] of each DP-SIPS round: the fractions f_i of (ρ, δ), scaled down
    by ``_SHARES_DOWN`` (two rounds or more) so that Σρ_i ≤ ρ and Σδ_i ≤ δ hold
    exactly, not only in floats.

    By zCDP composition the rounds together are δ-approximate ρ-zCDP.
    """
    rho, delta = check_rho(rho), check_delta(delta)
    fractions = round_fractions(rounds, ratio)
    down = 1.0 if len(fractions) == 1 else _SHARES_DOWN   # one round: (ρ, δ) exactly
    return [(rho * f * down, delta * f * down) for f in fractions]


# --------------------------------------------------------------------------
# Top-k over an unknown domain (Durfee and Rogers; docs/mechanisms.md section 6).
# --------------------------------------------------------------------------

#: ``gumbel_threshold_offset``'s relative margin: the Gumbel tail at log(m/δ)/ε is
#: 1 − e^(−δ/m), below δ/m by a relative δ/(2m) only, less than the float evaluation's
#: error (about 2e-13 relative) when δ/m is tiny; 1e-12 relative above it, the tail is
#: below δ/m by at least 1e-12·log(m/δ) relative (tests/test_precision.py).
_OFFSET_MARGIN = 1e-12


#: The default number of top-k candidates per item released: k̄ = 10·k.
DEFAULT_K_BAR_FACTOR = 10


def default_k_bar(k: int) -> int:
    """The default k̄ of a top-k query: ``DEFAULT_K_BAR_FACTOR``·k.

    With k̄ = k the threshold sits at h_(k+1) plus the offset, so the k-th item is
    released only if it leads the (k+1)-th by about the offset: on reddit-titles (top 10
    held by 1,305 users or more) k = 10 released 9.4 of 10 (Algorithm 2, ε = 1) and 5.2
    (Algorithm 1, Δ = 10). A larger k̄ puts the threshold at a much smaller count for a
    log(k̄/k)/ε larger offset (Algorithm 2; none for Algorithm 1). Measured on the five
    shared datasets (ε = 1 and 3, δ = 1e-6, k = 10 and 50): Algorithm 2 releases the
    most from 10·k to 50·k and less at 100·k; Algorithm 1 still gains a little beyond
    10·k. 10·k released all k wherever the top k items have thousands of users
    (``benchmarks/topk_k_bar.py`` repeats the measurement). No privacy effect: the
    calibration accounts for k̄.
    """
    return DEFAULT_K_BAR_FACTOR * check_positive_int(k, "k")


def gumbel_threshold_offset(epsilon: float, delta: float, k_bar: int,
                            max_items=None) -> float:
    """Algorithm 2's offset ``1 + log(m/δ)/ε``, m = k̄ or min(Δ, k̄).

    Args:
      epsilon: ε > 0 per selection (the Gumbel scale is 1/ε).
      delta: 0 < δ < 1, the query's δ.
      k_bar: k̄ ≥ 1, the number of candidates.
      max_items: Δ (each user bounded to Δ distinct items), or None for
        unrestricted sensitivity.
    """
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    k_bar = check_positive_int(k_bar, "k_bar")
    m = k_bar if max_items is None else min(check_max_items(max_items), k_bar)
    check_resolvable_delta(delta, m)
    return (1.0 + math.log(m / delta) / epsilon) * (1.0 + _OFFSET_MARGIN)


def topk_laplace_scale(epsilon: float, max_items: int) -> float:
    """Algorithm 1's Laplace scale ``b = (Δ + 1)/ε``.

    The released vector (noisy counts and the threshold) has ℓ1-sensitivity at
    most Δ + 1 on the items both neighbours rank in their top k̄.

    Refused (ValueError) when b ≥ 2^41: the grid Laplace then rounds counts to a grid
    step above 1 (a power of two at or below b/2^40), which the proof's integer counts
    and offset do not allow for. That is ε below about (Δ + 1)/2.2e12.
    """
    scale = (check_max_items(max_items) + 1) / check_epsilon(epsilon)
    if scale >= TOPK_MAX_LAPLACE_SCALE:
        raise ValueError(f"epsilon {epsilon!r} is too small for top-k with counts at "
                         f"max_items {max_items}: its Laplace scale (Δ+1)/ε must be below "
                         f"2^41")
    return scale


#: Algorithm 1's largest Laplace scale (exclusive): below it the grid Laplace's step is at
#: most 1, so integer counts stay on its grid (``randomness.noise.grid_granularity``).
TOPK_MAX_LAPLACE_SCALE = float(2 ** 41)


def laplace_difference_tail(s: float, scale: float) -> float:
    """P(X − Y > s) for X, Y independent Lap(scale), s ≥ 0: ``½·e^(−s/b)·(1 + s/(2b))``."""
    x = s / scale
    return 0.5 * math.exp(-x) * (1.0 + 0.5 * x)


def laplace_tail_offset(scale: float, delta: float, max_items: int) -> float:
    """The s ≥ 0 solving ``½·e^(−s/b)·(1 + s/(2b)) = δ/Δ`` (0 when δ/Δ ≥ 1/2).

    Solved by bisection on x = s/b in log space to a relative 1e-14; the upper
    end of the bracket is returned, so the tail at s is never above δ/Δ (up to
    rounding).
    """
    scale = check_sensitivity(scale, "scale")
    max_items = check_max_items(max_items)
    delta = check_resolvable_delta(delta, max_items)
    target = math.log(delta / max_items)

    def log_tail(x):
        return math.log(0.5) - x + math.log1p(0.5 * x)

    if log_tail(0.0) <= target:
        return 0.0
    lo, hi = 0.0, max(1.0, -target)
    while log_tail(hi) > target:
        lo, hi = hi, 2.0 * hi
    _, hi = bisect(lambda x: log_tail(x) > target, lo, hi, rel_tol=1e-14)
    return hi * scale


def laplace_threshold_offset(epsilon: float, delta: float, max_items: int) -> float:
    """Algorithm 1's offset ``c = 1 + s``, s = ``laplace_tail_offset((Δ+1)/ε, δ, Δ)``."""
    return 1.0 + laplace_tail_offset(topk_laplace_scale(epsilon, max_items), delta, max_items)


# --------------------------------------------------------------------------
# GW-KT's DP scale estimate (docs/gw.md section 3, "Δ0, M and κ from a DP estimate").
# --------------------------------------------------------------------------

def split_epsilon(epsilon: float, share: float):
    """``(ε_a, ε_b)`` with ε_a about ``share``·ε, both > 0, and ε_a + ε_b ≤ ε exactly
    (checked in rational arithmetic): the budgets of two stages composed basically.

    Args:
      epsilon: ε > 0, the total.
      share: the first stage's fraction, 0 < share < 1.
    """
    epsilon = check_epsilon(epsilon)
    if isinstance(share, bool) or not isinstance(share, (int, float, np.integer, np.floating)) \
            or not 0.0 < float(share) < 1.0:
        raise ValueError(f"the share must be a number in (0, 1), got {share!r}")
    first = epsilon * float(share)
    second = epsilon - first
    while Fraction(first) + Fraction(second) > Fraction(epsilon):
        second = math.nextafter(second, 0.0)
    return check_epsilon(first, "the first stage's epsilon"), \
        check_epsilon(second, "the second stage's epsilon")


def scale_estimate_noise_scale(epsilon: float) -> float:
    """The Laplace scale ``1/ε`` of each count of GW-KT's scale estimate (the users by
    bucket of activity), rounded up (never below 1/ε, so the estimate never spends more
    than ε): one user moves one bucket by 1, so this scale is ε-DP.

    Args:
      epsilon: the estimate's ε > 0 (its share of the budget).
    """
    epsilon = check_epsilon(epsilon)
    scale = 1.0 / epsilon
    while Fraction(1) / Fraction(scale) > Fraction(epsilon):
        scale = math.nextafter(scale, math.inf)
    return scale
