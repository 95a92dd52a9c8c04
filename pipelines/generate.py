"""Checkout shim: the code lives in ``beam_dpsu.pipelines.generate``.

Kept so that ``python -m pipelines.generate`` and ``from pipelines import generate``
work from a checkout; installs use the ``beam-dpsu`` console command.
"""
from pipelines import shim

shim(__name__, "generate")
