"""The start-up module of the worker processes our command lines start
(``beam_dpsu/_quiet_workers/sitecustomize.py``) and the environment
``quiet_worker_processes`` gives them."""
import os
import subprocess
import sys

import pytest

from beam_dpsu.pipelines import common

SITE = common._QUIET_WORKERS


def _run(code, **env):
    full = {k: v for k, v in os.environ.items()
            if k not in common.quiet_worker_processes.VARIABLES}
    full.update(PYTHONPATH=SITE, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, timeout=120)


# An exit handler registered after start-up (as grpc's and Beam's are) prints a
# line, and an object's finalizer prints another when the interpreter tears down.
PROGRAM = r"""
import atexit, sys
atexit.register(lambda: print("handler ran", flush=True))
class Torn:
    def __del__(self):
        sys.stdout.write("torn down\n"); sys.stdout.flush()
keep = Torn()
sys.stdout.write("unflushed output")
"""


def test_quick_exit_runs_later_handlers_flushes_and_skips_the_teardown():
    done = _run(PROGRAM, BEAM_DPSU_QUICK_EXIT="1")
    assert done.returncode == 0, done.stderr
    assert "handler ran" in done.stdout
    assert "unflushed output" in done.stdout
    assert "torn down" not in done.stdout  # the interpreter was not torn down


def test_without_the_variable_the_interpreter_ends_as_usual():
    done = _run(PROGRAM)
    assert done.returncode == 0, done.stderr
    assert "handler ran" in done.stdout and "unflushed output" in done.stdout
    assert "torn down" in done.stdout


@pytest.mark.parametrize("quick", ["1", "0"])
def test_an_uncaught_exception_still_exits_with_status_1_and_its_traceback(quick):
    done = _run("raise RuntimeError('worker failed')", BEAM_DPSU_QUICK_EXIT=quick)
    assert done.returncode == 1
    assert "RuntimeError: worker failed" in done.stderr


def test_quick_exit_flushes_logging_handlers():
    code = ("import logging, sys\n"
            "h = logging.StreamHandler(sys.stdout)\n"
            "logging.getLogger('w').addHandler(h)\n"
            "logging.getLogger('w').error('last words')\n")
    done = _run(code, BEAM_DPSU_QUICK_EXIT="1")
    assert done.returncode == 0 and "last words" in done.stdout


def test_quiet_worker_logs_errors_only():
    code = ("import logging\n"
            "logging.getLogger('w').warning('a warning')\n"
            "logging.getLogger('w').error('an error')\n")
    quiet = _run(code, BEAM_DPSU_QUIET_WORKER="1")
    assert "an error" in quiet.stderr and "a warning" not in quiet.stderr
    loud = _run(code)
    assert "a warning" in loud.stderr and "an error" in loud.stderr


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_worker_processes_sets_then_restores_the_environment(monkeypatch, quiet):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("BEAM_DPSU_QUICK_EXIT", raising=False)
    monkeypatch.setenv("BEAM_DPSU_QUIET_WORKER", "stale")
    with common.quiet_worker_processes(quiet):
        assert os.environ["PYTHONPATH"].split(os.pathsep) == [SITE, "/elsewhere"]
        assert os.environ["BEAM_DPSU_QUICK_EXIT"] == "1"
        assert os.environ.get("BEAM_DPSU_QUIET_WORKER") == ("1" if quiet else None)
    assert os.environ["PYTHONPATH"] == "/elsewhere"
    assert "BEAM_DPSU_QUICK_EXIT" not in os.environ
    assert os.environ["BEAM_DPSU_QUIET_WORKER"] == "stale"
