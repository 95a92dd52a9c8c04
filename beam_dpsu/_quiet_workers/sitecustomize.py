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
* ``BEAM_DPSU_QUICK_EXIT=<module>``: in a process started as ``python -m
  <module>`` (the variable's value; ``quiet_worker_processes`` names Beam's SDK
  worker), once the main program has ended, the process exits at once
  (``os._exit``) after the exit handlers of every module imported later
  (grpc's, Beam's) have run, after ``logging.shutdown()`` and after flushing
  stdout and stderr, instead of tearing the interpreter down. The launcher
  stops its workers one after the other and waits for each process to end; the
  teardown of an interpreter that imported Beam took about 0.3 s per worker,
  all of it after the run's last stage. The exit status is kept: 1 after an
  uncaught exception, the code given to the main thread's last ``sys.exit``
  (1, with the message on stderr, for a non-integer one), else 0. The
  variable is removed from the process's environment at start-up, so the
  processes it starts in turn (for example ``multiprocessing`` children) end
  as usual. Nothing a worker writes is lost: Beam finishes and closes a
  bundle's outputs before it reports the bundle done, and the launcher stops
  the workers only after every bundle is done.

When imported as the interpreter's ``sitecustomize``, it then runs the next
``sitecustomize`` found on ``sys.path`` (one of the environment's own), which
its place at the front of ``PYTHONPATH`` would otherwise hide.
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


def _main_module():
    """``M`` when this process was started as ``python ... -m M ...``, else None."""
    argv = list(getattr(sys, "orig_argv", ()))
    for k, arg in enumerate(argv[1:], 1):
        if arg == "-m" and k + 1 < len(argv):
            return argv[k + 1]
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if not arg.startswith("-"):  # the script (or -c's code) ends the options
            return None
    return None


def _exit_status(code) -> int:
    """The status Python gives ``sys.exit(code)``; prints a non-integer message."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:  # noqa: BLE001 (stderr gone: the status still says it)
        pass
    return 1


_QUICK = os.environ.pop("BEAM_DPSU_QUICK_EXIT", None)
if _QUICK and _main_module() == _QUICK:
    import threading
    _uncaught = []
    _exit_codes = []
    _excepthook = sys.excepthook
    _sys_exit = sys.exit

    def _note_uncaught(*exc_info):
        _uncaught.append(exc_info[0])
        _excepthook(*exc_info)

    def _note_exit(code=None):
        if threading.current_thread() is threading.main_thread():
            _exit_codes.append(code)  # (in another thread it ends that thread only)
        _sys_exit(code)

    def _quick_exit():
        # Registered first, so run last of the exit handlers (they run in
        # reverse order of registration): every later import's handler has run.
        status = 1 if _uncaught else 0
        try:
            if not _uncaught and _exit_codes:
                status = _exit_status(_exit_codes[-1])
            logging.shutdown()
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
        finally:
            os._exit(status)

    sys.excepthook = _note_uncaught
    sys.exit = _note_exit
    atexit.register(_quick_exit)


def _run_next_sitecustomize():
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or not spec.origin \
            or os.path.dirname(os.path.abspath(spec.origin)) == here:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    _run_next_sitecustomize()
