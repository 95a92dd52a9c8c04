"""Quiet Beam worker processes: put on PYTHONPATH by ``beam_dpsu.pipelines.common``.

The DirectRunner's ``multi_processing`` mode starts ``python -m
apache_beam.runners.worker.sdk_worker_main`` subprocesses that inherit our
stderr and log at INFO (plus Beam's import-time ``apitools`` warning). While a
command runs without ``--verbose``, ``run_pipeline`` prepends this directory to
``PYTHONPATH`` and sets ``BEAM_DPSU_QUIET_WORKER=1``: Python imports this
module at start-up, which gives the root logger a stderr handler for errors
only (Beam's later ``basicConfig`` then adds none). Without that variable it
does nothing (also when imported as ``beam_dpsu._quiet_workers.sitecustomize``).
"""
import logging
import os
import sys

if os.environ.get("BEAM_DPSU_QUIET_WORKER") == "1":
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setLevel(logging.ERROR)
    _handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logging.getLogger().addHandler(_handler)
