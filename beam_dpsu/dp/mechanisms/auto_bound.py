"""Δ0 chosen from the data with differential privacy (``--max-items-per-user auto``).

A share of ε buys a DP estimate of the users' activity (``dp.mechanisms.activity``: the
users counted by their number of distinct items, in buckets of base 2); a rule of the
mechanism's family turns it into Δ0; the mechanism then runs at the rest of ε with that
Δ0, fixed before any user is processed. The estimate is ε₁-DP, Δ0 is a function of it
and of public parameters, and the release is (ε₂, δ)-DP for every value of Δ0, so the
two compose to (ε₁ + ε₂, δ): docs/mechanisms.md section 12 gives the argument and its
conditions, tests/test_auto_bound.py tests them on neighbouring datasets.

GW-KT has its own calibration (Δ0, M and κ from an estimate, docs/gw.md section 3):
``registry.make_mechanism('gw-kt', max_items='auto')`` builds it with its share.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from fractions import Fraction
from typing import Any, Callable, Dict, Mapping, Optional

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.privacy.accounting import (PrivacyGuarantee, dp_to_zcdp_rho, float_down,
                                             float_up, zcdp_guarantee)
from beam_dpsu.dp.privacy.params import (ACTIVITY_EMPTY_BELOW, AUTO, AUTO_BUCKET_BASE,
                                         AUTO_BUCKETS, AUTO_EMPTY_BELOW, AUTO_FAMILIES,
                                         AUTO_MAX_ITEMS, AUTO_RULES, DEFAULT_AUTO_SHARE,
                                         CALIBRATED_WIDTH_RANGE, DEFAULT_MAX_ITEMS,
                                         MAX_MAX_ITEMS, gw_default_max_items)
from beam_dpsu.dp.mechanisms.activity import (ActivityBuckets, ScaleEstimate,
                                              check_estimate_epsilon, estimate_delta_room,
                                              release_scale, scale_statistics)
from beam_dpsu.dp.mechanisms.base import Mechanism
from beam_dpsu.dp.mechanisms.policy import max_items_from_estimate
from beam_dpsu.dp.randomness.noise import RunKey

__all__ = ["AUTO_LAYOUT", "AutoRule", "auto_rule", "zcdp_estimate_epsilon", "AutoBound"]

#: The estimate's buckets: [1, 2), [2, 4), …, [1024, ∞).
AUTO_LAYOUT = ActivityBuckets(AUTO_BUCKET_BASE, AUTO_BUCKETS)

#: The key purpose of the estimate's noise (GW-KT's is ``scale``).
ESTIMATE_PURPOSE = "activity"


@dataclasses.dataclass(frozen=True)
class AutoRule:
    """A family's rule from the activity estimate to Δ0.

    Attributes:
      family: ``params.AUTO_FAMILIES``' name of it (``weighted``, ``policy``, ``sips``,
        ``adaptive``, ``gw``).
      quantile, factor: Δ0 = factor × the estimated ``quantile`` of the users' numbers
        of distinct items (a noisy bucket below ``params.AUTO_EMPTY_BELOW`` noise scales
        read as empty), rounded, in [1, ``params.AUTO_MAX_ITEMS``] (``gw``: GW-KT's
        ``max_items_from_estimate``, the median within GW's band, at GW-KT's floor).
      fallback: Δ0 when the estimate is not ``informative`` (too few users for its noise).
    """
    family: str
    quantile: Optional[float]
    factor: Optional[float]
    fallback: int

    @property
    def empty_below(self) -> float:
        """The noise scales below which a bucket reads as empty (``gw``: GW-KT's)."""
        return ACTIVITY_EMPTY_BELOW if self.family == "gw" else AUTO_EMPTY_BELOW

    def informative(self, estimate: ScaleEstimate) -> bool:
        """Whether ``estimate`` holds enough users, at this rule's floor, to be read."""
        return estimate.holds_enough_users(self.empty_below)

    def max_items(self, estimate: ScaleEstimate, epsilon: float) -> int:
        """Δ0 from ``estimate`` (and, for ``gw``, the whole ε). Privacy: none beyond the
        estimate's (a function of DP output and public parameters)."""
        if not self.informative(estimate):
            return self.fallback
        if self.family == "gw":
            return max_items_from_estimate(estimate, epsilon)
        value = self.factor * estimate.activity_quantile(self.quantile, self.empty_below)
        return int(min(AUTO_MAX_ITEMS, max(1, math.floor(value + 0.5))))

    @property
    def largest(self) -> int:
        """The largest Δ0 this rule gives (``max_items`` is at most this)."""
        if self.family == "gw":
            return max(self.fallback, int(min(MAX_MAX_ITEMS, max(1, math.floor(
                CALIBRATED_WIDTH_RANGE[1] * self.fallback + 0.5)))))
        return max(self.fallback, AUTO_MAX_ITEMS)

    def text(self) -> str:
        if self.family == "gw":
            return "GW-KT's: the median activity / 1.5, within [1/4, 2] × (1 + 5ε)"
        return (f"{self.factor:g} × the {self.quantile:g}-quantile of the users' numbers of "
                f"distinct items (a bucket below {self.empty_below:g} noise scales read as "
                f"empty), rounded, in [1, {AUTO_MAX_ITEMS}]")


def auto_rule(name: str, epsilon: float) -> AutoRule:
    """The rule of mechanism ``name`` (``params.AUTO_FAMILIES``), with its fallback for an
    uninformative estimate (``params.DEFAULT_MAX_ITEMS``; gw: its ε rule)."""
    family = AUTO_FAMILIES.get(name)
    if family is None:
        raise ValueError(f"max_items_per_user {AUTO!r} is not available for {name!r}")
    if family == "gw":
        return AutoRule("gw", None, None, gw_default_max_items(epsilon))
    q, c = AUTO_RULES[family]
    return AutoRule(family, float(q), float(c), DEFAULT_MAX_ITEMS)


def zcdp_estimate_epsilon(rho: float) -> float:
    """The largest ε with ε²/2 ≤ ``rho`` in exact arithmetic: an ε-DP estimate is then
    ρ-zCDP (Bun and Steinke, Proposition 1.4)."""
    rho = cal.check_epsilon(rho, "rho")
    eps = math.sqrt(2.0 * rho)
    while Fraction(eps) ** 2 / 2 > Fraction(rho):
        eps = math.nextafter(eps, 0.0)
    return cal.check_epsilon(eps, "the estimate's epsilon")


class AutoBound:
    """A set-union mechanism whose Δ0 is chosen from the data: ``--max-items-per-user
    auto`` (build one with ``registry.make_mechanism(name, max_items='auto', ...)``).

    Args:
      name: the registered mechanism's name (``params.AUTO_FAMILIES``).
      build: ``build(max_items, epsilon, delta, rho) -> Mechanism``: the mechanism at a
        Δ0 and a budget (the registry's builder with the user's other parameters;
        exactly one of epsilon and rho is not None).
      epsilon, delta: the whole (ε, δ) stated; or, with ``rho``, epsilon None and delta
        the approximate-zCDP δ.
      share: the share s in (0, 1) of ε (of ρ) spent on the estimate (default
        ``params.DEFAULT_AUTO_SHARE``). Privacy: the estimate is ε₁ = s·ε-DP; the
        release gets what the composition leaves (``composition``): ε − ε₁ (basic); a
        Gaussian release the largest ε′ whose Gaussian after the estimate is still within
        (ε, δ), about ε − ε₁²-order (tight, section 12 of docs/mechanisms.md); a zCDP
        release (``sips``) ρ − ε₁²/2. With ρ: the estimate is ε₁-DP with ε₁²/2 ≤ s·ρ, so
        s·ρ-zCDP; the release runs at ρ − s·ρ; zCDP composes by adding ρ.
      rho: ρ of a zCDP-calibrated mechanism (``weighted-gaussian``, ``sips``), or None.

    ``calibrated(estimate)`` gives the mechanism to run (Beam or ``run_local``):
    the release at (ε₂, δ₂) with the rule's Δ0, its guarantee restated as the whole (ε,
    δ), its ``describe()`` stating the share, the rule and Δ0, never the estimate.
    ``run_local`` estimates first. In a Beam pipeline, ``transforms.activity.calibrate``
    releases the estimate (a small pipeline of its own, on your input) and returns the
    calibrated mechanism to give ``SelectPartitions``.
    """

    needs_calibration = True
    ranked = False
    #: (ε_G of the whole ε, ε′_G of the release) on the tight Gaussian route, else None.
    _gaussian_epsilons = None

    def __init__(self, name: str, build: Callable[..., Mechanism],
                 epsilon: Optional[float], delta: float, share: Optional[float] = None,
                 rho: Optional[float] = None):
        self.name = name
        delta = cal.check_delta(delta)
        share = DEFAULT_AUTO_SHARE if share is None else share
        self.calibration_share = float(share)
        self._build = build
        self._rho = self.calibration_rho = self._release_epsilon = None
        if rho is not None:
            if epsilon is not None:
                raise ValueError("give epsilon or rho, not both")
            self._zcdp(cal.check_epsilon(rho, "rho"), delta, share)
        else:
            epsilon = cal.check_epsilon(epsilon)
            self.calibration_epsilon, basic = cal.split_epsilon(epsilon, share)
            check_estimate_epsilon(self.calibration_epsilon)
            self._release_delta = estimate_delta_room(delta, self.calibration_epsilon)
            self._release_epsilon = basic
            at_basic = self._release(DEFAULT_MAX_ITEMS)  # the release at ε − ε₁
            kind = at_basic.composition
            if not (kind == "zcdp" and self._zcdp_from_dp(epsilon, delta, at_basic.rho)):
                if kind == "gaussian":
                    self._gaussian(epsilon, basic, type(at_basic).gaussian_epsilon_of)
                self.guarantee = PrivacyGuarantee(epsilon, delta, note=self._note())
        self.rule = auto_rule(name, self.guarantee.epsilon)
        # Built now at the largest Δ0 the rule can give (what a Δ0 limits, e.g. δ's
        # resolution over Δ0 items, holds for every smaller one) and at the fallback:
        # every parameter is refused here, not after the estimate.
        self._release(self.rule.largest)
        self._probe = self._release(self.rule.fallback)
        self.layout = AUTO_LAYOUT
        self.proven = getattr(self._probe, "proven", True)
        self.needs_record_order = getattr(self._probe, "needs_record_order", False)

    def _zcdp(self, rho: float, delta: float, share: float) -> None:
        """``--rho``: the share is of ρ; the estimate's ε₁ is the largest with ε₁²/2 ≤ s·ρ."""
        rho_estimate, self._rho = cal.split_epsilon(rho, share)
        self.calibration_rho = rho_estimate
        self.calibration_epsilon = zcdp_estimate_epsilon(rho_estimate)
        check_estimate_epsilon(self.calibration_epsilon)
        self._release_delta = estimate_delta_room(delta, self.calibration_epsilon)
        self.guarantee = zcdp_guarantee(
            rho, delta, note=f"{delta:g}-approximate {rho:g}-zCDP: the activity "
            f"estimate's {self.calibration_epsilon:.6g}-DP (so {rho_estimate:.6g}-zCDP; its "
            f"samplers' tail within δ) and the release's {self._rho:.6g}-zCDP at the Δ0 it "
            f"chose, composed; converted to (ε, δ)-DP at δ = 2·{delta:g} (DP-SIPS Corollary 9)")

    def _zcdp_from_dp(self, epsilon: float, delta: float, basic_rho: float) -> bool:
        """A zCDP release stated in (ε, δ) (``Sips.from_dp``): ρ = dp_to_zcdp_rho(ε, δ, δ/2);
        the estimate takes ρ₁ ≥ ε₁²/2 of it (ε₁ = s·ε) and its tail of the zCDP δ/2. False
        (nothing set) where the release at ε − ε₁ has the larger ρ (``basic_rho``)."""
        e1 = self.calibration_epsilon
        rho = dp_to_zcdp_rho(epsilon, delta, delta / 2.0)
        rho_estimate = float_up(Fraction(e1) ** 2 / 2)
        release_rho = float_down(Fraction(rho) - Fraction(rho_estimate))
        if not release_rho > basic_rho:
            return False   # a large share: ε − ε₁ (basic composition) leaves more
        self.calibration_rho, self._rho, self._release_epsilon = rho_estimate, release_rho, None
        self._release_delta = estimate_delta_room(delta / 2.0, e1)
        self.guarantee = PrivacyGuarantee(
            epsilon, delta, rho=rho, zcdp_delta=delta / 2.0,
            note=f"{delta / 2:g}-approximate {rho:.6g}-zCDP (the largest ρ whose conversion, "
                 f"DP-SIPS Corollary 9, gives ({epsilon:g}, {delta:g})-DP): the activity "
                 f"estimate's {e1:.6g}-DP, so {rho_estimate:.6g}-zCDP (its samplers' tail "
                 f"within δ/2), and the release's {release_rho:.6g}-zCDP at the Δ0 it chose")
        return True

    def _gaussian(self, epsilon: float, basic: float,
                  of: Callable[[float, float], float]) -> None:
        """A release whose noise is one Gaussian (``Mechanism.composition``): built at the
        largest ε′ whose Gaussian, after the estimate, is (ε_G, δ₂/2)-DP at the whole ε's
        ε_G (``calibration.gaussian_epsilon_after_estimate``; ``of``: the release's
        ``gaussian_epsilon_of``); never below ε − ε₁ (``basic``)."""
        e1, half = self.calibration_epsilon, self._release_delta / 2.0
        target = of(epsilon, self._release_delta)
        if not e1 < target:
            return
        tight = cal.gaussian_epsilon_after_estimate(target, half, e1)
        if tight is None:
            return
        release = tight + (epsilon - target)
        while release > 0 and of(release, self._release_delta) > tight:
            release = math.nextafter(release, 0.0)
        if release > basic:
            self._release_epsilon = release
            self._gaussian_epsilons = (target, tight)

    def _note(self) -> str:
        e1, e2, d2 = self.calibration_epsilon, self._release_epsilon, self._release_delta
        if self._gaussian_epsilons is None:
            return (f"(ε, δ)-DP: basic composition of the activity estimate's {e1:.6g}-DP (up "
                    f"to its samplers' tail, within δ) and the release's ({e2:.6g}, "
                    f"{d2:g})-DP at the Δ0 it chose")
        target, tight = self._gaussian_epsilons
        return (f"(ε, δ)-DP: the activity estimate's {e1:.6g}-DP (up to its samplers' tail, "
                f"within δ), then the release at ({e2:.6g}, {d2:g}) at the Δ0 it chose, "
                f"whose noise is one Gaussian of σ = AGM({tight:.6g}, {d2 / 2:g}, Δ2): an "
                f"ε₁-DP stage is dominated by randomized response, and the pair's δ at "
                f"{target:.6g} is p·δ_σ(ε − ε₁) + (1 − p)·δ_σ(ε + ε₁) ≤ {d2 / 2:g}; the "
                f"other {d2 / 2:g} bounds an added user's new items")

    @property
    def composition(self) -> str:
        """How the estimate and the release compose (``Mechanism.composition``):
        ``'basic'``, ``'gaussian'`` (tight, on the release's Gaussian) or ``'zcdp'``."""
        if self._rho is not None:
            return "zcdp"
        return "basic" if self._gaussian_epsilons is None else "gaussian"

    def _release(self, max_items: int) -> Mechanism:
        """The release stage at ``max_items``: the rest of the budget."""
        return self._build(max_items, self._release_epsilon, self._release_delta, self._rho)

    def release_at(self, max_items: int) -> Mechanism:
        """The mechanism ``calibrated`` runs when the rule gives Δ0 = ``max_items``: the
        release at the rest of the budget, its guarantee the whole (ε, δ)."""
        mechanism = copy.copy(self._release(cal.check_max_items(max_items)))
        mechanism.guarantee = self.guarantee
        return mechanism

    @property
    def max_items(self) -> str:
        return AUTO

    def calibrated(self, estimate: ScaleEstimate) -> Mechanism:
        """The mechanism to run: the release at the rest of the budget with Δ0 =
        ``rule.max_items(estimate)``; its guarantee is this one (the whole (ε, δ))."""
        if not isinstance(estimate, ScaleEstimate) or estimate.layout != self.layout or \
                not estimate.epsilon <= self.calibration_epsilon:
            raise ValueError(f"the estimate must be a ScaleEstimate of {self.layout} released "
                             f"with at most ε = {self.calibration_epsilon:.6g}, got {estimate!r}")
        max_items = self.rule.max_items(estimate, self.guarantee.epsilon)
        mechanism = self.release_at(max_items)
        mechanism.max_items_choice = self._choice(max_items, self.rule.informative(estimate))
        return mechanism

    def estimate(self, histogram, run_key: RunKey) -> ScaleEstimate:
        """``histogram`` (exact, ``AUTO_LAYOUT``'s buckets) released at the share's ε under
        ``run_key`` (purpose ``activity``)."""
        return release_scale(histogram, self.calibration_epsilon, RunKey.resolve(run_key),
                             AUTO_BUCKET_BASE, ESTIMATE_PURPOSE)

    def calibrated_on(self, per_user: Mapping[Any, Mapping], run_key: RunKey) -> Mechanism:
        """``calibrated`` with the estimate of ``per_user`` released under ``run_key``."""
        return self.calibrated(self.estimate(scale_statistics(per_user.values(), self.layout),
                                             run_key))

    def run_local(self, per_user: Mapping[Any, Mapping], run_key: RunKey):
        """The Beam-free run: the estimate, then the calibrated mechanism's release."""
        run_key = RunKey.resolve(run_key)
        return self.calibrated_on(per_user, run_key).run_local(per_user, run_key)

    def _choice(self, max_items, informative: bool) -> Dict[str, Any]:
        return {"share": self.calibration_share, "epsilon": self.calibration_epsilon,
                "composition": self.composition,
                "rule": self.rule.text() if informative else
                f"the estimate held too few users for its noise: the fallback Δ0 "
                f"{self.rule.fallback}",
                "max_items_per_user": max_items}

    def describe(self) -> Dict[str, Any]:
        """The statement before the estimate: the mechanism at the fallback Δ0, with
        ``max_items_per_user`` 'auto' and the choice's share and rule."""
        d = self._probe.describe()
        g = self.guarantee
        d.update({"epsilon": g.epsilon, "delta": g.delta, "rho": g.rho,
                  "zcdp_delta": g.zcdp_delta, "guarantee": g.note,
                  "max_items_per_user": AUTO,
                  "max_items_choice": {"share": self.calibration_share,
                                       "epsilon": self.calibration_epsilon,
                                       "composition": self.composition,
                                       "rule": self.rule.text(), "max_items_per_user": None}})
        return d

    def __repr__(self) -> str:
        g = self.guarantee
        return f"<AutoBound {self.name}: Δ0 auto, ε={g.epsilon:.6g}, δ={g.delta:.3g}>"
