"""Complete set-union mechanisms, each composed from the building blocks.

A mechanism object is cheap to build and validates its parameters in the
constructor (so a bad ε fails when the pipeline is constructed, not inside a
worker). Before anything runs it states:

* ``guarantee``: a ``PrivacyGuarantee`` (ε, δ, and ρ for zCDP mechanisms);
* ``calibration``: the threshold(s), the noise kind and scale, Δ0 and the
  weighting;
* ``describe()``: both as a JSON-ready dict.

``mechanism.expand_per_user(per_user, run_key)`` applies it to a PCollection
of ``(user_id, {item: count})``; ``SelectPartitions(mechanism)`` applies it to
``(user_id, item)`` occurrences. ``beam_dpsu.core.run_local`` runs the same
code without Beam.

The histogram-and-threshold family (specification section 2):

=====================  ========  ==============  ===========  ======================
mechanism              bounding  user adds       noise        guarantee
=====================  ========  ==============  ===========  ======================
TruncatedGeometric     Δ0        +1              keep w.p.    (ε, δ)-DP
                                                 p(n)
CountLaplace           Δ0        +1              Lap(Δ0/ε)    (ε, δ)-DP
CountGaussian          Δ0        +1              AGM(√Δ0)     (ε, δ)-DP
WeightedLaplace        Δ0        1/|W̄|           Lap(1/ε)     (ε, δ)-DP
WeightedGaussian       Δ0        1/√|W̄|          AGM(1)       (ε, δ)-DP
WeightedGaussianZcdp   Δ0        1/√|W̄|          1/√(2ρ)      δ-approx. ρ-zCDP
=====================  ========  ==============  ===========  ======================
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional

import apache_beam as beam

from beam_dpsu import calibration as cal
from beam_dpsu import keys
from beam_dpsu.accounting import PrivacyGuarantee, zcdp_guarantee
from beam_dpsu.bounding import PerUserItemCounts, SampleItems
from beam_dpsu.histogram import ShardedHistogram, check_weighting
from beam_dpsu.noise import RunKey
from beam_dpsu.threshold import ApplyReleaseRule, NoisyThresholdRule, TruncatedGeometricRule


@dataclasses.dataclass(frozen=True)
class RoundCalibration:
    """The calibration of one histogram-and-threshold round.

    Attributes:
      threshold: T (None for the truncated geometric, which has no threshold).
      noise: ``'laplace'``, ``'gaussian'`` or ``'truncated-geometric'``.
      noise_scale: λ (Laplace) or σ (Gaussian); None for the truncated geometric.
      max_items: Δ0, or None when the mechanism does not sample.
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


class Mechanism:
    """Base class: a named, calibrated set-union mechanism."""

    name: str = ""
    guarantee: PrivacyGuarantee
    rounds: List[RoundCalibration]
    #: True when the mechanism reads the iteration order of each user's
    #: ``{item: count}`` as the user's record order (GW with
    #: ``tie_break='first-occurrence'``); the input must then come from
    #: ``ReadUserItems(keep_order=True)`` or ``core.per_user_counts``.
    needs_record_order: bool = False

    @property
    def calibration(self) -> RoundCalibration:
        """The calibration of the first (for one-round mechanisms, the only) round."""
        return self.rounds[0]

    @property
    def max_items(self) -> Optional[int]:
        return self.rounds[0].max_items

    def describe(self) -> Dict[str, Any]:
        """JSON-ready statement of the guarantee and calibration."""
        g = self.guarantee
        return {
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
        }

    def expand_per_user(self, per_user: beam.PCollection, run_key: RunKey) -> beam.PCollection:
        raise NotImplementedError

    def __repr__(self) -> str:
        g = self.guarantee
        return f"<{type(self).__name__} {self.name}: ε={g.epsilon:.6g}, δ={g.delta:.3g}>"


class HistogramMechanism(Mechanism):
    """One round of: sample to Δ0, weighted histogram, release rule.

    Subclasses only compute the calibration; ``release_rule`` turns it into the
    rule applied to each item. Users with no items are ignored.
    """

    def __init__(self, name: str, guarantee: PrivacyGuarantee, round_: RoundCalibration):
        self.name = name
        self.guarantee = guarantee
        self.rounds = [round_]
        check_weighting(round_.weighting)

    def release_rule(self, run_key: RunKey, purpose: str = "noise/0") -> Callable[[Any, float], bool]:
        r = self.calibration
        return NoisyThresholdRule(r.noise, r.noise_scale, r.threshold, run_key, purpose)

    def expand_per_user(self, per_user, run_key):
        r = self.calibration
        return (per_user
                | "SampleItems" >> SampleItems(r.max_items, run_key, "sample/0")
                | "Histogram" >> ShardedHistogram(r.weighting)
                | "Release" >> ApplyReleaseRule(self.release_rule, run_key, sharded=True))


