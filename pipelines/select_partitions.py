"""Checkout shim: the code lives in ``beam_dpsu.pipelines.select_partitions``.

Kept so that ``python -m pipelines.select_partitions`` and ``from pipelines import select_partitions``
work from a checkout; installs use the ``beam-dpsu`` console command.
"""
from pipelines import shim

shim(__name__, "select_partitions")
