"""The histogram-and-threshold family (``docs/mechanisms.md`` section 3).

One round of: each user keeps at most Δ0 distinct items
(``dp.data.contribution.sample_items``), adds a weight to each (``histogram``), and a
keyed release rule (``threshold``) decides each item of the histogram. The
Beam expansion and the Beam-free run are the two methods of
``HistogramMechanism``, next to each other.

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

from typing import Any, Container, Dict, Mapping, Optional

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.privacy.accounting import PrivacyGuarantee, zcdp_guarantee
from beam_dpsu.dp.data.contribution import ItemCounts, sample_items
from beam_dpsu.dp.data.weights import add_user_to_histogram, check_weighting
from beam_dpsu.dp.mechanisms.base import RoundCalibration, ThresholdMechanism, noise_purpose
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.randomness.release_rules import TruncatedGeometricRule
from beam_dpsu.dp.privacy.params import DEFAULT_MAX_ITEMS

__all__ = ["remove_items", "round_histogram", "histogram_local", "HistogramMechanism",
           "TruncatedGeometric", "CountLaplace", "CountGaussian", "WeightedLaplace",
           "WeightedGaussian", "WeightedGaussianZcdp"]




def remove_items(counts: ItemCounts, released: Optional[Container]) -> ItemCounts:
    """A user's ``{item: count}`` without the released items (same dict if none)."""
    if not released:
        return counts
    if any(item in released for item in counts):
        return {item: c for item, c in counts.items() if item not in released}
    return counts


def round_histogram(per_user: Mapping[Any, ItemCounts], r: RoundCalibration, run_key: RunKey,
                    round_index: int = 0, released: Optional[Container] = None
                    ) -> Dict[Any, float]:
    """The weighted histogram of one round, as the Beam transforms compute it.

    Each user (without the items in ``released``, for DP-SIPS) keeps at most
    ``r.max_items`` items under ``run_key.subkey('sample/<round_index>')`` and
    adds ``r.weighting`` weights. Users left with no items are ignored.
    """
    key = run_key.subkey(f"sample/{round_index}")
    hist: Dict[Any, float] = {}
    for user, counts in per_user.items():
        counts = remove_items(counts, released)
        if not counts:
            continue
        kept = sample_items(user, counts, r.max_items, key) if r.max_items else counts
        add_user_to_histogram(hist, kept, r.weighting)
    return hist


def histogram_local(per_user: Mapping[Any, ItemCounts], mechanism: "HistogramMechanism",
                    run_key: RunKey, round_index: int = 0) -> Dict[Any, float]:
    """The weighted histogram of round ``round_index`` of ``mechanism`` (not private)."""
    return round_histogram(per_user, mechanism.rounds[round_index], run_key, round_index)


class HistogramMechanism(ThresholdMechanism):
    """One round of: sample to Δ0, weighted histogram, release rule.

    Subclasses only compute the calibration; ``release_rule`` turns it into the
    rule applied to each item. Users with no items are ignored.
    """

    def __init__(self, name: str, guarantee: PrivacyGuarantee, round_: RoundCalibration):
        self.name = name
        self.guarantee = guarantee
        self.rounds = [round_]
        check_weighting(round_.weighting)

    def histogram_local(self, per_user: Mapping[Any, ItemCounts], run_key: RunKey
                        ) -> Dict[Any, float]:
        """The finished histogram ``{item: weight}`` (not private)."""
        return histogram_local(per_user, self, run_key)


class _EpsilonDeltaHistogram(HistogramMechanism):
    """An (ε, δ)-DP histogram mechanism declared by its name, noise, weighting and
    the calibration functions ``scale(ε, δ, Δ0)`` and ``threshold(ε, δ, Δ0)``."""

    _name = ""
    _noise = ""
    _weighting = ""

    @staticmethod
    def _scale(epsilon, delta, max_items):
        raise NotImplementedError

    @staticmethod
    def _threshold(epsilon, delta, max_items):
        raise NotImplementedError

    @classmethod
    def calibrate(cls, epsilon: float, delta: float, max_items: int):
        """``(guarantee, round calibration)`` for (ε, δ) and Δ0 (validates them)."""
        scale = cls._scale(epsilon, delta, max_items)
        threshold = cls._threshold(epsilon, delta, max_items)
        return (PrivacyGuarantee(float(epsilon), float(delta), note="(ε, δ)-DP"),
                RoundCalibration(threshold, cls._noise, scale, int(max_items), cls._weighting))

    def __init__(self, epsilon: float, delta: float, max_items: int = DEFAULT_MAX_ITEMS):
        super().__init__(self._name, *self.calibrate(epsilon, delta, max_items))

    def threshold_for(self, epsilon: float, delta: float) -> float:
        return self._threshold(epsilon, delta, self.max_items)


