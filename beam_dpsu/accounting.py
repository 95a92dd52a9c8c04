"""Privacy accounting: zCDP composition and the zCDP ↔ (ε, δ)-DP conversions.

All functions are pure and deterministic. The conversion is the one of the
DP-SIPS paper (Corollary 9, from Canonne, Kamath and Steinke, Prop. 7): a
δ-approximately ρ-zCDP mechanism is (ε, δ_DP)-DP with

    δ_DP = δ + (1 − δ)·δ',   δ' = inf_{a>1} exp((a−1)(aρ − ε)) / (a − 1) · (1 − 1/a)^a.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Optional, Tuple

from scipy.optimize import minimize_scalar

from beam_dpsu.calibration import check_delta, check_epsilon, check_rho


@dataclasses.dataclass(frozen=True)
class PrivacyGuarantee:
    """What a mechanism guarantees, stated before the pipeline runs.

    Attributes:
      epsilon, delta: the (ε, δ)-DP guarantee under add/remove-one-user
        neighbouring datasets.
      rho: ρ when the mechanism is calibrated in zCDP (then ``zcdp_delta`` is the
        δ of δ-approximate ρ-zCDP), else None.
      zcdp_delta: see ``rho``.
      note: how (ε, δ) was obtained (e.g. the zCDP conversion used).
    """
    epsilon: float
    delta: float
    rho: Optional[float] = None
    zcdp_delta: Optional[float] = None
    note: str = ""


def compose_zcdp(parts: Iterable[Tuple[float, float]]) -> Tuple[float, float]:
    """Composes δ-approximate ρ-zCDP mechanisms: ρ's add and δ's add."""
    rho, delta = 0.0, 0.0
    for r, d in parts:
        rho += check_rho(r)
        if d < 0:
            raise ValueError(f"delta must be >= 0, got {d!r}")
        delta += float(d)
    return rho, delta


def _log_delta_prime_at(a: float, rho: float, epsilon: float) -> float:
    # log[ exp((a−1)(aρ − ε)) / (a − 1) · (1 − 1/a)^a ]
    return (a - 1.0) * (a * rho - epsilon) - math.log(a - 1.0) + a * math.log1p(-1.0 / a)


def zcdp_delta_prime(rho: float, epsilon: float) -> Tuple[float, float]:
    """δ' of pure ρ-zCDP at ε and the minimising order a: returns (δ', a).

    Minimises the log of the expression over a > 1 (it is smooth and convex
    enough in log(a − 1) for a bounded scalar search); δ' is capped at 1.
    """
    rho = check_rho(rho)
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")

    def f(x: float) -> float:
        return _log_delta_prime_at(1.0 + math.exp(x), rho, epsilon)

    # The unconstrained optimum of (a−1)(aρ−ε) is near a = (ε + ρ)/(2ρ); search
    # log(a − 1) in a generous bracket around it.
    centre = math.log(max((epsilon + rho) / (2.0 * rho) - 1.0, 1e-6))
    lo, hi = min(centre - 30.0, -30.0), max(centre + 30.0, 30.0)
    best_x, best_v = None, math.inf
    # A coarse grid first (robust against a flat start), then a bounded refine.
    steps = 240
    for i in range(steps + 1):
        x = lo + (hi - lo) * i / steps
        v = f(x)
        if v < best_v:
            best_x, best_v = x, v
    width = (hi - lo) / steps
    res = minimize_scalar(f, bounds=(best_x - width, best_x + width), method="bounded",
                          options={"xatol": 1e-12})
    if res.fun < best_v:
        best_x, best_v = float(res.x), float(res.fun)
    return min(1.0, math.exp(best_v)), 1.0 + math.exp(best_x)


def zcdp_to_dp_delta(rho: float, delta: float, epsilon: float) -> float:
    """δ_DP such that δ-approximate ρ-zCDP implies (ε, δ_DP)-DP."""
    delta = float(delta)
    if not (0.0 <= delta < 1.0):
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    dprime, _ = zcdp_delta_prime(rho, epsilon)
    return min(1.0, delta + (1.0 - delta) * dprime)


def zcdp_to_dp_epsilon(rho: float, delta: float, target_delta: float) -> float:
    """The smallest ε with zcdp_to_dp_delta(ρ, δ, ε) ≤ target_delta (bisection on ε).

    Requires target_delta > delta (the zCDP δ passes through unchanged).
    """
    rho = check_rho(rho)
    target_delta = check_delta(target_delta, "target_delta")
    if not (0.0 <= delta < target_delta):
        raise ValueError(
            f"the (ε, δ)-DP delta ({target_delta!r}) must exceed the zCDP delta ({delta!r})")
    lo, hi = 0.0, max(1.0, rho + 2.0 * math.sqrt(rho * math.log(1.0 / (target_delta - delta))))
    while zcdp_to_dp_delta(rho, delta, hi) > target_delta:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if zcdp_to_dp_delta(rho, delta, mid) <= target_delta:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-13 * hi:
            break
    return hi


def dp_to_zcdp_rho(epsilon: float, target_delta: float, zcdp_delta: float) -> float:
    """The largest ρ such that zcdp_delta-approximate ρ-zCDP implies (ε, target_delta)-DP.

    Bisection on ρ; zcdp_to_dp_delta is increasing in ρ.
    """
    epsilon = check_epsilon(epsilon)
    target_delta = check_delta(target_delta, "delta")
    if not (0.0 <= zcdp_delta < target_delta):
        raise ValueError(
            f"the zCDP delta ({zcdp_delta!r}) must be in [0, delta={target_delta!r})")
    lo, hi = 0.0, 1.0
    while zcdp_to_dp_delta(hi, zcdp_delta, epsilon) <= target_delta:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            raise ValueError("no finite rho: the conversion never reaches the target")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= 0:
            break
        if zcdp_to_dp_delta(mid, zcdp_delta, epsilon) <= target_delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    if lo <= 0:
        raise ValueError(
            f"(epsilon={epsilon!r}, delta={target_delta!r}) is too small for any rho > 0")
    return lo


def zcdp_guarantee(rho: float, zcdp_delta: float, note: str = "") -> PrivacyGuarantee:
    """The library's (ε, δ)-DP statement for a δ-approximate ρ-zCDP mechanism.

    Convention (used by every zCDP mechanism and by ``sips --epsilon --delta``):
    half of the reported (ε, δ)-DP δ is the approximate-zCDP δ, i.e. the
    reported δ_DP is ``2·zcdp_delta`` and ε is the smallest with
    ``zcdp_to_dp_delta(ρ, zcdp_delta, ε) ≤ 2·zcdp_delta``.
    """
    rho = check_rho(rho)
    zcdp_delta = check_delta(zcdp_delta, "delta", upper=0.5)
    target = 2.0 * zcdp_delta
    eps = zcdp_to_dp_epsilon(rho, zcdp_delta, target)
    text = note or (f"{zcdp_delta:g}-approximate {rho:g}-zCDP, converted to (ε, δ)-DP at "
                    f"δ = 2·{zcdp_delta:g} (DP-SIPS Corollary 9)")
    return PrivacyGuarantee(epsilon=eps, delta=target, rho=rho, zcdp_delta=zcdp_delta, note=text)
