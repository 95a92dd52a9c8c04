"""One privacy budget for a whole pipeline: shares, composition, the stated total.

A pipeline often makes several releases from the same private data: a set of
keys (partition selection), then noisy counts or sums per released key, maybe
top-k queries. Each release spends part of one total (ε, δ)-DP guarantee. A
``PrivacyBudget`` is created once with that total; every release takes its
share from it before anything runs, and the budget states the guarantee of
all releases together (``guarantee()``, ``describe()`` for the public summary).

Shares and how they compose (docs/budget.md has the reasoning):

* ``(ε, δ)`` shares (``take``, ``mechanism``, ``weighted_gaussian``): each
  release is (ε_i, δ_i)-DP; they compose by basic composition, (Σε_i, Σδ_i).
* a zCDP pool (``zcdp``): a share (ε_c, δ_c) is turned into a δ_c/2-approximate
  ρ_c-zCDP budget (ρ_c the largest whose conversion gives (ε_c, δ_c), as
  ``Sips.from_dp`` does). zCDP releases (``WeightedGaussianZcdp``, ``Sips``)
  spend ρ and δ from the pool; their ρ's and δ's add (zCDP composition) and
  the pool's sum is converted ONCE to (ε, δ_c)-DP
  (``accounting.zcdp_to_dp_epsilon``), which is tighter than adding per-release
  (ε, δ) conversions. ``ZcdpBudget`` can also be used on its own.
* a top-k pool (``pay_what_you_get``): a share (ε_c, δ_c) becomes a
  ``accounting.PayWhatYouGetAccountant`` of k* selections and ℓ* queries whose
  per-selection ε is the largest whose budget guarantee fits (ε_c, δ_c);
  Algorithm 2 queries are charged through it (``run``/``record``).

The total stated is basic composition over the parts' own guarantees. A share
is refused (ValueError) when it would take the parts past the total: the check
happens when the share is taken, i.e. when the pipeline is constructed.

Rounding (docs/budget.md): every share is rounded DOWN (``share_of``: the exact
total × fraction, rounded down; never more than what remains, ``remaining_of``),
and every stated sum is exact and rounded UP (``accounting.sum_up``). So in
floating point the shares add up to at most the total and the stated total is
never below what the releases spend, nor above the budget.

Every composition and conversion is a small pure function at the top of this
module (``basic_composition``, ``fractions_of_weights``, ``share_of``, ``remaining_of``,
``zcdp_composition_guarantee``, ``compose_guarantees``; ``pay_what_you_get_epsilon``, from
``accounting``) so that a command line can compose parameters without building mechanisms.

Conditions (the guarantee rests on them): each release uses independent
randomness (its own ``RunKey``, or distinct purposes under one key; an
external library's releases use that library's own randomness); the shares
are fixed before any output is seen; neighbouring datasets differ in one user
with all their records in every release (the same user id in every release).
Using a DP release's output afterwards (e.g. released keys as public
partitions of a later aggregation) is post-processing and costs nothing more.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import uuid
import weakref
from fractions import Fraction
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.privacy.accounting import (PayWhatYouGetAccountant, PrivacyGuarantee, compose_zcdp,
                                     dp_to_zcdp_rho, figure, float_down, pay_what_you_get_epsilon,
                                     product_down, sum_up, zcdp_to_dp_epsilon)
from beam_dpsu.dp.mechanisms import Mechanism
from beam_dpsu.dp.privacy.params import DEFAULT_MAX_ITEMS

__all__ = ["RELATIVE_TOLERANCE", "Share", "basic_composition", "fractions_of_weights",
           "share_of", "remaining_of", "grant", "zcdp_composition_guarantee", "compose_guarantees",
           "fits",
           "ZcdpBudget", "PrivacyBudget", "DEFERRABLE_WEIGHTING", "ReleaseRuleOf",
           "DeferredMechanism"]


#: A share asked for (an explicit ε or δ, or total × fraction) that exceeds what
#: remains of the total by at most this fraction of the total is rounding (e.g.
#: 0.1 + 0.2 > 0.3 in floating point): it is granted as what remains (rounded
#: down). A share exceeding it by more is refused. Stated guarantees are never
#: compared with any tolerance: they are at most the budget, exactly.
RELATIVE_TOLERANCE = 1e-12


# --------------------------------------------------------------------------
# Pure composition helpers (also for the command line).
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Share:
    """An amount of (ε, δ)-DP budget: ``epsilon`` > 0 and 0 < ``delta`` < 1."""
    epsilon: float
    delta: float


def basic_composition(parts: Iterable[Tuple[float, float]]) -> Tuple[float, float]:
    """Basic composition of (ε_i, δ_i)-DP releases: (Σ ε_i, Σ δ_i).

    Holds for adaptively chosen releases with independent randomness. Parts
    with ε = 0 (and δ = 0) are allowed (e.g. a pool nothing was spent from).
    Both sums are exact and rounded UP (``accounting.sum_up``): the stated
    total is never below the parts'.
    """
    eps, delta = [], []
    for e, d in parts:
        e, d = float(e), float(d)
        if not (e >= 0 and math.isfinite(e)):
            raise ValueError(f"epsilon of a part must be finite and >= 0, got {e!r}")
        if not (0 <= d <= 1):
            raise ValueError(f"delta of a part must be in [0, 1], got {d!r}")
        eps.append(e)
        delta.append(d)
    return sum_up(eps), sum_up(delta)


def share_of(total: float, fraction: float) -> float:
    """A fraction of a total, as a share: the exact ``total × fraction`` rounded DOWN.

    ``3 × 0.8`` is 2.4000000000000004 in floating point, above the exact
    product of the two floats; the share is the float just below it, so that
    shares by fractions summing to 1 never add up to more than the total.
    """
    return product_down(total, fraction)


def remaining_of(total: float, spent: Iterable[float]) -> float:
    """What remains of a total after the shares ``spent``: exact, rounded DOWN, ≥ 0."""
    left = Fraction(total) - sum((Fraction(float(v)) for v in spent), Fraction(0))
    return max(0.0, float_down(left))


def grant(asked: float, total: float, spent: Sequence[float]) -> Optional[float]:
    """The share granted for ``asked`` out of ``total`` after the shares ``spent``.

    ``asked`` itself when it fits in what remains (``remaining_of``, exact, rounded
    down); what remains when ``asked`` exceeds it by rounding only (at most
    ``RELATIVE_TOLERANCE`` of the total); None (refused) otherwise. So the exact
    sum of the granted shares never exceeds the total.
    """
    left = remaining_of(total, spent)
    if asked <= left:
        return asked
    if left > 0 and asked - left <= total * RELATIVE_TOLERANCE:
        return left
    return None


def fractions_of_weights(weights: Mapping[str, float]) -> Dict[str, float]:
    """Relative weights → fractions of a total: {name: w / Σw}.

    Use with ``PrivacyBudget.take(name, fraction=...)`` to split a budget by
    weight, e.g. ``{"keys": 1, "counts": 2}`` → keys 1/3, counts 2/3.
    """
    if not weights:
        raise ValueError("weights must name at least one share")
    for name, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (w > 0 and math.isfinite(w)):
            raise ValueError(f"weight of {name!r} must be a finite number > 0, got {w!r}")
    total = math.fsum(float(w) for w in weights.values())
    return {name: float(w) / total for name, w in weights.items()}


def zcdp_composition_guarantee(parts: Iterable[Tuple[float, float]],
                               dp_delta: float) -> PrivacyGuarantee:
    """zCDP composition of δ_i-approximate ρ_i-zCDP releases, converted once.

    The ρ's add and the δ's add (``accounting.compose_zcdp``); the sum is
    converted to (ε, ``dp_delta``)-DP with the DP-SIPS Corollary 9 conversion
    (``accounting.zcdp_to_dp_epsilon``), which needs ``dp_delta`` > Σδ_i. No
    part gives (0, 0).
    """
    parts = list(parts)
    if not parts:
        return PrivacyGuarantee(0.0, 0.0, note="no zCDP release")
    rho, zdelta = compose_zcdp(parts)   # exact sums, rounded up
    dp_delta = cal.check_delta(dp_delta, "dp_delta")
    eps = zcdp_to_dp_epsilon(rho, zdelta, dp_delta)
    return PrivacyGuarantee(
        eps, dp_delta, rho=rho, zcdp_delta=zdelta,
        note=(f"{len(parts)} zCDP release(s): {figure(zdelta)}-approximate {figure(rho)}-zCDP "
              f"(ρ's and δ's added), converted once to (ε, {figure(dp_delta)})-DP "
              f"(DP-SIPS Corollary 9)"))


def compose_guarantees(guarantees: Iterable[PrivacyGuarantee]) -> PrivacyGuarantee:
    """The (ε, δ)-DP of several releases, each with its stated guarantee.

    Basic composition (Σε_i, Σδ_i) always holds. When EVERY release is
    calibrated in zCDP (``rho`` set, with ``zcdp_delta``), their zCDP
    composition converted once at the same total δ (``zcdp_composition_guarantee``)
    holds too, provided Σ zcdp_delta < Σδ; the smaller ε of the two is
    returned, with a note naming the route. Releases must use independent
    randomness.
    """
    guarantees = list(guarantees)
    if not guarantees:
        return PrivacyGuarantee(0.0, 0.0, note="no release")
    eps, delta = basic_composition((g.epsilon, g.delta) for g in guarantees)
    best = PrivacyGuarantee(eps, delta, note=f"basic composition of {len(guarantees)} "
                                             f"release(s)")
    if all(g.rho is not None and g.zcdp_delta is not None for g in guarantees):
        zdelta = sum_up(g.zcdp_delta for g in guarantees)
        if zdelta < delta < 1:
            z = zcdp_composition_guarantee(((g.rho, g.zcdp_delta) for g in guarantees), delta)
            if z.epsilon < best.epsilon:
                best = z
    return best


def fits(spent: float, total: float) -> bool:
    """``spent <= total``, exactly: a stated guarantee within a budget (no tolerance).

    Stated guarantees are rounded up and shares rounded down, so an exact
    comparison is the right one; rounding slack is allowed only when a share is
    granted (``RELATIVE_TOLERANCE``).
    """
    return float(spent) <= float(total)


# --------------------------------------------------------------------------
# The budget objects.
# --------------------------------------------------------------------------

@dataclasses.dataclass
class _Part:
    name: str
    kind: str                       # 'dp', 'zcdp-pool', 'pay-what-you-get'
    allocated: Share
    stated: Callable[[], PrivacyGuarantee]
    detail: Callable[[], Dict[str, Any]]


class ZcdpBudget:
    """A zCDP budget shared by zCDP releases, converted once to (ε, δ)-DP.

    Args:
      rho: total ρ > 0 of the pool.
      delta: total approximate-zCDP δ, 0 < δ < 1/2.
      dp_delta: the δ of the (ε, δ)-DP statement; must exceed ``delta``.
        Default None: 2·δ (the library's convention, ``accounting.zcdp_guarantee``).

    Privacy: releases that spend (ρ_i, δ_i) with Σρ_i ≤ ρ and Σδ_i ≤ δ are
    together Σδ_i-approximate Σρ_i-zCDP, stated as (ε, dp_delta)-DP with
    ``zcdp_composition_guarantee``. Spending past ρ or δ is a ValueError.
    """

    def __init__(self, rho: float, delta: float, dp_delta: Optional[float] = None):
        self.rho = cal.check_rho(rho)
        self.delta = cal.check_delta(delta, upper=0.5)
        self.dp_delta = 2.0 * self.delta if dp_delta is None else cal.check_delta(dp_delta,
                                                                                   "dp_delta")
        if not self.dp_delta > self.delta:
            raise ValueError(f"dp_delta ({self.dp_delta!r}) must exceed the zCDP delta "
                             f"({self.delta!r})")
        self._parts: List[Tuple[str, float, float, str]] = []

    @property
    def spent(self) -> Tuple[float, float]:
        """(Σρ_i, Σδ_i) spent so far."""
        return compose_zcdp((r, d) for _, r, d, _ in self._parts) if self._parts else (0.0, 0.0)

    @property
    def remaining(self) -> Tuple[float, float]:
        """(ρ, δ) left in the pool: exact, rounded down."""
        return (remaining_of(self.rho, [r for _, r, _, _ in self._parts]),
                remaining_of(self.delta, [d for _, _, d, _ in self._parts]))

    def take(self, name: str, fraction: Optional[float] = None, *, rho: Optional[float] = None,
             delta: Optional[float] = None, what: str = "share") -> Tuple[float, float]:
        """Spends ``fraction`` of the pool's (ρ, δ), or an explicit (``rho``, ``delta``).

        Args:
          name: the release's name (unique in the pool; it appears in ``describe()``).
          fraction: 0 < f ≤ 1 of the pool's TOTAL ρ and δ; or None with ``rho``
            and ``delta`` given.
          rho, delta: explicit amounts (both, and no ``fraction``).
          what: a description of the release, shown in ``describe()`` (default
            ``'share'``). No privacy effect.

        Returns (ρ_i, δ_i), rounded down as ``PrivacyBudget.take``'s shares (``share_of``,
        ``grant``): the pool's parts never add up to more than its (ρ, δ). Raises
        ValueError if the pool would be overspent.
        """
        _check_name(name, (p[0] for p in self._parts))
        if fraction is not None:
            if rho is not None or delta is not None:
                raise ValueError("give either fraction or rho and delta, not both")
            f = _check_fraction(fraction)
            rho_a, delta_a = share_of(self.rho, f), share_of(self.delta, f)
        else:
            if rho is None or delta is None:
                raise ValueError("give fraction, or both rho and delta")
            rho_a, delta_a = cal.check_rho(rho), cal.check_delta(delta, upper=0.5)
        rho_i = grant(rho_a, self.rho, [r for _, r, _, _ in self._parts])
        delta_i = grant(delta_a, self.delta, [d for _, _, d, _ in self._parts])
        if rho_i is None or delta_i is None or rho_i <= 0 or delta_i <= 0:
            left_r, left_d = self.remaining
            raise ValueError(
                f"zCDP budget overspent by {name!r}: it asks ρ={rho_a:.6g}, δ={delta_a:.3g}; "
                f"{left_r:.6g} of ρ={self.rho:.6g} and {left_d:.3g} of δ={self.delta:.3g} "
                f"remain")
        self._parts.append((name, rho_i, delta_i, what))
        return rho_i, delta_i

    def weighted_gaussian(self, name: str, max_items: int = DEFAULT_MAX_ITEMS, fraction: Optional[float] = None,
                          *, rho: Optional[float] = None, delta: Optional[float] = None):
        """A ``WeightedGaussianZcdp`` on a share of the pool (see ``take``).

        Args:
          name: the release's name, unique in the pool.
          max_items: Δ0 (default 100): it changes utility, not privacy. It comes
            before ``fraction``: give the share by keyword.
          fraction / rho, delta: the share (see ``take``): the release is
            δ-approximate ρ-zCDP with the share's (ρ, δ).
        """
        from beam_dpsu.dp.mechanisms import WeightedGaussianZcdp
        cal.check_max_items(max_items)
        rho_i, delta_i = self.take(name, fraction, rho=rho, delta=delta,
                                   what="weighted-gaussian (zCDP)")
        return WeightedGaussianZcdp(rho_i, delta_i, max_items)

    def sips(self, name: str, max_items: int = DEFAULT_MAX_ITEMS, fraction: Optional[float] = None, *,
             rho: Optional[float] = None, delta: Optional[float] = None, **kwargs):
        """A ``sips.Sips`` (all its rounds) on a share of the pool (see ``take``).

        Args:
          name: the release's name, unique in the pool.
          max_items: Δ0 (default 100); give the share by keyword.
          fraction / rho, delta: the share (see ``take``): all rounds together are
            δ-approximate ρ-zCDP with the share's (ρ, δ).
          kwargs: ``rounds``, ``ratio``, ``removal``, as for ``Sips`` (no privacy
            effect beyond the share: the rounds split the share's ρ and δ); nothing
            else is accepted.
        """
        from beam_dpsu.dp.mechanisms.sips import Sips
        cal.check_max_items(max_items)
        rho_i, delta_i = self.take(name, fraction, rho=rho, delta=delta, what="sips")
        try:
            return Sips(rho_i, delta_i, max_items, **kwargs)
        except Exception:
            self._parts.pop()
            raise

    def guarantee(self) -> PrivacyGuarantee:
        """The (ε, dp_delta)-DP of the releases spent so far (Σρ, Σδ converted once)."""
        return zcdp_composition_guarantee([(r, d) for _, r, d, _ in self._parts], self.dp_delta)

    def describe(self) -> Dict[str, Any]:
        g = self.guarantee()
        return {
            "rho": self.rho, "zcdp_delta": self.delta, "dp_delta": self.dp_delta,
            "spent_rho": self.spent[0], "spent_zcdp_delta": self.spent[1],
            "releases": [{"name": n, "kind": w, "rho": r, "zcdp_delta": d}
                         for n, r, d, w in self._parts],
            "epsilon": g.epsilon, "delta": g.delta, "guarantee": g.note,
        }


class PrivacyBudget:
    """The total (ε, δ)-DP guarantee of a pipeline, shared by all its releases.

    Create it once with the total; every release takes its share with one of
    the methods below, each of which fails with ValueError, before anything
    runs, if the share would take the releases past the total. Shares are
    given as a ``fraction`` of the TOTAL (0 < f ≤ 1; for weights use
    ``fractions_of_weights``) or as an explicit ``epsilon`` and ``delta``.

    * ``take(name, ...)`` → a ``Share`` for a release made elsewhere, e.g. the
      ``total_epsilon``/``total_delta`` of a PipelineDP accountant;
    * ``mechanism(name, mechanism_name, ...)`` → a registered (ε, δ)-DP
      mechanism (``registry.make_mechanism``) calibrated to the share;
      ``weighted_gaussian(name, ...)`` is the common case;
    * ``zcdp(name, ...)`` → a ``ZcdpBudget`` pool for zCDP releases;
    * ``pay_what_you_get(name, ...)`` → a ``PayWhatYouGetAccountant`` for top-k.

    Args:
      epsilon: total ε > 0 of the whole pipeline.
      delta: total δ, 0 < δ < 1.

    Privacy: ``guarantee()`` is the basic composition of the parts' stated
    guarantees (each ≤ its share), so at most (epsilon, delta), under the
    conditions in the module docstring (independent randomness per release,
    shares fixed before any output is seen). In floating point too: shares are
    rounded down (their exact sum never exceeds the total) and the stated sum is
    exact, rounded up (never below the parts).
    """

    def __init__(self, epsilon: float, delta: float):
        self.epsilon = cal.check_epsilon(epsilon)
        self.delta = cal.check_delta(delta)
        self._parts: List[_Part] = []

    # -- spending ----------------------------------------------------------

    @property
    def allocated(self) -> Share:
        """(Σε_i, Σδ_i) of the shares taken so far (basic composition)."""
        e, d = basic_composition((p.allocated.epsilon, p.allocated.delta) for p in self._parts)
        return Share(e, d)

    @property
    def remaining(self) -> Share:
        """(ε, δ) not yet taken: exact, rounded down."""
        return Share(remaining_of(self.epsilon, [p.allocated.epsilon for p in self._parts]),
                     remaining_of(self.delta, [p.allocated.delta for p in self._parts]))

    def _share(self, name: str, fraction: Optional[float], epsilon: Optional[float],
               delta: Optional[float]) -> Share:
        """The share granted: ``fraction`` of the total rounded down (``share_of``), or the
        explicit (ε, δ); at most what remains (``grant``), else ValueError."""
        _check_name(name, (p.name for p in self._parts))
        if fraction is not None:
            if epsilon is not None or delta is not None:
                raise ValueError("give either fraction or epsilon and delta, not both")
            f = _check_fraction(fraction)
            asked = Share(share_of(self.epsilon, f), share_of(self.delta, f))
        else:
            if epsilon is None or delta is None:
                raise ValueError("give fraction, or both epsilon and delta")
            asked = Share(cal.check_epsilon(epsilon), cal.check_delta(delta))
        eps = grant(asked.epsilon, self.epsilon, [p.allocated.epsilon for p in self._parts])
        delta_ = grant(asked.delta, self.delta, [p.allocated.delta for p in self._parts])
        if eps is None or delta_ is None or eps <= 0 or delta_ <= 0:
            left = self.remaining
            raise ValueError(
                f"privacy budget overspent by {name!r}: it asks ε={asked.epsilon:.6g}, "
                f"δ={asked.delta:.3g}; {left.epsilon:.6g} of ε={self.epsilon:g} and "
                f"{left.delta:.3g} of δ={self.delta:g} remain")
        return Share(eps, delta_)

    def _add(self, part: _Part) -> None:
        self._parts.append(part)

    def restate(self, name: str, mechanism: Mechanism) -> None:
        """The part ``name`` (from ``mechanism(...)``) now describes ``mechanism``: a
        calibrated copy of the one built there (GW-KT after its DP scale estimate sets
        Δ0, M and κ), with the same guarantee (checked: a ValueError otherwise, and for
        an unknown name), so the statement shows the parameters that ran."""
        for part in self._parts:
            if part.name == name and part.kind == "dp":
                stated = part.stated()
                g = mechanism.guarantee
                if (g.epsilon, g.delta) != (stated.epsilon, stated.delta):
                    raise ValueError(f"{name!r} was built with ({stated.epsilon:.6g}, "
                                     f"{stated.delta:.3g})-DP; the restated mechanism states "
                                     f"({g.epsilon:.6g}, {g.delta:.3g})")
                part.detail = mechanism.describe
                return
        raise ValueError(f"no (ε, δ) release named {name!r} in this budget")

    def take(self, name: str, fraction: Optional[float] = None, *,
             epsilon: Optional[float] = None, delta: Optional[float] = None) -> Share:
        """Takes an (ε, δ) share for a release made by other code (e.g. PipelineDP).

        Args:
          name: the release's name, unique in this budget (shown in ``describe()``).
          fraction: 0 < f ≤ 1 of the total ε and δ; or None with ``epsilon`` and ``delta``.
          epsilon, delta: an explicit share (both, and no ``fraction``).

        Privacy: the release must be (share.epsilon, share.delta)-DP on its own;
        that is the caller's (or the other library's) guarantee.
        """
        share = self._share(name, fraction, epsilon, delta)
        g = PrivacyGuarantee(share.epsilon, share.delta, note="(ε, δ)-DP share")
        self._add(_Part(name, "dp", share, lambda: g, lambda: {"use": "external release"}))
        return share

    def mechanism(self, name: str, mechanism: str, fraction: Optional[float] = None, *,
                  epsilon: Optional[float] = None, delta: Optional[float] = None,
                  **params) -> Mechanism:
        """A registered mechanism calibrated to an (ε, δ) share.

        Args:
          name: the release's name, unique in this budget.
          mechanism: a name of ``registry.REGISTRY`` taking ``--epsilon --delta``
            (e.g. ``'weighted-gaussian'``, ``'sips'``, ``'policy-gaussian'``, ``'gw'``).
          fraction / epsilon, delta: the share (see ``take``).
          params: the mechanism's other parameters (``max_items``, ``alpha``,
            ``rounds``, ...), which change utility, not privacy.

        The mechanism's own stated guarantee must fit the share (checked), and it
        must be proven: a research variant that is not (``variant='published'``
        with ``allow_unproven``) is refused, as its stated guarantee is not one.
        """
        from beam_dpsu.dp.mechanisms.registry import MechanismParams, make_mechanism
        if "rho" in params:
            raise ValueError("an (ε, δ) share cannot build a mechanism from rho; "
                             "use budget.zcdp(...) for zCDP mechanisms")
        share = self._share(name, fraction, epsilon, delta)
        built = make_mechanism(mechanism, MechanismParams(epsilon=share.epsilon,
                                                          delta=share.delta, **params))
        if not built.proven:
            raise ValueError(f"{mechanism} with these parameters is not proven private; a "
                             f"budget composes proven guarantees only")
        g = built.guarantee
        if not (fits(g.epsilon, share.epsilon) and fits(g.delta, share.delta)):  # exactly
            raise ValueError(f"{mechanism} states ({g.epsilon:.6g}, {g.delta:.3g})-DP, more than "
                             f"its share ({share.epsilon:.6g}, {share.delta:.3g})")
        self._add(_Part(name, "dp", share, lambda: g, built.describe))
        return built

    def weighted_gaussian(self, name: str, max_items: int = DEFAULT_MAX_ITEMS,
                          fraction: Optional[float] = None, *, epsilon: Optional[float] = None,
                          delta: Optional[float] = None) -> Mechanism:
        """A ``WeightedGaussian`` ((ε, δ)-DP) on a share.

        Args:
          name: the release's name, unique in this budget.
          max_items: Δ0 (default 100), distinct items kept per user: utility, not
            privacy. It comes before ``fraction``: give the share by keyword
            (``weighted_gaussian('keys', fraction=0.5)``).
          fraction / epsilon, delta: the share (see ``take``); the release is
            (share ε, share δ)-DP.
        """
        return self.mechanism(name, "weighted-gaussian", fraction, epsilon=epsilon, delta=delta,
                              max_items=max_items)

    def zcdp(self, name: str, fraction: Optional[float] = None, *,
             epsilon: Optional[float] = None, delta: Optional[float] = None) -> ZcdpBudget:
        """A ``ZcdpBudget`` pool made of an (ε_c, δ_c) share.

        Args:
          name: the pool's name, unique in this budget.
          fraction / epsilon, delta: the share (ε_c, δ_c) (see ``take``): the
            pool's releases together are (ε_c, δ_c)-DP.

        The pool has zCDP δ = δ_c/2 and ρ = the largest ρ whose conversion gives
        (ε_c, δ_c) (``accounting.dp_to_zcdp_rho``); its releases' ρ's add and are
        converted once (``zcdp_composition_guarantee`` at δ_c), so the pool's
        stated ε never exceeds ε_c.
        """
        share = self._share(name, fraction, epsilon, delta)
        rho = dp_to_zcdp_rho(share.epsilon, share.delta, share.delta / 2.0)
        pool = ZcdpBudget(rho, share.delta / 2.0, dp_delta=share.delta)

        def stated() -> PrivacyGuarantee:
            # ρ is the largest with zcdp_to_dp_delta(ρ, δ_c/2, ε_c) ≤ δ_c, and the pool
            # never spends more than (ρ, δ_c/2): (ε_c, δ_c) holds. The conversion of
            # what was spent is smaller, but its bisection stops within 1e-13 of the
            # root, so at a full pool it can exceed ε_c by that much: state ε_c then.
            g = pool.guarantee()
            if g.epsilon <= share.epsilon:
                return g
            return dataclasses.replace(g, epsilon=share.epsilon, note=(
                g.note + f"; at most the share's ε = {share.epsilon!r}, which the pool's ρ "
                         f"was calibrated to give"))

        self._add(_Part(name, "zcdp-pool", share, stated, pool.describe))
        return pool

    def pay_what_you_get(self, name: str, max_selections: int, max_queries: int,
                         fraction: Optional[float] = None, *, epsilon: Optional[float] = None,
                         delta: Optional[float] = None) -> PayWhatYouGetAccountant:
        """A top-k ``PayWhatYouGetAccountant`` whose budget guarantee fits a share.

        Args:
          name: the accountant's name, unique in this budget.
          max_selections: k*, the ε-bounded-range selections of all queries together
            (an integer >= 1): a larger k* leaves a smaller ε per selection; the
            guarantee stays the share's.
          max_queries: ℓ*, the number of queries (an integer >= 1), likewise.
          fraction / epsilon, delta: the share (see ``take``).

        The accountant's per-selection ε is ``pay_what_you_get_epsilon``'s; run
        each Algorithm 2 query with ``TopKMechanism(k, epsilon_per_selection=acc.epsilon,
        delta=acc.delta)`` through ``acc.run`` (or ``check``/``record``).
        """
        cal.check_positive_int(max_selections, "max_selections")
        cal.check_positive_int(max_queries, "max_queries")
        share = self._share(name, fraction, epsilon, delta)
        eps_sel, delta_q, delta_1 = pay_what_you_get_epsilon(share.epsilon, share.delta,
                                                             max_selections, max_queries)
        acc = PayWhatYouGetAccountant(eps_sel, delta_q, max_selections, max_queries, delta_1)
        self._add(_Part(name, "pay-what-you-get", share, acc.guarantee, acc.describe))
        return acc

    # -- the statement -----------------------------------------------------

    def guarantee(self) -> PrivacyGuarantee:
        """The (ε, δ)-DP of all releases: basic composition of the parts' stated guarantees
        (exact sums rounded up), at most the budget (checked: a RuntimeError otherwise,
        which the share arithmetic rules out)."""
        stated = [p.stated() for p in self._parts]
        eps, delta = basic_composition((g.epsilon, g.delta) for g in stated)
        if not (fits(eps, self.epsilon) and fits(delta, self.delta)):
            raise RuntimeError(f"the parts state ({eps!r}, {delta!r}), more than the budget "
                               f"({self.epsilon!r}, {self.delta!r})")
        return PrivacyGuarantee(
            eps, delta,
            note=(f"basic composition of {len(stated)} part(s) "
                  f"({', '.join(p.name + ': ' + p.kind for p in self._parts) or 'none'}): "
                  f"({figure(eps)}, {figure(delta)}), within the budget "
                  f"({figure(self.epsilon)}, {figure(self.delta)})"))

    def describe(self) -> Dict[str, Any]:
        """JSON-ready statement for the public summary: total, parts, stated guarantee."""
        g = self.guarantee()
        parts = []
        for p in self._parts:
            s = p.stated()
            parts.append({"name": p.name, "kind": p.kind,
                          "share_epsilon": p.allocated.epsilon, "share_delta": p.allocated.delta,
                          "epsilon": s.epsilon, "delta": s.delta, "guarantee": s.note,
                          "detail": p.detail()})
        return {"budget_epsilon": self.epsilon, "budget_delta": self.delta,
                "composition": "basic composition of the parts' stated guarantees",
                "epsilon": g.epsilon, "delta": g.delta, "parts": parts}

    def __repr__(self) -> str:
        a = self.allocated
        return (f"<PrivacyBudget ({self.epsilon:g}, {self.delta:g}): {len(self._parts)} parts, "
                f"allocated ({a.epsilon:.6g}, {a.delta:.3g})>")


def _check_fraction(fraction: float) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not (0.0 < fraction <= 1.0):
        raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
    return float(fraction)


def _check_name(name: str, taken: Iterable[str]) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a share needs a non-empty name, got {name!r}")
    if name in set(taken):
        raise ValueError(f"a share named {name!r} was already taken")


# --------------------------------------------------------------------------
# Mechanisms calibrated later, from a share computed by another accountant.
# --------------------------------------------------------------------------

#: Registered (ε, δ)-DP histogram mechanisms that can be calibrated after the
#: pipeline is constructed: their graph (Δ0 sampling, histogram weighting)
#: does not depend on (ε, δ), only the release rule does.
DEFERRABLE_WEIGHTING = {
    "truncated-geometric": "count",
    "count-laplace": "count",
    "count-gaussian": "count",
    "weighted-laplace": "l1",
    "weighted-gaussian": "l2",
}

_LIVE: "weakref.WeakValueDictionary[str, DeferredMechanism]" = weakref.WeakValueDictionary()
_EXPANDING = [0]


def _live_mechanism(token: str) -> "DeferredMechanism":
    return _LIVE[token]


def _calibrated_mechanism(mechanism: Mechanism) -> Mechanism:
    return mechanism


class ReleaseRuleOf:
    """``make_rule(run_key)`` of a mechanism: after pickling, of the calibrated one."""

    def __init__(self, mechanism: Mechanism):
        self.mechanism = mechanism

    def __call__(self, run_key, round_index: int = 0):
        return self.mechanism.release_rule(run_key, round_index)


class DeferredMechanism(Mechanism):
    """A histogram mechanism whose (ε, δ) is known only after the pipeline is built.

    Used when the share comes from an accountant that fixes it later (PipelineDP's
    ``compute_budgets()``, see ``beam_dpsu.transforms.pipelinedp``). The job graph (Δ0
    sampling, weighted histogram) is built at once; the calibration (threshold,
    noise scale) is made by ``calibrate()`` on first need after the share is
    known: when the pipeline is serialised to run, or when a worker first
    applies the release rule. Until then ``guarantee``, ``rounds`` and
    ``describe()`` raise ValueError, and so does running the pipeline: no
    uncalibrated mechanism ever releases anything.

    Args:
      mechanism: a name in ``DEFERRABLE_WEIGHTING``.
      max_items: Δ0 ≥ 1 (no privacy effect).
      resolve_share: ``() -> (epsilon, delta)``; raises ValueError while the
        share is not known yet.
    """

    def __init__(self, mechanism: str, max_items: int, resolve_share: Callable[[], Tuple[float, float]]):
        if mechanism not in DEFERRABLE_WEIGHTING:
            raise ValueError(
                f"mechanism {mechanism!r} cannot be calibrated after the pipeline is built "
                f"(its job graph depends on its budget); choose one of "
                f"{', '.join(sorted(DEFERRABLE_WEIGHTING))}, or calibrate it from a known "
                f"share (PrivacyBudget.mechanism)")
        self.name = mechanism
        self._max_items = cal.check_max_items(max_items)
        self._weighting = DEFERRABLE_WEIGHTING[mechanism]
        self._resolve_share = resolve_share
        self._built: Optional[Mechanism] = None
        self._token = uuid.uuid4().hex  # identifies this object in this process; not secret
        _LIVE[self._token] = self

    @property
    def calibrated(self) -> bool:
        return self._built is not None

    def calibrate(self) -> Mechanism:
        """The calibrated mechanism; raises ValueError while the share is unknown."""
        if self._built is None:
            from beam_dpsu.dp.mechanisms.registry import make_mechanism
            epsilon, delta = self._resolve_share()
            built = make_mechanism(self.name, epsilon=epsilon, delta=delta,
                                   max_items=self._max_items)
            if (built.calibration.weighting != self._weighting
                    or built.max_items != self._max_items or len(built.rounds) != 1):
                raise ValueError(f"{self.name}: the calibrated graph differs from the built one")
            self._built = built
        return self._built

    @property
    def guarantee(self) -> PrivacyGuarantee:  # type: ignore[override]
        return self.calibrate().guarantee

    @property
    def rounds(self):  # type: ignore[override]
        return self.calibrate().rounds

    @property
    def max_items(self) -> int:
        return self._max_items

    def describe(self) -> Dict[str, Any]:
        return self.calibrate().describe()

    def release_rule(self, run_key, round_index: int = 0):
        return self.calibrate().release_rule(run_key, round_index)

    def run_local(self, per_user, run_key):
        """The calibrated mechanism's Beam-free run (raises while the share is unknown)."""
        return self.calibrate().run_local(per_user, run_key)

    @property
    def weighting(self) -> str:
        """The histogram weighting of the built graph (known before calibration)."""
        return self._weighting

    @contextlib.contextmanager
    def expanding(self):
        """The Beam expansion is built inside this context: while it lasts, Beam's
        pickling round trip of the DoFns keeps THIS object (so it sees the share once
        computed); any later pickling calibrates (``__reduce__``)."""
        _EXPANDING[0] += 1
        try:
            yield self
        finally:
            _EXPANDING[0] -= 1

    def __reduce__(self):
        if self._built is None and _EXPANDING[0] > 0:
            return _live_mechanism, (self._token,)
        # Serialised to run: calibrate now (raises if the share is unknown) and
        # ship the calibrated mechanism, not the accountant.
        return _calibrated_mechanism, (self.calibrate(),)

    def __repr__(self) -> str:
        if self._built is None:
            return f"<DeferredMechanism {self.name}: not calibrated yet>"
        return f"<DeferredMechanism {self._built!r}>"
