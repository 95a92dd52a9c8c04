"""The runnable pipelines, as plain entry points: ``python -m pipelines.NAME [FLAGS]``.

Each module here runs the command-line pipeline of the installed package
(``beam_dpsu.pipelines``), the same code as ``beam-dpsu COMMAND``: run them
locally, or submit them to Flink or Dataflow with Beam's ``--runner`` flags.
This folder is not installed (``setup.py`` packages ``beam_dpsu`` only).
"""
