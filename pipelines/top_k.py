"""Checkout shim: the code lives in ``beam_dpsu.pipelines.top_k``.

Kept so that ``python -m pipelines.top_k`` and ``from pipelines import top_k``
work from a checkout; installs use the ``beam-dpsu`` console command.
"""
import sys

if __name__ == "__main__":
    from beam_dpsu import cli

    sys.exit(cli.run_module("top_k", sys.argv[1:]))
else:
    from beam_dpsu.pipelines import top_k as _module

    sys.modules[__name__] = _module  # one module object: patches and imports agree
