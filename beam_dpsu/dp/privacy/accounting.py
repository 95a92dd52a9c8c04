"""Privacy accounting: zCDP composition and the zCDP ↔ (ε, δ)-DP conversions.

All functions are pure and deterministic. The conversion is the one of the
DP-SIPS paper (Corollary 9, from Canonne, Kamath and Steinke, Prop. 7): a
δ-approximately ρ-zCDP mechanism is (ε, δ_DP)-DP with

    δ_DP = δ + (1 − δ)·δ',   δ' = inf_{a>1} exp((a−1)(aρ − ε)) / (a − 1) · (1 − 1/a)^a.

Stated figures are never below what is spent: the sums and products of a
composition are exact and rounded up once (``sum_up``, ``product_up``,
``float_up``), a conversion states the upper end of its bisection, and
``readable_up`` gives the short figure a command prints (rounded up too).
"""
from __future__ import annotations

import dataclasses
import decimal
import math
from fractions import Fraction
from typing import Iterable, Optional, Tuple

from beam_dpsu.dp.privacy.calibration import (bisect, check_delta, check_epsilon, check_positive_int,
                                      check_rho)


__all__ = ["float_up", "float_down", "sum_up", "product_up", "product_down", "readable_up",
           "figure", "PrivacyGuarantee", "compose_zcdp", "zcdp_delta_prime", "zcdp_to_dp_delta",
           "zcdp_to_dp_epsilon", "dp_to_zcdp_rho", "zcdp_guarantee", "selections_charged",
           "br_composition_guarantee", "pay_what_you_get_epsilon", "PayWhatYouGetAccountant"]


# --------------------------------------------------------------------------
# Stated figures: rounded up, never below what is spent (docs/budget.md,
# "Rounding").
# --------------------------------------------------------------------------

def _exact(value) -> Fraction:
    if isinstance(value, Fraction):
        return value
    if isinstance(value, bool) or not math.isfinite(float(value)):
        raise ValueError(f"a stated figure must be a finite number, got {value!r}")
    return Fraction(value)


def float_up(value) -> float:
    """The smallest float ≥ ``value`` (an int, a float or a ``Fraction``, taken exactly).

    ``float(Fraction)`` rounds to the nearest float; when that is below the exact
    value, the next float up is returned. Beyond the largest float: ``inf``.
    """
    q = _exact(value)
    try:
        f = float(q)
    except OverflowError:
        return math.inf if q > 0 else -math.nextafter(math.inf, 0.0)
    if Fraction(f) < q:
        f = math.nextafter(f, math.inf)
    return f


def float_down(value) -> float:
    """The largest float ≤ ``value`` (an int, a float or a ``Fraction``, taken exactly)."""
    return -float_up(-_exact(value))


def sum_up(values: Iterable[float]) -> float:
    """The exact sum of ``values`` rounded UP to a float (a stated total).

    A floating-point sum can fall below the exact sum by a few ulps; a stated
    guarantee must not, so the addition is exact (``Fraction``) and rounded once,
    upward.
    """
    return float_up(sum((_exact(v) for v in values), Fraction(0)))


def product_up(a: float, b: float) -> float:
    """The exact product ``a·b`` rounded UP to a float (e.g. ε per selection × selections)."""
    return float_up(_exact(a) * _exact(b))


def product_down(a: float, b: float) -> float:
    """The exact product ``a·b`` rounded DOWN to a float (a share: total × fraction)."""
    return float_down(_exact(a) * _exact(b))


def readable_up(value: float, digits: int = 6) -> float:
    """A readable figure for a stated ε or δ: at most ``digits`` significant digits, never
    below ``value``.

    The nearest figure of ``digits`` significant digits when it is ≥ ``value`` (as a
    float: ``2.9999999999999662`` → ``3.0``, ``1e-05`` → ``1e-05``), else the figure
    rounded toward +∞ (``1.0000000000000003e-05`` → ``1.00001e-05``). Printed with
    ``repr``/JSON, it is short; the JSON summaries keep the exact value.
    """
    x = float(value)
    if not math.isfinite(x) or x == 0.0:
        return x
    digits = check_positive_int(digits, "digits")
    exact = decimal.Decimal(x)
    nearest = float(decimal.Context(prec=digits, rounding=decimal.ROUND_HALF_EVEN).plus(exact))
    if nearest >= x:
        return nearest
    return float(decimal.Context(prec=digits, rounding=decimal.ROUND_CEILING).plus(exact))


