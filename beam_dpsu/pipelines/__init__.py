"""The command-line pipelines behind the ``beam-dpsu`` console command.

``select`` (``select_partitions``), ``top-k`` (``top_k``), ``compare``,
``generate``; ``common`` holds what they share. Each module's ``main(argv)``
is a complete command (``beam_dpsu.cli.main`` dispatches to it); the
top-level ``pipelines/`` of a checkout only re-exports them, so that
``python -m pipelines.select_partitions`` keeps working there.
"""
