"""Checkout shim: the code lives in ``beam_dpsu.pipelines.compare``.

Kept so that ``python -m pipelines.compare`` and ``from pipelines import compare``
work from a checkout; installs use the ``beam-dpsu`` console command.
"""
from pipelines import shim

shim(__name__, "compare")