def figure(value: float) -> str:
    """``repr(readable_up(value))``: a stated ε or δ as text, rounded up (for messages)."""
    return repr(readable_up(value))


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
    """Composes δ-approximate ρ-zCDP mechanisms: ρ's add and δ's add.

    Both sums are exact and rounded up (``sum_up``): never below what is spent.
    """
    rhos, deltas = [], []
    for r, d in parts:
        rhos.append(check_rho(r))
        if not d >= 0:
            raise ValueError(f"delta must be >= 0, got {d!r}")
        deltas.append(float(d))
    return sum_up(rhos), sum_up(deltas)


def _log_delta_prime_at(x: float, rho: float, epsilon: float) -> float:
    """log[ exp((a−1)(aρ − ε)) / (a − 1) · (1 − 1/a)^a ] at a = 1 + e^x.

    Written in x = log(a − 1) so that a close to 1 loses no precision:
    log(a − 1) = x and log(1 − 1/a) = −log1p(e^−x) (the form x − log1p(e^x)
    cancels for large a, where tiny ρ puts the optimum: it stated δ' up to 3e-8
    below its exact value at ρ = 1e-14).
    """
    am1 = math.exp(x)
    a = 1.0 + am1
    return am1 * (a * rho - epsilon) - x - a * math.log1p(math.exp(-x))


def zcdp_delta_prime(rho: float, epsilon: float) -> Tuple[float, float]:
    """δ' of pure ρ-zCDP at ε and the minimising order a: returns (δ', a).

    Minimises the log of the expression over a > 1 (it is smooth and convex
    enough in log(a − 1) for a bounded scalar search); δ' is capped at 1. Every
    order a > 1 gives a valid δ'; the one returned is the float value at the order
    found, raised by ``_DELTA_PRIME_MARGIN`` so that it is never below the exact
    value there.
    """
    rho = check_rho(rho)
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")

    def f(x: float) -> float:
        return _log_delta_prime_at(x, rho, epsilon)

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
    # Imported here: scipy.optimize costs ~0.5 s to import, paid otherwise by every
    # process that imports the library (each Beam worker included).
    from scipy.optimize import minimize_scalar
    res = minimize_scalar(f, bounds=(best_x - width, best_x + width), method="bounded",
                          options={"xatol": 1e-12})
    if res.fun < best_v:
        best_x, best_v = float(res.x), float(res.fun)
    # (below the smallest double, the exact δ' is still > 0: the smallest double is stated)
    dprime = max(math.exp(best_v) * (1.0 + _DELTA_PRIME_MARGIN), math.ulp(0.0))
    return min(1.0, dprime), 1.0 + math.exp(best_x)


#: ``zcdp_delta_prime``'s margin (relative) above the float value at the chosen order,
#: which can be below the exact value by about 2e-14 (rounding in the exponent).
_DELTA_PRIME_MARGIN = 1e-12


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
    _, hi = bisect(lambda e: zcdp_to_dp_delta(rho, delta, e) > target_delta, lo, hi,
                   iterations=100, rel_tol=1e-13)
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
    lo, hi = bisect(lambda r: zcdp_to_dp_delta(r, zcdp_delta, epsilon) <= target_delta,
                    lo, hi, rel_tol=1e-13)
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


# --------------------------------------------------------------------------
# Pay-what-you-get composition of top-k queries (Durfee and Rogers),
# docs/mechanisms.md section 6.
# --------------------------------------------------------------------------

def selections_charged(k: int, num_released: int) -> int:
    """The selections a top-k query that released ``num_released`` items is charged.

    Each released item and the stop at ⊥ is one ε-bounded-range selection:
    ``ℓ + 1`` for ℓ < k released, and ``k`` when all k were released (no stop).
    """
    check_positive_int(k, "k")
    if (isinstance(num_released, bool) or not isinstance(num_released, int)
            or not 0 <= num_released <= k):
        raise ValueError(f"num_released must be an integer in [0, k={k}], got {num_released!r}")
    return k if num_released == k else num_released + 1


