"""The start-up module of the worker processes our command lines start
(``beam_dpsu/_quiet_workers/sitecustomize.py``) and the environment
``quiet_worker_processes`` gives them."""
import os
import subprocess
import sys

import pytest

from beam_dpsu import _quiet_workers
from beam_dpsu.pipelines import common

SITE = _quiet_workers.DIRECTORY


def _run(tmp_path, code, quick=None, extra_path=(), **env):
    """Runs ``code`` as ``python -m prog`` with our start-up module on PYTHONPATH;
    ``quick``: the value of BEAM_DPSU_QUICK_EXIT (None: unset)."""
    (tmp_path / "prog.py").write_text(code)
    full = {k: v for k, v in os.environ.items()
            if k not in common.quiet_worker_processes.VARIABLES}
    full.update(PYTHONPATH=os.pathsep.join([SITE, *extra_path, str(tmp_path)]), **env)
    if quick is not None:
        full["BEAM_DPSU_QUICK_EXIT"] = quick
    return subprocess.run([sys.executable, "-m", "prog"], capture_output=True, text=True,
                          env=full, timeout=120, cwd=str(tmp_path))


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


def test_quick_exit_runs_later_handlers_flushes_and_skips_the_teardown(tmp_path):
    done = _run(tmp_path, PROGRAM, quick="prog")
    assert done.returncode == 0, done.stderr
    assert "handler ran" in done.stdout
    assert "unflushed output" in done.stdout
    assert "torn down" not in done.stdout  # the interpreter was not torn down


@pytest.mark.parametrize("quick", [None, "another.module"])
def test_without_the_variable_or_in_another_program_the_interpreter_ends_as_usual(
        tmp_path, quick):
    done = _run(tmp_path, PROGRAM, quick=quick)
    assert done.returncode == 0, done.stderr
    assert "handler ran" in done.stdout and "unflushed output" in done.stdout
    assert "torn down" in done.stdout


@pytest.mark.parametrize("quick", ["prog", None])
@pytest.mark.parametrize("code, status, message", [
    ("raise RuntimeError('worker failed')", 1, "RuntimeError: worker failed"),
    ("import sys; sys.exit(3)", 3, None),
    ("import sys; sys.exit('boom')", 1, "boom"),
    ("import sys; sys.exit(None)", 0, None),
    ("import sys, threading\n"
     "t = threading.Thread(target=sys.exit, args=(4,)); t.start(); t.join()", 0, None),
])
def test_the_exit_status_is_what_python_gives(tmp_path, quick, code, status, message):
    done = _run(tmp_path, code, quick=quick)
    assert done.returncode == status, done.stderr
    if message:
        assert message in done.stderr


def test_the_processes_a_quick_worker_starts_end_as_usual(tmp_path):
    # A multiprocessing child whose target raises reports exit code 1 (the child
    # ends through sys.exit in multiprocessing's own code); the variable is gone.
    code = ("import multiprocessing as mp, os\n"
            "def boom():\n"
            "    raise RuntimeError('child failed')\n"
            "if __name__ == '__main__':\n"
            "    assert 'BEAM_DPSU_QUICK_EXIT' not in os.environ\n"
            "    p = mp.get_context('spawn').Process(target=boom); p.start(); p.join()\n"
            "    print('child exit code', p.exitcode)\n")
    done = _run(tmp_path, code, quick="prog")
    assert done.returncode == 0, done.stderr
    assert "child exit code 1" in done.stdout


def test_quick_exit_flushes_logging_handlers(tmp_path):
    code = ("import logging, sys\n"
            "h = logging.StreamHandler(sys.stdout)\n"
            "logging.getLogger('w').addHandler(h)\n"
            "logging.getLogger('w').error('last words')\n")
    done = _run(tmp_path, code, quick="prog")
    assert done.returncode == 0 and "last words" in done.stdout


def test_quiet_worker_logs_errors_only(tmp_path):
    code = ("import logging\n"
            "logging.getLogger('w').warning('a warning')\n"
            "logging.getLogger('w').error('an error')\n")
    quiet = _run(tmp_path, code, BEAM_DPSU_QUIET_WORKER="1")
    assert "an error" in quiet.stderr and "a warning" not in quiet.stderr
    loud = _run(tmp_path, code)
    assert "a warning" in loud.stderr and "an error" in loud.stderr


def test_the_environments_own_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE'] = 'ran'\n")
    done = _run(tmp_path, "import os\nprint('other:', os.environ.get('OTHER_SITE'))\n",
                quick="prog", extra_path=[str(other)])
    assert done.returncode == 0, done.stderr
    assert "other: ran" in done.stdout


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_worker_processes_sets_then_restores_the_environment(monkeypatch, quiet):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("BEAM_DPSU_QUICK_EXIT", raising=False)
    monkeypatch.setenv("BEAM_DPSU_QUIET_WORKER", "stale")
    with common.quiet_worker_processes(quiet):
        assert os.environ["PYTHONPATH"].split(os.pathsep) == [SITE, "/elsewhere"]
        assert os.environ["BEAM_DPSU_QUICK_EXIT"] == "apache_beam.runners.worker.sdk_worker_main"
        assert os.environ.get("BEAM_DPSU_QUIET_WORKER") == ("1" if quiet else None)
    assert os.environ["PYTHONPATH"] == "/elsewhere"
    assert "BEAM_DPSU_QUICK_EXIT" not in os.environ
    assert os.environ["BEAM_DPSU_QUIET_WORKER"] == "stale"