class TruncatedGeometric(HistogramMechanism):
    """Truncated geometric ("magic") partition selection (Desfontaines, Voss, Gipson).

    Each user keeps at most Δ0 distinct items; an item with ``n`` users is kept
    with probability ``p(n)``, the optimal (ε/Δ0, δ_Δ0)-DP keep probability
    (``docs/mechanisms.md`` section 3, "Truncated geometric").

    Args:
      epsilon: ε > 0 of the (ε, δ)-DP guarantee.
      delta: 0 < δ < 1.
      max_items: Δ0 ≥ 1, distinct items kept per user (default 100). No effect
        on the guarantee; a larger Δ0 lowers every item's keep probability.
    """

    def __init__(self, epsilon: float, delta: float, max_items: int = DEFAULT_MAX_ITEMS):
        epsilon, delta = cal.check_epsilon(epsilon), cal.check_delta(delta)
        max_items = cal.check_max_items(max_items)
        cal.truncated_geometric_parameters(epsilon, delta, max_items)  # δ' resolvable
        self.epsilon, self.delta = epsilon, delta
        super().__init__(
            "truncated-geometric",
            PrivacyGuarantee(epsilon, delta, note="(ε, δ)-DP"),
            RoundCalibration(None, "truncated-geometric", None, max_items, "count"))

    def release_rule(self, run_key, round_index=0):
        return TruncatedGeometricRule(self.epsilon, self.delta, self.max_items, run_key,
                                      noise_purpose(round_index))


_EPS_DELTA_ARGS = """
    Args:
      epsilon: ε > 0 of the (ε, δ)-DP guarantee.
      delta: 0 < δ < 1.
      max_items: Δ0 ≥ 1, distinct items kept per user (default 100). No effect
        on the guarantee (the calibration accounts for it); a larger Δ0 keeps
        more of each user's items but raises the threshold.
"""


class CountLaplace(_EpsilonDeltaHistogram):
    __doc__ = """Laplace thresholding of distinct-user counts (PipelineDP's Laplace thresholding).

    Each user keeps at most Δ0 distinct items and adds 1 to each; noise
    Lap(Δ0/ε); threshold ``1 + λ·log(1/(2δ_Δ0))`` (``docs/mechanisms.md``
    section 3).
    """ + _EPS_DELTA_ARGS
    _name, _noise, _weighting = "count-laplace", "laplace", "count"
    _scale = staticmethod(lambda e, d, m: cal.count_laplace_scale(e, m))
    _threshold = staticmethod(cal.count_laplace_threshold)


class CountGaussian(_EpsilonDeltaHistogram):
    __doc__ = """Gaussian thresholding of distinct-user counts (PipelineDP's Gaussian thresholding).

    Each user keeps at most Δ0 distinct items and adds 1 to each; noise
    N(0, σ²) with σ = AGM(ε, δ/2, √Δ0); threshold ``1 + σ·Φ⁻¹(1 − δ'_Δ0)``
    (``docs/mechanisms.md`` section 3).
    """ + _EPS_DELTA_ARGS
    _name, _noise, _weighting = "count-gaussian", "gaussian", "count"
    composition = "gaussian"
    _scale = staticmethod(cal.count_gaussian_sigma)
    _threshold = staticmethod(cal.count_gaussian_threshold)


class WeightedLaplace(_EpsilonDeltaHistogram):
    __doc__ = """Weighted Laplace (Gopi et al.): each user spreads ℓ1 budget 1 evenly.

    λ = 1/ε; threshold ``max_t [1/t + λ·log(1/(2δ_t))]`` (``docs/mechanisms.md``
    section 3).
    """ + _EPS_DELTA_ARGS
    _name, _noise, _weighting = "weighted-laplace", "laplace", "l1"
    _scale = staticmethod(lambda e, d, m: cal.weighted_laplace_scale(e))
    _threshold = staticmethod(cal.weighted_laplace_threshold)


class WeightedGaussian(_EpsilonDeltaHistogram):
    __doc__ = """Weighted Gaussian (Gopi et al.): each user spreads ℓ2 budget 1 evenly.

    σ = AGM(ε, δ/2, 1); threshold ``max_t [1/√t + σ·Φ⁻¹(1 − δ'_t)]``, δ' from δ/2
    (``docs/mechanisms.md`` section 3).
    """ + _EPS_DELTA_ARGS
    _name, _noise, _weighting = "weighted-gaussian", "gaussian", "l2"
    composition = "gaussian"
    _scale = staticmethod(lambda e, d, m: cal.weighted_gaussian_sigma(e, d))
    _threshold = staticmethod(cal.weighted_gaussian_threshold)


class WeightedGaussianZcdp(HistogramMechanism):
    """Weighted Gaussian calibrated in zCDP (DP-SIPS Algorithm 2).

    σ = 1/√(2ρ); threshold ``max_k [1/√k + σ·Φ⁻¹(1 − δ_k)]`` with all of δ.
    Guarantee: δ-approximate ρ-zCDP, reported as (ε, 2δ)-DP by the conversion
    of ``accounting.zcdp_guarantee`` (``docs/mechanisms.md`` section 3).

    Args:
      rho: ρ > 0 of ρ-zCDP.
      delta: 0 < δ < 1/2, the approximate-zCDP δ.
      max_items: Δ0 ≥ 1 (default 100); no effect on the guarantee.
    """

    def __init__(self, rho: float, delta: float, max_items: int = DEFAULT_MAX_ITEMS):
        sigma = cal.zcdp_weighted_gaussian_sigma(rho)
        t = cal.zcdp_weighted_gaussian_threshold(rho, delta, max_items)
        super().__init__("weighted-gaussian", zcdp_guarantee(rho, delta),
                         RoundCalibration(t, "gaussian", sigma, int(max_items), "l2",
                                          rho=float(rho), delta=float(delta)))