def br_composition_guarantee(epsilon: float, delta: float, selections: int, queries: int,
                             conversion_delta: float) -> PrivacyGuarantee:
    """(ε, δ)-DP of ``selections`` ε-BR selections in ``queries`` δ-queries.

    The better (smaller ε) of two routes:

    * basic composition: ``(ε·selections, δ·queries)``;
    * bounded range → zCDP: an ε-BR selection is ``ε²/8``-zCDP (Cesar and
      Rogers); the ``ρ = selections·ε²/8`` are added and converted with the
      DP-SIPS Corollary 9 at δ₁ = ``conversion_delta`` (``zcdp_to_dp_epsilon``),
      and ``δ·queries`` is added: ``(ε_zCDP, δ₁ + δ·queries)``.

    When the ε's are equal the basic route (smaller δ) is reported. Zero
    selections give ``(0, δ·queries)``.

    Returns:
      a ``PrivacyGuarantee`` whose ``rho`` is the summed ρ and whose ``note``
      names the route and both candidates.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    conversion_delta = check_delta(conversion_delta, "conversion_delta")
    for name, v in (("selections", selections), ("queries", queries)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    # Every product and sum below is exact and rounded up (never below what is spent).
    basic_delta = product_up(delta, queries)
    if selections == 0:
        return PrivacyGuarantee(0.0, basic_delta, note="no selection made")
    basic_eps = product_up(epsilon, selections)
    rho = float_up(Fraction(epsilon) ** 2 * selections / 8)
    zcdp_eps = zcdp_to_dp_epsilon(rho, 0.0, conversion_delta)
    zcdp_delta = sum_up([conversion_delta, Fraction(delta) * queries])
    both = (f"basic composition ({figure(basic_eps)}, {figure(basic_delta)}); bounded range → "
            f"{figure(rho)}-zCDP → ({figure(zcdp_eps)}, {figure(zcdp_delta)}) at "
            f"δ₁ = {conversion_delta:g}")
    if zcdp_eps < basic_eps:
        return PrivacyGuarantee(zcdp_eps, zcdp_delta, rho=rho, zcdp_delta=basic_delta,
                                note=f"bounded range → zCDP route; {both}")
    return PrivacyGuarantee(basic_eps, basic_delta, rho=rho, zcdp_delta=basic_delta,
                            note=f"basic composition route; {both}")


def pay_what_you_get_epsilon(epsilon: float, delta: float, max_selections: int,
                             max_queries: int) -> Tuple[float, float, float]:
    """Calibrates a pay-what-you-get budget of top-k queries to fit (ε, δ)-DP.

    Half of ``delta`` is the conversion δ₁ of the bounded-range → zCDP route, the
    other half is split evenly over the ``max_queries`` queries (each query's δ
    rounded down, so that the queries' δ's add up to at most δ/2 exactly). Returns
    ``(epsilon_per_selection, delta_per_query, conversion_delta)`` with the largest
    per-selection ε (bisection) such that ``br_composition_guarantee(...)``, the
    STATED guarantee (rounded up), is at most (``epsilon``, ``delta``).

    A top-k query calibrated from its whole (ε, δ) (``TopKMechanism(k, epsilon,
    delta)``) uses this with ``max_selections = k`` and ``max_queries = 1``.
    """
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    max_selections = check_positive_int(max_selections, "max_selections")
    max_queries = check_positive_int(max_queries, "max_queries")
    conversion_delta = float_down(Fraction(delta) / 2)
    delta_per_query = float_down(Fraction(delta) / 2 / max_queries)
    if not (conversion_delta > 0 and delta_per_query > 0):
        raise ValueError(f"delta={delta!r} is too small to split over {max_queries} queries")

    def total(e: float) -> PrivacyGuarantee:
        return br_composition_guarantee(e, delta_per_query, max_selections, max_queries,
                                        conversion_delta)

    def fits(e: float) -> bool:
        g = total(e)
        return g.epsilon <= epsilon and g.delta <= delta

    # Bracket: double hi until it no longer fits (the ε of the guarantee grows
    # without bound in the per-selection ε), then bisect.
    lo, hi = 0.0, epsilon
    while fits(hi):
        lo, hi = hi, hi * 2.0
    lo, hi = bisect(fits, lo, hi, rel_tol=1e-13)
    if lo <= 0 or not fits(lo):
        raise ValueError(f"(epsilon={epsilon!r}, delta={delta!r}) is too small for "
                         f"{max_selections} selections")
    return lo, delta_per_query, conversion_delta


class PayWhatYouGetAccountant:
    """The budget of a sequence of top-k queries (Durfee and Rogers, section 5).

    The analyst fixes, before looking at any output, a budget of
    ``max_selections`` ε-bounded-range selections (k*) and ``max_queries``
    queries (ℓ*). A top-k query run with Algorithm 2 (Gumbel) that releases ℓ
    items is charged ``ℓ + 1`` selections (``k`` when ℓ = k) and one query
    ("pay what you get"); the accountant refuses a query whose charge could
    overdraw either budget. Every query must use the same per-selection ε and
    per-query δ, and fresh randomness (a fresh ``RunKey``, or distinct
    purposes under one key).

    Args:
      epsilon: ε > 0 of each selection (the ``--epsilon`` of a Gumbel query).
      delta: 0 < δ < 1 of each query.
      max_selections: k* ≥ 1, total selections.
      max_queries: ℓ* ≥ 1, total queries.
      conversion_delta: δ₁ of the bounded-range → zCDP → (ε, δ) conversion
        (0 < δ₁ < 1); None (default) uses ``delta``. A smaller δ₁ gives a
        smaller total δ and a larger ε on that route.

    Privacy: whatever the analyst's adaptive choices, the whole sequence is
    ``guarantee()``-DP: the guarantee of the BUDGET (k*, ℓ*). The charges depend
    on the data, so ``spent_guarantee()`` (the same formula at the selections
    charged so far) is for information only, not a DP statement.
    """

    def __init__(self, epsilon: float, delta: float, max_selections: int, max_queries: int,
                 conversion_delta: Optional[float] = None):
        self.epsilon = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        check_positive_int(max_selections, "max_selections")
        check_positive_int(max_queries, "max_queries")
        self.conversion_delta = check_delta(
            self.delta if conversion_delta is None else conversion_delta, "conversion_delta")
        self.max_selections = max_selections
        self.max_queries = max_queries
        self.spent_selections = 0
        self.spent_queries = 0
        self.history = []  # (k, num_released, selections charged) per recorded query

    @property
    def remaining_selections(self) -> int:
        return self.max_selections - self.spent_selections

    @property
    def remaining_queries(self) -> int:
        return self.max_queries - self.spent_queries

    def check(self, k: int) -> None:
        """Raises ValueError unless a top-``k`` query may run now.

        The charge is known only after the query, and is at most ``k``; a
        query runs only if ``k ≤`` the remaining selections and a query is left.
        """
        check_positive_int(k, "k")
        if self.remaining_queries < 1:
            raise ValueError(f"query refused: the budget of {self.max_queries} queries is spent")
        if k > self.remaining_selections:
            raise ValueError(f"query refused: a top-{k} query may be charged {k} selections, "
                             f"only {self.remaining_selections} remain")

    def record(self, k: int, num_released: int) -> int:
        """Charges a top-``k`` query that released ``num_released`` items; returns the charge.

        Raises ValueError (and charges nothing) if the query should have been
        refused by ``check(k)``.
        """
        self.check(k)
        charge = selections_charged(k, num_released)
        self.spent_selections += charge
        self.spent_queries += 1
        self.history.append((k, num_released, charge))
        return charge

    def run(self, k: int, query):
        """``check(k)``, then ``released = query()``, then ``record(k, len(released))``."""
        self.check(k)
        released = query()
        self.record(k, len(released))
        return released

    def guarantee(self) -> PrivacyGuarantee:
        """The (ε, δ)-DP of the whole budget (k* selections, ℓ* queries)."""
        return br_composition_guarantee(self.epsilon, self.delta, self.max_selections,
                                        self.max_queries, self.conversion_delta)

    def spent_guarantee(self) -> PrivacyGuarantee:
        """The same formula at the selections and queries charged so far (information only)."""
        return br_composition_guarantee(self.epsilon, self.delta, self.spent_selections,
                                        self.spent_queries, self.conversion_delta)

    def describe(self) -> dict:
        g = self.guarantee()
        return {
            "epsilon_per_selection": self.epsilon, "delta_per_query": self.delta,
            "max_selections": self.max_selections, "max_queries": self.max_queries,
            "spent_selections": self.spent_selections, "spent_queries": self.spent_queries,
            "conversion_delta": self.conversion_delta,
            "total_epsilon": g.epsilon, "total_delta": g.delta, "total_note": g.note,
        }
