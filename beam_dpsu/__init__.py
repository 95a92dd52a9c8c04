"""beam_dpsu: differentially private set union (partition selection) on Apache Beam.

Three layers, each a package (``docs/architecture.md``):

* ``beam_dpsu.dp``: the pure core (no Beam): noise, calibration, accounting,
  contribution bounding, release rules and the mechanisms with their
  guarantee and Beam-free run;
* ``beam_dpsu.transforms``: the Beam PTransforms over it (``ReadUserItems``,
  ``SelectPartitions``, ``TopK``, ``WriteRelease``, the building blocks);
* ``beam_dpsu.pipelines``: the ``beam-dpsu`` command line.

Every public name is imported from the module that defines it.
"""
__all__ = ["__version__"]

__version__ = "0.1.0"
