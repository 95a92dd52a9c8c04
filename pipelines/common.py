"""Checkout shim: the code lives in ``beam_dpsu.pipelines.common``.

Kept so that ``from pipelines import common`` works from a checkout.
"""
import sys

from beam_dpsu.pipelines import common as _module

sys.modules[__name__] = _module  # one module object: patches and imports agree
