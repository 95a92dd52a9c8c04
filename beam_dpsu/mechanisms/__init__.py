"""The complete set-union mechanisms: one module per family on one contract.

Layout:

* ``base``: the contract every mechanism fulfils (``Mechanism``: guarantee,
  calibration, ``release_rule(run_key, round_index=0)``, the Beam expansion
  ``expand_per_user(per_user, run_key)`` and the Beam-free run
  ``run_local(per_user, run_key)``), ``RoundCalibration`` and
  ``SelectPartitions``, the transform that applies any mechanism;
* ``histogram``: the histogram-and-threshold family (TruncatedGeometric,
  CountLaplace, CountGaussian, WeightedLaplace, WeightedGaussian,
  WeightedGaussianZcdp);
* ``sips``: DP-SIPS (``Sips``, ``SipsRounds``);
* ``policy``: the sequential policies (PolicyLaplace, PolicyGaussian, GW,
  GWKT), run by the ``ordered.OrderedUserPolicy`` transform;
* ``topk``: top-k over an unknown domain (``TopKMechanism``, ``TopK``);
* ``params``: the declaration of every mechanism parameter (name, type,
  flag, help, default, privacy effect), from which the command-line tools
  build their flags and messages.

Names are registered for the command line in ``beam_dpsu.registry``. The
guarantees and their arguments are in ``docs/mechanisms.md``; how to add a
mechanism is in its section 9. The old import paths (``beam_dpsu.mechanisms``,
``beam_dpsu.sips``, ``beam_dpsu.topk``, ``beam_dpsu.ordered``) keep working.
"""
from beam_dpsu.mechanisms.base import (Mechanism, RoundCalibration,  # noqa: F401
                                       SelectPartitions, ThresholdMechanism)
from beam_dpsu.mechanisms.histogram import (CountGaussian, CountLaplace,  # noqa: F401
                                            HistogramMechanism, TruncatedGeometric,
                                            WeightedGaussian, WeightedGaussianZcdp,
                                            WeightedLaplace)

# The other families, importable from here too (loaded on first use).
_FAMILY_OF = {
    "Sips": "sips", "SipsRounds": "sips",
    "PolicyMechanism": "policy", "PolicyLaplace": "policy", "PolicyGaussian": "policy",
    "GW": "policy", "GWKT": "policy",
    "TopKMechanism": "topk", "TopK": "topk",
}


def __getattr__(name):
    family = _FAMILY_OF.get(name)
    if family is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"{__name__}.{family}"), name)
