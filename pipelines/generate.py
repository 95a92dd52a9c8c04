"""Checkout shim: the code lives in ``beam_dpsu.pipelines.generate``.

Kept so that ``python -m pipelines.generate`` and ``from pipelines import generate``
work from a checkout; installs use the ``beam-dpsu`` console command.
"""
import sys

if __name__ == "__main__":
    from beam_dpsu import cli

    sys.exit(cli.run_module("generate", sys.argv[1:]))
else:
    from beam_dpsu.pipelines import generate as _module

    sys.modules[__name__] = _module  # one module object: patches and imports agree
