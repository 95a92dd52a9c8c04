"""The complete set-union mechanisms: one module per family, on one contract.

* ``base``: the contract (``Mechanism``: guarantee, calibration,
  ``release_rule``, ``run_local``), ``RoundCalibration`` and ``run_local``;
* ``histogram_threshold``: one round of Δ0 sampling, weighted histogram and
  release rule (TruncatedGeometric, CountLaplace, CountGaussian,
  WeightedLaplace, WeightedGaussian, WeightedGaussianZcdp);
* ``sips``: DP-SIPS (``Sips``);
* ``adaptive``: adaptive weighting, one or two release rounds (``Adaptive``);
* ``policy``: the sequential policies (PolicyLaplace, PolicyGaussian, GW, GWKT);
* ``topk``: top-k over an unknown domain, limited domain (``TopKMechanism``);
* ``peeling``: discovery, then peeling: top-k (``DiscoverPeelTopK``) and
  k-hitting sets (``DiscoverPeelHittingSet``) over an unknown domain;
* ``registry``: every mechanism of the command line by name, built from its
  parameters (``dp.privacy.params`` declares them);
* ``budget``: a privacy budget split over the parts of one release;
* ``on_blocks``: a mechanism on the data path's blocks of arrays (the columnar path).

The group imports ``dp.privacy``, ``dp.randomness`` and ``dp.data``; only
``dp.evaluation`` imports it. Nothing here imports Beam: each family's Beam expansion is registered in
``beam_dpsu.transforms`` and applied by ``transforms.select.SelectPartitions``.
The guarantees and their arguments are in ``docs/mechanisms.md``.
"""
from beam_dpsu.dp.mechanisms.adaptive import Adaptive
from beam_dpsu.dp.mechanisms.base import Mechanism, RoundCalibration, ThresholdMechanism, run_local
from beam_dpsu.dp.mechanisms.histogram_threshold import (CountGaussian, CountLaplace,
                                                         HistogramMechanism, TruncatedGeometric,
                                                         WeightedGaussian, WeightedGaussianZcdp,
                                                         WeightedLaplace)
from beam_dpsu.dp.mechanisms.peeling import DiscoverPeelHittingSet, DiscoverPeelTopK
from beam_dpsu.dp.mechanisms.policy import GW, GWKT, PolicyGaussian, PolicyLaplace, PolicyMechanism
from beam_dpsu.dp.mechanisms.sips import Sips
from beam_dpsu.dp.mechanisms.topk import TopKMechanism

__all__ = [
    "Mechanism", "RoundCalibration", "ThresholdMechanism", "run_local",
    "HistogramMechanism", "TruncatedGeometric", "CountLaplace", "CountGaussian",
    "WeightedLaplace", "WeightedGaussian", "WeightedGaussianZcdp",
    "PolicyMechanism", "PolicyLaplace", "PolicyGaussian", "GW", "GWKT",
    "Sips", "Adaptive", "TopKMechanism", "DiscoverPeelTopK", "DiscoverPeelHittingSet",
]
