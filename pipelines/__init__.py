"""Checkout shims for the command-line pipelines, which live in ``beam_dpsu.pipelines``.

Not installed (``setup.py`` packages ``beam_dpsu`` only): an install gives the
``beam-dpsu`` console command instead.
"""
