"""Checkout shim: the code lives in ``beam_dpsu.pipelines.top_k``.

Kept so that ``python -m pipelines.top_k`` and ``from pipelines import top_k``
work from a checkout; installs use the ``beam-dpsu`` console command.
"""
from pipelines import shim

shim(__name__, "top_k")
