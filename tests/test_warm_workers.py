"""Worker processes started early for the multi-process DirectRunner (beam_dpsu.warm_workers).

Each condition the module docstring names is tested here: a warm process runs
only with the environment and working directory Beam would give its worker
(else the claim starts Beam's own worker), serves one claim, a run never
depends on the pool (fallback), and no process outlives the run or its launcher.
"""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu import _quiet_workers, cli, runners, warm_workers
from beam_dpsu.pipelines import common

from conftest import beam_options

pytestmark = pytest.mark.skipif(not warm_workers.available(),
                                reason="warm workers need Unix sockets")

TWO = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def _run_two_workers(pool, kinds):
    """A two-worker run of 40 keys on ``FnApiDirectRunner(pool)``, asserting its
    result and that the processes that ran its elements were of ``kinds``
    ("warm": a warm process; "cold": Beam's own worker)."""
    def which_process(x):  # (defined here: pickled by value for the worker processes)
        import os
        import sys
        argv = " ".join(sys.orig_argv)  # (sys.argv is Beam's worker's in both)
        kind = ("warm" if "warm_worker.py serve" in argv
                else "cold" if "sdk_worker_main" in argv else argv)
        return x, kind, os.getpid()

    with beam.Pipeline(runner=runners.FnApiDirectRunner(pool), options=beam_options(*TWO)) as p:
        out = (p | beam.Create([(k % 40, k) for k in range(400)])
               | beam.GroupByKey()
               | beam.Map(lambda kv: (kv[0], sum(kv[1])))
               | beam.Map(which_process))
        assert_that(out | beam.Map(lambda t: t[0]),
                    equal_to([(k, sum(range(k, 400, 40))) for k in range(40)]))
        assert_that(out | "Kinds" >> beam.Map(lambda t: t[1]) | beam.Distinct(),
                    equal_to(kinds), label="ProcessKinds")


