"""Checkout shim: the code lives in ``beam_dpsu.pipelines.select_partitions``.

Kept so that ``python -m pipelines.select_partitions`` and ``from pipelines import select_partitions``
work from a checkout; installs use the ``beam-dpsu`` console command.
"""
import sys

if __name__ == "__main__":
    from beam_dpsu import cli

    sys.exit(cli.run_module("select_partitions", sys.argv[1:]))
else:
    from beam_dpsu.pipelines import select_partitions as _module

    sys.modules[__name__] = _module  # one module object: patches and imports agree
