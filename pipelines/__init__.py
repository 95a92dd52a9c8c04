"""Checkout shims for the command-line pipelines, which live in ``beam_dpsu.pipelines``.

Not installed (``setup.py`` packages ``beam_dpsu`` only): an install gives the
``beam-dpsu`` console command instead.
"""

import importlib
import sys


def shim(name: str, module: str) -> None:
    """Makes the checkout module ``name`` (``pipelines.MODULE``) the real one.

    Imported, ``sys.modules[name]`` becomes ``beam_dpsu.pipelines.MODULE`` itself
    (one module object: patches and imports agree); run as ``python -m
    pipelines.MODULE``, it runs that command and exits with its status.
    """
    if name == "__main__":
        from beam_dpsu import cli
        cli.exit_process(cli.run_module(module, sys.argv[1:]))
    sys.modules[name] = importlib.import_module(f"beam_dpsu.pipelines.{module}")
