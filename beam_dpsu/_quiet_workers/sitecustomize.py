"""Beam worker processes started by our command lines: put on PYTHONPATH by
``beam_dpsu.pipelines.common.quiet_worker_processes``.

The DirectRunner's ``multi_processing`` mode starts ``python -m
apache_beam.runners.worker.sdk_worker_main`` subprocesses. Python imports this
module at their start-up; it acts only on the environment variables that
``quiet_worker_processes`` sets (and does nothing without them, also when
imported as ``beam_dpsu._quiet_workers.sitecustomize``):

* ``BEAM_DPSU_QUIET_WORKER=1`` (a command without ``--verbose``): the worker
  inherits our stderr and would log at INFO (plus Beam's import-time
  ``apitools`` warning); this gives the root logger a stderr handler for
  errors only (Beam's later ``basicConfig`` then adds none).
* ``BEAM_DPSU_QUICK_EXIT=1``: when the worker's main program has ended, the
  process exits at once (``os._exit``) after the exit handlers of every module
  imported later (grpc's, Beam's) have run, after ``logging.shutdown()`` and
  after flushing stdout and stderr, instead of tearing the interpreter down.
  The launcher stops its workers one after the other and waits for each
  process to end; the teardown of an interpreter that imported Beam took about
  0.3 s per worker, all of it after the run's last stage. The exit status is
  kept: 1 when the main program ended with an uncaught exception (Python's
  own status in that case), else 0. Nothing a worker writes is lost: Beam
  finishes and closes a bundle's outputs before it reports the bundle done,
  and the launcher stops the workers only after every bundle is done.
"""
import atexit
import logging
import os
import sys

if os.environ.get("BEAM_DPSU_QUIET_WORKER") == "1":
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setLevel(logging.ERROR)
    _handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logging.getLogger().addHandler(_handler)

if os.environ.get("BEAM_DPSU_QUICK_EXIT") == "1":
    _uncaught = []
    _excepthook = sys.excepthook

    def _note_uncaught(*exc_info):
        _uncaught.append(exc_info[0])
        _excepthook(*exc_info)

    def _quick_exit():
        # Registered first, so run last of the exit handlers (they run in
        # reverse order of registration): every later import's handler has run.
        try:
            logging.shutdown()
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
        finally:
            os._exit(1 if _uncaught else 0)

    sys.excepthook = _note_uncaught
    atexit.register(_quick_exit)
