"""The contract every set-union mechanism fulfils, and the transform that applies one.

A mechanism object is cheap to build and validates its parameters in its
constructor (a bad ε fails when the pipeline is constructed, not inside a
worker). Side by side, every mechanism states or implements:

* ``guarantee``: a ``PrivacyGuarantee`` (ε, δ, and ρ for zCDP mechanisms),
  known before anything runs;
* ``rounds`` / ``calibration``: the threshold(s), noise kind and scale, Δ0
  and weighting of each round (``RoundCalibration``); ``describe()`` gives
  the guarantee and calibration as a JSON-ready dict;
* ``release_rule(run_key, round_index=0)``: the keyed rule
  ``rule(item, weight) -> bool`` that round ``round_index`` applies to each
  item of its histogram (its noise is drawn under the purpose
  ``'noise/<round_index>'``);
* ``run_local(per_user, run_key)``: the Beam-free run on an in-memory
  ``{user_id: {item: count}}`` mapping.

This layer never imports Beam. The Beam expansion of each family is
registered in ``beam_dpsu.transforms.expansion`` (``expand_mechanism``) and
applies the same per-user and per-item functions in the same order, so that
under the same ``RunKey`` it releases exactly what ``run_local`` returns
(``tests/test_pinned_releases.py`` and each family's tests check this). The guarantee of each family and its argument are in
``docs/mechanisms.md`` (sections 3-6); how to add a mechanism is in its
section 9.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Set

import numpy as np

from beam_dpsu.dp.privacy.accounting import PrivacyGuarantee
from beam_dpsu.dp.data.contribution import ItemCounts, canonical_per_user
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.randomness.release_rules import NoisyThresholdRule
from beam_dpsu.dp.mechanisms import units


__all__ = ["RoundCalibration", "noise_purpose", "Mechanism", "ThresholdMechanism", "decided", "released_items",
           "run_local"]


@dataclasses.dataclass(frozen=True)
class RoundCalibration:
    """The calibration of one histogram-and-threshold round.

    Attributes:
      threshold: T (None for the truncated geometric, which has no threshold).
      noise: ``'laplace'``, ``'gaussian'``, ``'truncated-geometric'`` or
        ``'gumbel'`` (top-k).
      noise_scale: λ (Laplace, Gumbel) or σ (Gaussian); None for the truncated
        geometric.
      max_items: Δ0, or None when the mechanism does not bound users.
      weighting: ``'count'``, ``'l1'`` or ``'l2'``.
      rho, delta: this round's zCDP budget, for zCDP mechanisms.
    """
    threshold: Optional[float]
    noise: str
    noise_scale: Optional[float]
    max_items: Optional[int]
    weighting: str
    rho: Optional[float] = None
    delta: Optional[float] = None


def noise_purpose(round_index: int) -> str:
    """The key purpose of round ``round_index``'s noise: ``'noise/<round_index>'``."""
    return f"noise/{round_index}"