class TruncatedGeometric(HistogramMechanism):
    """Truncated geometric ("magic") partition selection (Desfontaines, Voss, Gipson).

    Each user keeps at most Δ0 distinct items; an item with ``n`` users is kept
    with probability ``p(n)``, the optimal (ε/Δ0, δ_Δ0)-DP keep probability.

    Args:
      epsilon: ε > 0 of the (ε, δ)-DP guarantee.
      delta: 0 < δ < 1.
      max_items: Δ0 ≥ 1, distinct items kept per user (default 100).
    """

    def __init__(self, epsilon: float, delta: float, max_items: int = 100):
        epsilon, delta = cal.check_epsilon(epsilon), cal.check_delta(delta)
        max_items = cal.check_max_items(max_items)
        self.epsilon, self.delta = epsilon, delta
        super().__init__(
            "truncated-geometric",
            PrivacyGuarantee(epsilon, delta, note="(ε, δ)-DP"),
            RoundCalibration(None, "truncated-geometric", None, max_items, "count"))

    def release_rule(self, run_key, purpose="noise/0"):
        return TruncatedGeometricRule(self.epsilon, self.delta, self.max_items, run_key, purpose)


class CountLaplace(HistogramMechanism):
    """Laplace thresholding of distinct-user counts (PipelineDP's Laplace thresholding).

    Each user keeps at most Δ0 distinct items and adds 1 to each; noise
    Lap(Δ0/ε); threshold ``1 + λ·log(1/(2δ_Δ0))``.

    Args:
      epsilon: ε > 0. delta: 0 < δ < 1. max_items: Δ0 ≥ 1 (default 100).
    """

    def __init__(self, epsilon: float, delta: float, max_items: int = 100):
        lam = cal.count_laplace_scale(epsilon, max_items)
        t = cal.count_laplace_threshold(epsilon, delta, max_items)
        super().__init__("count-laplace",
                         PrivacyGuarantee(float(epsilon), float(delta), note="(ε, δ)-DP"),
                         RoundCalibration(t, "laplace", lam, int(max_items), "count"))


class CountGaussian(HistogramMechanism):
    """Gaussian thresholding of distinct-user counts (PipelineDP's Gaussian thresholding).

    Each user keeps at most Δ0 distinct items and adds 1 to each; noise
    N(0, σ²) with σ = AGM(ε, δ/2, √Δ0); threshold ``1 + σ·Φ⁻¹(1 − δ'_Δ0)``.

    Args:
      epsilon: ε > 0. delta: 0 < δ < 1. max_items: Δ0 ≥ 1 (default 100).
    """

    def __init__(self, epsilon: float, delta: float, max_items: int = 100):
        sigma = cal.count_gaussian_sigma(epsilon, delta, max_items)
        t = cal.count_gaussian_threshold(epsilon, delta, max_items)
        super().__init__("count-gaussian",
                         PrivacyGuarantee(float(epsilon), float(delta), note="(ε, δ)-DP"),
                         RoundCalibration(t, "gaussian", sigma, int(max_items), "count"))


class WeightedLaplace(HistogramMechanism):
    """Weighted Laplace (Gopi et al.): each user spreads ℓ1 budget 1 evenly.

    Args:
      epsilon: ε > 0. delta: 0 < δ < 1. max_items: Δ0 ≥ 1 (default 100).
    """

    def __init__(self, epsilon: float, delta: float, max_items: int = 100):
        lam = cal.weighted_laplace_scale(epsilon)
        t = cal.weighted_laplace_threshold(epsilon, delta, max_items)
        super().__init__("weighted-laplace",
                         PrivacyGuarantee(float(epsilon), float(delta), note="(ε, δ)-DP"),
                         RoundCalibration(t, "laplace", lam, int(max_items), "l1"))


