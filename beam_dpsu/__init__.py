"""beam_dpsu: differentially private set union (partition selection) on Apache Beam.

Building blocks (each a PTransform, see their modules):
  bounding.PerUserItemCounts, bounding.SampleItems, histogram.WeightedHistogram,
  threshold.NoisyThreshold / threshold.ApplyReleaseRule, textio.ReadUserItems.
Complete mechanisms (the ``mechanisms`` package: one module per family on the
contract of ``mechanisms.base``) with their calibration stated up front,
applied with ``mechanisms.SelectPartitions``; ``core.run_local`` runs any of
them without Beam. Calibration and accounting are pure functions in
calibration and accounting; randomness is in noise.
"""
__version__ = "0.1.0"

from beam_dpsu.noise import RunKey  # noqa: E402,F401