class Mechanism:
    """Base class: a named, calibrated set-union mechanism (the contract above).

    Subclasses set ``name``, ``guarantee`` and ``rounds`` in their constructor
    and implement ``release_rule`` and ``run_local``; the family's Beam expansion is
    registered in ``beam_dpsu.transforms``.
    """

    name: str = ""
    guarantee: PrivacyGuarantee
    rounds: List[RoundCalibration]
    #: True when the mechanism reads the iteration order of each user's
    #: ``{item: count}`` as the user's record order (GW with
    #: ``tie_break='first-occurrence'``); the input must then come from
    #: ``ReadUserItems(keep_order=True)`` or ``dp.data.contribution.per_user_counts``.
    needs_record_order: bool = False
    #: False for a research variant whose privacy is NOT proven (the command
    #: line builds it only with ``--allow-unproven``).
    proven: bool = True
    #: True when the release is ranked rows ``(rank, item, ...)`` (top-k, hitting set)
    #: rather than a set of items; ``released_items`` gives the items either way.
    ranked: bool = False
    #: True for the policy mechanisms: a user's weight goes to its items still
    #: below the cutoff (``units.threshold_meaning`` words the threshold so).
    _policy_weights: bool = False
    #: With ``--max-items-per-user auto`` (``dp.mechanisms.auto_bound``): the share of ε
    #: the activity estimate spent, its ε, the rule and the Δ0 it chose (never the
    #: estimate itself); else None.
    max_items_choice: Optional[Dict[str, Any]] = None
    #: How the release composes after ``--max-items-per-user auto``'s ε₁-DP estimate
    #: (``dp.mechanisms.auto_bound``, docs/mechanisms.md section 12): ``'basic'`` (built at
    #: ε − ε₁); ``'gaussian'``: all its noise is one Gaussian mechanism (every stage
    #: together) of σ = AGM(``gaussian_epsilon_of(ε, δ)``, δ/2, Δ2), which its proof uses
    #: only as "the common items' part is (ε_G, δ/2)-DP", the other δ/2 bounding an added
    #: user's new items (built at the ε′ of ``calibration.gaussian_epsilon_after_estimate``);
    #: ``'zcdp'``: δ/2-approximate ρ-zCDP at ρ = ``dp_to_zcdp_rho(ε, δ, δ/2)`` (``Sips.
    #: from_dp``; the estimate takes ε₁²/2 of ρ).
    composition: str = "basic"

    @staticmethod
    def gaussian_epsilon_of(epsilon: float, delta: float) -> float:
        """ε_G of the Gaussian part of a ``'gaussian'`` mechanism built at (ε, δ)."""
        return epsilon

    @property
    def calibration(self) -> RoundCalibration:
        """The calibration of the first (for one-round mechanisms, the only) round."""
        return self.rounds[0]

    @property
    def max_items(self) -> Optional[int]:
        """Δ0 of the first round (None when the mechanism does not bound users)."""
        return self.rounds[0].max_items

    def describe(self) -> Dict[str, Any]:
        """JSON-ready statement of the guarantee and calibration."""
        g = self.guarantee
        d = {
            "mechanism": self.name,
            "epsilon": g.epsilon,
            "delta": g.delta,
            "rho": g.rho,
            "zcdp_delta": g.zcdp_delta,
            "guarantee": g.note,
            "threshold": [r.threshold for r in self.rounds],
            "noise": self.rounds[0].noise,
            "noise_scale": (self.rounds[0].noise_scale if len(self.rounds) == 1
                            else [r.noise_scale for r in self.rounds]),
            "max_items_per_user": self.max_items,
            "threshold_meaning": units.threshold_meaning(self.rounds, self._policy_weights),
            "units": units.set_union_units(self.rounds, self._policy_weights),
        }
        if self.max_items_choice is not None:
            d["max_items_choice"] = dict(self.max_items_choice)
            d["units"]["max_items_choice"] = units.MAX_ITEMS_CHOICE
        return d

    def threshold_for(self, epsilon: float, delta: float) -> float:
        """The threshold T this mechanism's calibration gives for another (ε, δ),
        every other parameter equal (the auditor's broken variants use it).

        Raises ValueError for a mechanism not calibrated from one (ε, δ).
        """
        raise ValueError(f"{self.name} is not calibrated from one (ε, δ)")

    def release_rule(self, run_key: RunKey, round_index: int = 0) -> Callable[[Any, float], bool]:
        """The keyed rule ``rule(item, weight) -> bool`` of round ``round_index``.

        Args:
          run_key: the run's key (the rule's noise derives from it).
          round_index: the 0-based round (default 0); the noise is drawn under
            ``noise_purpose(round_index)``, so rounds draw independent noise.
        """
        raise NotImplementedError(f"{type(self).__name__} has no per-item release rule")

    def run_local(self, per_user: Mapping[Any, ItemCounts], run_key: RunKey):
        """The Beam-free run: the release on ``{user_id: {item: count}}``.

        Returns the same release as the Beam expansion under the same
        ``run_key`` (a set of items; top-k: the ranked rows).
        """
        raise NotImplementedError(f"{type(self).__name__} has no Beam-free implementation")

    def __repr__(self) -> str:
        g = self.guarantee
        return f"<{type(self).__name__} {self.name}: ε={g.epsilon:.6g}, δ={g.delta:.3g}>"


class ThresholdMechanism(Mechanism):
    """A one-round mechanism: a histogram decided item by item by the release rule.

    Subclasses implement ``histogram_local`` (the finished histogram on
    in-memory data, as their Beam expansion computes it) and
    register their Beam expansion; the release rule (noise and threshold T of the
    calibration) and the Beam-free run are shared.
    """

    def release_rule(self, run_key: RunKey, round_index: int = 0) -> Callable[[Any, float], bool]:
        r = self.rounds[round_index]
        return NoisyThresholdRule(r.noise, r.noise_scale, r.threshold, run_key,
                                  noise_purpose(round_index))

    def histogram_local(self, per_user: Mapping[Any, ItemCounts], run_key: RunKey
                        ) -> Dict[Any, float]:
        """The finished histogram ``{item: weight}`` on in-memory data (not private)."""
        raise NotImplementedError

    def run_local(self, per_user: Mapping[Any, ItemCounts], run_key: RunKey) -> Set[Any]:
        """The released set on in-memory data: the Beam expansion without Beam."""
        run_key = RunKey.resolve(run_key)
        return decided(self.release_rule(run_key), self.histogram_local(per_user, run_key))


def decided(rule, histogram: Mapping[Any, float]) -> Set[Any]:
    """The items of ``{item: weight}`` that ``rule`` releases (one vectorised
    ``rule.decide`` over the whole histogram, as the Beam transforms decide a shard)."""
    items = list(histogram)
    if not items:
        return set()
    weights = np.fromiter(histogram.values(), np.float64, len(items))
    return {items[i] for i in np.flatnonzero(rule.decide(items, weights)).tolist()}


def released_items(mechanism: Mechanism, release) -> set:
    """The set of items a release holds: the release itself, or the items of its
    ranked rows ``(rank, item, ...)`` when ``mechanism.ranked``."""
    return {row[1] for row in release} if mechanism.ranked else set(release)


def run_local(per_user: Mapping[Any, ItemCounts], mechanism: Mechanism,
              run_key: RunKey = None):
    """The release of a mechanism on in-memory per-user data (``mechanism.run_local``).

    Args:
      per_user: ``{user_id: {item: count}}`` (see ``per_user_counts``); user ids and
        items must be of the accepted types (``contribution.canonical_id``: a refused
        type raises ``IdTypeError``; numpy integers are converted).
      mechanism: a calibrated mechanism.
      run_key: the run's key; None (default) draws a fresh OS-random key.
    Returns:
      the released set (top-k: the ranked rows).
    """
    return mechanism.run_local(canonical_per_user(per_user), RunKey.resolve(run_key))