class WeightedGaussian(HistogramMechanism):
    """Weighted Gaussian (Gopi et al.): each user spreads ℓ2 budget 1 evenly.

    σ = AGM(ε, δ/2, 1); threshold ``max_t [1/√t + σ·Φ⁻¹(1 − δ'_t)]``, δ' from δ/2.

    Args:
      epsilon: ε > 0. delta: 0 < δ < 1. max_items: Δ0 ≥ 1 (default 100).
    """

    def __init__(self, epsilon: float, delta: float, max_items: int = 100):
        sigma = cal.weighted_gaussian_sigma(epsilon, delta)
        t = cal.weighted_gaussian_threshold(epsilon, delta, max_items)
        super().__init__("weighted-gaussian",
                         PrivacyGuarantee(float(epsilon), float(delta), note="(ε, δ)-DP"),
                         RoundCalibration(t, "gaussian", sigma, int(max_items), "l2"))


class WeightedGaussianZcdp(HistogramMechanism):
    """Weighted Gaussian calibrated in zCDP (DP-SIPS Algorithm 2).

    σ = 1/√(2ρ); threshold ``max_k [1/√k + σ·Φ⁻¹(1 − δ_k)]`` with all of δ.
    Guarantee: δ-approximate ρ-zCDP, reported as (ε, 2δ)-DP by the conversion
    of ``accounting.zcdp_guarantee``.

    Args:
      rho: ρ > 0. delta: 0 < δ < 1/2 (the approximate-zCDP δ).
      max_items: Δ0 ≥ 1 (default 100).
    """

    def __init__(self, rho: float, delta: float, max_items: int = 100):
        sigma = cal.zcdp_weighted_gaussian_sigma(rho)
        t = cal.zcdp_weighted_gaussian_threshold(rho, delta, max_items)
        super().__init__("weighted-gaussian", zcdp_guarantee(rho, delta),
                         RoundCalibration(t, "gaussian", sigma, int(max_items), "l2",
                                          rho=float(rho), delta=float(delta)))


class SelectPartitions(beam.PTransform):
    """Differentially private set union of a PCollection of ``(user_id, item)``.

    Runs ``PerUserItemCounts`` and then the mechanism. The output is a
    PCollection of released items that carries no order: only the SET is
    covered by the guarantee. The order in which a runner produces the
    elements (and so the order of lines that ``WriteToText`` writes, and which
    shard an item lands in) can follow the input order and reveal which items
    the first users hold. To write a release, collect it (it is small next to
    the data), sort it (e.g. ``bounding.canonical_items``) and write ONE file,
    as ``pipelines.common.write_items`` does; never write this PCollection
    straight to a sharded sink.

    Args:
      mechanism: a calibrated ``Mechanism`` (e.g. ``WeightedGaussian(3, 1e-6)``).
      run_key: the run's ``RunKey``. None (the default) means a fresh key:
        its 32 bytes are drawn from the operating system on a worker when the
        pipeline runs and read by every step as a side input, so the secret is
        never part of the job graph that a runner stages (see
        ``beam_dpsu.keys``). Pass ``RunKey.from_test_seed(s)`` only in tests.
      per_user: set True when the input is already ``(user_id, {item: count})``
        with one element per user (e.g. from ``textio.ReadUserItems``).

    Privacy: the mechanism's ``guarantee`` under add/remove-one-user
    neighbouring datasets, provided each user id identifies one person and
    ``run_key`` is secret and used for one release only.
    """

    def __init__(self, mechanism: Mechanism, run_key: Optional[RunKey] = None,
                 per_user: bool = False, label: Optional[str] = None):
        super().__init__(label)
        if not isinstance(mechanism, Mechanism):
            raise ValueError(f"mechanism must be a beam_dpsu Mechanism, got {mechanism!r}")
        if mechanism.needs_record_order and not per_user:
            raise ValueError(
                f"{mechanism.name} with tie_break='first-occurrence' needs each user's items "
                "in record order, which a PCollection of (user_id, item) pairs does not "
                "have; read with textio.ReadUserItems(pattern, keep_order=True) and pass "
                "per_user=True")
        self._mechanism = mechanism
        self._run_key = keys.for_pipeline(run_key)
        self._per_user = bool(per_user)

    def expand(self, pcoll):
        per_user = pcoll if self._per_user else pcoll | "PerUserItemCounts" >> PerUserItemCounts()
        return self._mechanism.expand_per_user(per_user, self._run_key)