def _gone(pid, timeout=30.0):
    """Whether process ``pid`` has ended (or is a zombie) within ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


# -- argv_pool_size: when the command lines start workers early ----------------------------

@pytest.mark.parametrize("argv, expected", [
    ([], None),
    (["--input", "x"], None),
    (TWO, 2),
    (["--direct_num_workers", "3", "--direct_running_mode", "multi_processing"], 3),
    (["--direct_running_mode=multi_processing"], 1),
    (["--direct_running_mode=multi_processing", "--direct_num_workers=0"],
     os.cpu_count() or 1),
    (["--direct_running_mode=multi_threading", "--direct_num_workers=2"], None),
    (["--direct_running_mode=in_memory"], None),
    (TWO + ["--runner=DirectRunner"], 2),
    (TWO + ["--runner", "apache_beam.runners.direct.direct_runner.SwitchingDirectRunner"], 2),
    (TWO + ["--runner=direct"], 2),
    (TWO + ["--runner=DataflowRunner"], None),
    (TWO + ["--runner=PrismRunner"], None),
    (TWO + ["--runner=DirectRunner", "--runner=FlinkRunner"], None),  # the last one wins
    (["--direct_num_workers=two", "--direct_running_mode=multi_processing"], None),
    (["--direct_num_workers=-1", "--direct_running_mode=multi_processing"], None),
])
def test_argv_pool_size_reads_the_beam_flags_as_beam_does(argv, expected):
    assert warm_workers.argv_pool_size(argv) == expected


def test_argv_pool_size_agrees_with_pool_size_of_the_parsed_options():
    for argv in (TWO, ["--direct_running_mode=multi_processing", "--direct_num_workers=3"],
                 ["--direct_running_mode=multi_threading"], []):
        assert warm_workers.argv_pool_size(argv) == warm_workers.pool_size(beam_options(*argv))


def test_warm_workers_refuses_a_bad_size():
    for n in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError):
            warm_workers.WarmWorkers(n)


def test_the_worker_environment_is_the_one_quiet_worker_processes_sets(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    for quiet in (True, False):
        expected = _quiet_workers.worker_environment(os.environ, quiet)
        with common.quiet_worker_processes(quiet):
            assert dict(os.environ) == expected
        assert os.environ["PYTHONPATH"] == "/somewhere"
        # applying it twice changes nothing (a run inside a run: one PYTHONPATH entry)
        assert _quiet_workers.worker_environment(expected, quiet) == expected


# -- runs ------------------------------------------------------------------------------

def test_a_two_worker_run_runs_in_warm_processes_and_leaves_none_behind():
    pool = warm_workers.WarmWorkers(2)
    try:
        _run_two_workers(pool, ["warm"])
        claimed = sorted(os.listdir(pool.dir))
    finally:
        pool.close()
    assert claimed == ["0.claimed", "1.claimed"]  # each process served one claim
    assert [p.returncode for p in pool.processes] == [0, 0]
    assert not os.path.exists(pool.dir)


def test_warm_workers_run_at_the_launchers_priority():
    """The import runs in a thread of lower priority; the claimed worker must not."""
    def nice(_):
        import os
        return os.getpriority(os.PRIO_PROCESS, 0)

    launcher = os.getpriority(os.PRIO_PROCESS, 0)
    pool = warm_workers.WarmWorkers(2)
    try:
        with beam.Pipeline(runner=runners.FnApiDirectRunner(pool),
                           options=beam_options(*TWO)) as p:
            out = (p | beam.Create(range(40)) | beam.Reshuffle() | beam.Map(nice)
                   | beam.Distinct())
            assert_that(out, equal_to([launcher]))
        claimed = sorted(os.listdir(pool.dir))
    finally:
        pool.close()
    assert claimed == ["0.claimed", "1.claimed"]


def _warm_script_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("_warm_worker_script", warm_workers.SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
@pytest.mark.skipif(os.getpriority(os.PRIO_PROCESS, 0) >= 19, reason="already at the lowest priority")
def test_the_warm_import_runs_in_a_lower_priority_thread_and_raises_its_errors(
        tmp_path, monkeypatch):
    script = _warm_script_module()
    probe = ("import os, threading\n"
             "NICE = os.getpriority(os.PRIO_PROCESS, 0)\n"
             "THREAD = threading.current_thread().name\n")
    (tmp_path / "probe_low.py").write_text(probe)
    (tmp_path / "probe_first.py").write_text(probe)   # stands for numpy (threads at import)
    (tmp_path / "probe_broken.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("probe_low", "probe_first", "probe_broken"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(script, "IMPORTED_AT_NORMAL_PRIORITY", ("probe_first", "not_installed_x"))
    before = os.getpriority(os.PRIO_PROCESS, 0)
    script.import_at_low_priority("probe_low")
    low, first = sys.modules["probe_low"], sys.modules["probe_first"]
    assert low.THREAD == "warm-import"
    assert low.NICE == min(19, before + script.IMPORT_NICENESS) > before
    assert (first.THREAD, first.NICE) == (threading.current_thread().name, before)
    assert os.getpriority(os.PRIO_PROCESS, 0) == before  # the caller's thread is unchanged
    with pytest.raises(RuntimeError, match="broken at import"):
        script.import_at_low_priority("probe_broken")
    for name in ("probe_low", "probe_first"):
        del sys.modules[name]


def test_the_runner_starts_and_closes_its_own_pool(monkeypatch):
    made = []
    real = warm_workers.WarmWorkers

    def record(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]
    monkeypatch.setattr(warm_workers, "WarmWorkers", record)
    _run_two_workers(None, ["warm"])
    assert len(made) == 1 and len(made[0].processes) == 2
    assert all(p.returncode is not None for p in made[0].processes)
    assert not os.path.exists(made[0].dir)


def test_a_run_with_more_workers_than_warm_processes_starts_the_rest_itself():
    with warm_workers.WarmWorkers(1) as pool:
        _run_two_workers(pool, ["cold", "warm"])


def test_a_warm_process_started_with_another_environment_is_refused():
    env = dict(os.environ, BEAM_DPSU_TEST_ONLY_MARK="1")  # not what Beam gives its workers
    with warm_workers.WarmWorkers(2, env) as pool:
        _run_two_workers(pool, ["cold"])
        assert sorted(os.listdir(pool.dir)) == ["0.claimed", "1.claimed"]  # asked, refused
    assert [p.returncode for p in pool.processes] == [0, 0]  # refused: ran nothing, ended


def test_a_warm_process_started_in_another_directory_is_refused(tmp_path, monkeypatch):
    with warm_workers.WarmWorkers(2) as pool:
        monkeypatch.chdir(tmp_path)  # Beam starts its workers in the directory of the run
        _run_two_workers(pool, ["cold"])
        assert sorted(os.listdir(pool.dir)) == ["0.claimed", "1.claimed"]  # asked, refused


def test_a_failing_bundle_in_a_warm_worker_fails_the_run():
    def boom(x):
        raise ValueError("boom from a warm worker")
    with warm_workers.WarmWorkers(2) as pool:
        with pytest.raises(Exception, match="boom from a warm worker"):
            with beam.Pipeline(runner=runners.FnApiDirectRunner(pool),
                               options=beam_options(*TWO)) as p:
                _ = p | beam.Create([1, 2, 3]) | beam.Reshuffle() | beam.Map(boom)
    assert all(p.returncode is not None for p in pool.processes)


def test_other_running_modes_start_no_pool(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a pool was started")
    monkeypatch.setattr(warm_workers, "WarmWorkers", refuse)
    for extra in ([], ["--direct_num_workers=2", "--direct_running_mode=multi_threading"]):
        with beam.Pipeline(runner=runners.FnApiDirectRunner(), options=beam_options(*extra)) as p:
            assert_that(p | beam.Create([1, 2]) | beam.Map(lambda x: x * 2), equal_to([2, 4]))


# -- the lifetime conditions, process by process -----------------------------------------

def test_unclaimed_processes_end_when_the_launcher_dies(tmp_path):
    script = (
        "import os, signal, sys, time\n"
        "from beam_dpsu import warm_workers\n"
        "pool = warm_workers.WarmWorkers(2)\n"
        "time.sleep(0.5)\n"
        "assert [p.poll() for p in pool.processes] == [None, None]\n"  # waiting, not crashed
        "assert sorted(os.listdir(pool.dir)) == ['0.sock', '1.sock']\n"
        "print(' '.join(str(p.pid) for p in pool.processes), pool.dir, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=_repo()))
    assert proc.returncode == -signal.SIGKILL
    *pids, pool_dir = proc.stdout.split()
    assert len(pids) == 2
    assert all(_gone(int(pid)) for pid in pids)
    import shutil
    shutil.rmtree(pool_dir, ignore_errors=True)  # what a killed launcher cannot do


def test_an_unclaimed_process_ignores_ctrl_c_and_ends_with_the_launcher():
    """A Ctrl-C reaches every process of the terminal's group: a waiting process
    leaves it to the launcher (whose end closes the pool) instead of failing."""
    with warm_workers.WarmWorkers(1) as pool:
        time.sleep(0.3)
        pool.processes[0].send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert pool.processes[0].poll() is None
    assert pool.processes[0].returncode == 0


def test_start_early_starts_the_workers_without_importing_beam(tmp_path):
    script = (
        "import sys\n"
        "from beam_dpsu import warm_workers\n"
        "warm_workers.start_early(['--direct_num_workers=2',"
        " '--direct_running_mode=multi_processing'], quiet=True)\n"
        "print('apache_beam' in sys.modules, len(warm_workers._EARLY[0].processes))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=_repo()),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "2"]


def test_a_pool_that_cannot_be_set_up_has_no_process(monkeypatch):
    def no_directory(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(warm_workers, "_socket_directory", no_directory)
    with warm_workers.WarmWorkers(2) as pool:
        assert pool.processes == [] and pool.command == warm_workers.BEAM_WORKER_COMMAND
        _run_two_workers(pool, ["cold"])


def test_a_claimed_process_ends_when_its_claim_ends():
    with warm_workers.WarmWorkers(1) as pool:
        path = os.path.join(pool.dir, "0.sock")
        mine = os.path.join(pool.dir, "0.claimed")
        os.rename(path, mine)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(mine)
        # A control service nobody listens on: Beam's worker waits up to 60 s for it.
        env = dict(os.environ, CONTROL_API_SERVICE_DESCRIPTOR='url: "localhost:9"',
                   PIPELINE_OPTIONS="{}")
        data = json.dumps([env, os.getcwd()]).encode()
        conn.sendall(struct.pack("!Q", len(data)) + data)
        conn.settimeout(60)
        assert conn.recv(1) == b"S"  # it runs Beam's worker now
        started = time.time()
        conn.close()  # the claim ends (as when Beam kills the worker it started)
        assert pool.processes[0].wait(timeout=30) == 1
        assert time.time() - started < 30


def test_a_claim_without_a_free_process_becomes_beams_worker(tmp_path):
    """An empty pool directory: the claim execs Beam's worker, which fails here only
    because no control service is given (the status and message are Beam's own)."""
    env = {k: v for k, v in os.environ.items() if k != "CONTROL_API_SERVICE_DESCRIPTOR"}
    proc = subprocess.run([sys.executable, "-S", warm_workers.SCRIPT, "claim", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert "CONTROL_API_SERVICE_DESCRIPTOR" in proc.stderr  # raised by sdk_worker_main


# -- the command lines -------------------------------------------------------------------

def _repo():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_command_line_takes_the_workers_it_started_early(tmp_path, monkeypatch):
    """``cli.run_command`` starts the pool (``start_early``) and the run takes it: both
    workers are warm processes, and the release equals the one-worker release."""
    from beam_dpsu import synthetic
    data = str(tmp_path / "in.tsv")
    synthetic.write_tsv(data, 300, seed=3)
    taken, closed = [], []
    real_take, real_close = warm_workers.take_early, warm_workers.WarmWorkers.close

    def take(n):
        taken.append(real_take(n))
        return taken[-1]

    def close(self, *args, **kwargs):
        closed.append(sorted(os.listdir(self.dir)) if self.dir else None)
        return real_close(self, *args, **kwargs)
    monkeypatch.setattr(warm_workers, "take_early", take)
    monkeypatch.setattr(warm_workers.WarmWorkers, "close", close)
    releases = []
    for extra in ([], TWO):
        out = str(tmp_path / f"out{len(releases)}")
        assert cli.run_command("select", ["--input", data, "--output", out, "--mechanism",
                                          "weighted-gaussian", "--epsilon", "3", "--delta",
                                          "1e-5", "--insecure-test-seed", "4", "--quiet"]
                               + extra, prog="") == 0
        with open(out + "-items-00000-of-00001") as f:
            releases.append(f.read())
    assert releases[0] == releases[1] and releases[0]
    assert taken[-1] is not None and len(taken[-1].processes) == 2
    assert closed[-1] == ["0.claimed", "1.claimed"]
    assert warm_workers._EARLY == []

