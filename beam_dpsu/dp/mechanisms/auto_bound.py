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
from beam_dpsu.dp.privacy.accounting import PrivacyGuarantee, zcdp_guarantee
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
        ``params.DEFAULT_AUTO_SHARE``). Privacy: the estimate is s·ε-DP, the release
        runs at ε − s·ε; the stated ε is their sum (basic composition). With ρ: the
        estimate is ε₁-DP with ε₁²/2 ≤ s·ρ, so s·ρ-zCDP; the release runs at ρ − s·ρ;
        zCDP composes by adding ρ.
      rho: ρ of a zCDP-calibrated mechanism (``weighted-gaussian``, ``sips``), or None.

    ``calibrated(estimate)`` gives the mechanism to run (Beam or ``run_local``):
    the release at (ε₂, δ₂) with the rule's Δ0, its guarantee restated as the whole (ε,
    δ), its ``describe()`` stating the share, the rule and Δ0, never the estimate.
    ``run_local`` estimates first. In a Beam pipeline, ``transforms.select.
    SelectPartitions`` runs both stages (the estimate reaches the release as a side input).
    """

    needs_calibration = True
    ranked = False

    def __init__(self, name: str, build: Callable[..., Mechanism],
                 epsilon: Optional[float], delta: float, share: Optional[float] = None,
                 rho: Optional[float] = None):
        self.name = name
        delta = cal.check_delta(delta)
        share = DEFAULT_AUTO_SHARE if share is None else share
        self.calibration_share = float(share)
        self._build = build
        self._rho = self.calibration_rho = None
        if rho is not None:
            if epsilon is not None:
                raise ValueError("give epsilon or rho, not both")
            rho_estimate, self._rho = cal.split_epsilon(cal.check_epsilon(rho, "rho"), share)
            self.calibration_rho = rho_estimate
            self.calibration_epsilon = zcdp_estimate_epsilon(rho_estimate)
            self._release_epsilon = None
        else:
            self.calibration_epsilon, self._release_epsilon = cal.split_epsilon(
                cal.check_epsilon(epsilon), share)
        check_estimate_epsilon(self.calibration_epsilon)
        self._release_delta = estimate_delta_room(delta, self.calibration_epsilon)
        if rho is not None:
            self.guarantee = zcdp_guarantee(
                rho, delta, note=f"{delta:g}-approximate {rho:g}-zCDP: the activity "
                f"estimate's {self.calibration_epsilon:.6g}-DP (so "
                f"{rho_estimate:.6g}-zCDP; its samplers' tail within δ) and the "
                f"release's {self._rho:.6g}-zCDP at the Δ0 it chose, composed; converted "
                f"to (ε, δ)-DP at δ = 2·{delta:g} (DP-SIPS Corollary 9)")
        else:
            self.guarantee = PrivacyGuarantee(
                cal.check_epsilon(epsilon), delta,
                note=f"(ε, δ)-DP: basic composition of the activity estimate's "
                     f"{self.calibration_epsilon:.6g}-DP (up to its samplers' tail, "
                     f"within δ) and the release's ({self._release_epsilon:.6g}, "
                     f"{self._release_delta:g})-DP at the Δ0 it chose")
        self.rule = auto_rule(name, self.guarantee.epsilon)
        # Built now at the largest Δ0 the rule can give (what a Δ0 limits, e.g. δ's
        # resolution over Δ0 items, holds for every smaller one) and at the fallback:
        # every parameter is refused here, not after the estimate.
        self._release(self.rule.largest)
        self._probe = self._release(self.rule.fallback)
        self.layout = AUTO_LAYOUT
        self.proven = getattr(self._probe, "proven", True)
        self.needs_record_order = getattr(self._probe, "needs_record_order", False)

    def _release(self, max_items: int) -> Mechanism:
        """The release stage at ``max_items``: the rest of the budget."""
        return self._build(max_items, self._release_epsilon, self._release_delta, self._rho)

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
        mechanism = copy.copy(self._release(max_items))
        mechanism.guarantee = self.guarantee
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
                                       "rule": self.rule.text(), "max_items_per_user": None}})
        return d

    def __repr__(self) -> str:
        g = self.guarantee
        return f"<AutoBound {self.name}: Δ0 auto, ε={g.epsilon:.6g}, δ={g.delta:.3g}>"
