"""Releases on a local Flink session cluster (``beam-dpsu flink-cluster``): a JobManager,
two TaskManagers and an EXTERNAL pool of Python SDK workers, each a process of its
own; then a release with the TaskManager that runs it killed (SIGKILL) in the middle
and replaced, as a cluster manager would, and one with the worker pool killed and
started again.

Marked ``cluster``: they start JVMs and move Beam's job server jars to the cluster
for every job (measured on two busy cores: 10 s to start, 32 s for the job of three
families, 36 s for each fault).
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.pipelines import flink_cluster, worker_pool

from beam_dpsu.transforms import runners

from tests.test_engines import (EMBEDDED_PAIRS, SUITE_JVM, _embedded, _set_up, start_job_server,
                                stop)
from tests.test_runners import data  # noqa: F401  (the data fixture)

pytestmark = [pytest.mark.cluster, pytest.mark.engines, pytest.mark.subprocess,
              pytest.mark.xdist_group("flink-cluster")]

#: What every release on the cluster adds to the cluster's flags (besides the session's
#: job server): one slot per job, which keeps these tests' time small on two cores. The
#: worker pool test runs a job in both TaskManagers' slots (they share the pool).
EXTRA = ["--parallelism=1"]

#: The cluster's configuration beyond flink-cluster's defaults: the suite's JVM options,
#: and a quarter of each TaskManager's Flink memory for network buffers (three releases
#: in one job at parallelism 2 asked for 512 buffers where Flink's default tenth left 102
#: free: "Insufficient number of network buffers"), a quarter managed.
CONF = {"env.java.opts.all": " ".join(SUITE_JVM),
        "taskmanager.memory.network.fraction": "0.25",
        "taskmanager.memory.managed.fraction": "0.25"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not _set_up("flink") and not (os.environ.get("CI")
                                     or os.environ.get("BEAM_DPSU_ENGINES_PENDING")):
        pytest.skip("flink is not set up (beam-dpsu setup-engines flink)")
    folder = tmp_path_factory.mktemp("flink-cluster")
    state = flink_cluster.start(str(folder / "cluster"), taskmanagers=2, slots=1,
                                process_size="2000m", task_off_heap="256m", conf=CONF)
    try:
        proc, endpoint = start_job_server(
            "flink", str(folder), [f"--flink-master=localhost:{state['rest_port']}"])
    except BaseException:
        flink_cluster.stop(state["dir"])
        raise
    yield state, flink_cluster.flags(state) + EXTRA + [f"--job_endpoint={endpoint}"]
    stop(proc)
    flink_cluster.stop(state["dir"])


def _rest(state, path):
    with urllib.request.urlopen(f"http://localhost:{state['rest_port']}{path}", timeout=5) as r:
        return json.load(r)


def _taskmanagers_of(state, job):
    """The TaskManagers the job's tasks ran on (Flink's REST API)."""
    found = set()
    for vertex in _rest(state, f"/jobs/{job}")["vertices"]:
        for tm in _rest(state, f"/jobs/{job}/vertices/{vertex['id']}/taskmanagers")[
                "taskmanagers"]:
            found.add(tm["taskmanager-id"])
    return found


def test_three_families_on_two_taskmanagers(cluster, data, tmp_path):
    # One job of a user's pipeline (three families, parallelism 2) on both TaskManagers
    # releases the FnApiRunner's sets, with no restart on the way.
    state, flags = cluster
    assert len(_rest(state, "/taskmanagers")["taskmanagers"]) == 2
    # the cluster's --conf reached Flink (without the network share the job fails) and
    # env.java.opts.all the JVMs' command lines
    for pid in [state["jobmanager"]] + state["taskmanagers"]:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            assert SUITE_JVM[0].encode() in fh.read().split(b"\0")
    names = ["weighted-gaussian", "sips", "policy-gaussian"]
    before = {j["jid"] for j in _rest(state, "/jobs/overview")["jobs"]}
    want, _ = _embedded(runners.pipeline_options(["--runner=DirectRunner"]),
                        str(tmp_path / "d"), EMBEDDED_PAIRS, data[1], names)
    flags = [f for f in flags if not f.startswith("--parallelism")] + [
        "--parallelism=2", "--environment_cache_millis=60000"]
    got, state_kind = _embedded(runners.pipeline_options(flags), str(tmp_path / "c"),
                                EMBEDDED_PAIRS, data[1], names)
    assert all(want.values()) and got == want
    assert state_kind == "bag"  # the sequential policy on Flink's own keyed state
    jobs = [j for j in _rest(state, "/jobs/overview")["jobs"] if j["jid"] not in before]
    assert len(jobs) == 1 and jobs[0]["state"] == "FINISHED"
    assert not _rest(state, f"/jobs/{jobs[0]['jid']}/exceptions")["exceptionHistory"]["entries"]
    assert len(_taskmanagers_of(state, jobs[0]["jid"])) == 2  # two processes


def _running_job(state, before, proc, timeout=180):
    """Waits until a job not in ``before`` has run for a while; returns its id."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        for job in _rest(state, "/jobs/overview")["jobs"]:
            if job["jid"] not in before and job["state"] == "RUNNING":
                tasks = job["tasks"]
                if tasks.get("finished", 0) >= 3:  # past the read: in the middle of it
                    return job["jid"]
        time.sleep(0.2)
    raise AssertionError("no job ran (the command ended or the job never started)")


def _release_files(prefix):
    return [p for p in glob.glob(prefix + "*") if "items" in p or p.endswith(".json")]


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A file long enough for a fault to land in the middle of its release on the
    cluster, with the FnApiRunner's release of it."""
    folder = tmp_path_factory.mktemp("fault-data")
    path = str(folder / "in.tsv")
    synthetic.write_tsv(path, 30000, seed=2, max_occurrences=200)
    out = str(folder / "direct")
    from beam_dpsu.pipelines import select_partitions
    select_partitions.run(["--input", path, "--output", out, "--mechanism", "sips",
                           "--epsilon", "1", "--delta", "1e-6", "--insecure-test-seed", "9",
                           "--quiet"])
    with open(out + "-items-00000-of-00001", encoding="utf-8") as fh:
        return path, fh.read().splitlines()


def _release_with_a_fault(cluster, big, tmp_path, fault):
    """Runs the release on the cluster, calls ``fault(state)`` in the middle of its job;
    returns (exit status, stderr, the job's id, release lines or None)."""
    state, flags = cluster
    path, _ = big
    out = str(tmp_path / "out")
    before = {j["jid"] for j in _rest(state, "/jobs/overview")["jobs"]}
    proc = subprocess.Popen([sys.executable, "-m", "beam_dpsu.pipelines.cli", "select",
                             "--input", path, "--output", out, "--mechanism", "sips",
                             "--epsilon", "1", "--delta", "1e-6", "--insecure-test-seed", "9"]
                            + flags, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job = _running_job(state, before, proc)
        fault(state, job)
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    release = None
    if os.path.exists(out + "-items-00000-of-00001"):
        with open(out + "-items-00000-of-00001", encoding="utf-8") as fh:
            release = fh.read().splitlines()
    return proc.returncode, err, job, release, _release_files(out)


def _kill_a_taskmanager(state, job):
    # the TaskManager that runs the job: the one whose log names it
    pids = flink_cluster.read_state(state["dir"])["taskmanagers"]
    logs = [os.path.join(state["dir"], "log", f"taskmanager-{n + 1}.log") for n in range(len(pids))]
    running = [pid for pid, log in zip(pids, logs) if os.path.exists(log) and job in open(log).read()]
    assert len(running) == 1, running
    os.kill(running[0], signal.SIGKILL)
    flink_cluster.add_taskmanager(state["dir"])  # the replacement a cluster manager starts


def _started_workers(state):
    return worker_pool.started_workers(os.path.join(state["dir"], "workers.json"))


def _kill_the_pool_as_it_starts_a_worker(state, job, timeout=120):
    # SIGKILL the pool and its workers right after it has started a worker, before the
    # worker connects to its TaskManager: with Beam's own pool, the window in which the
    # TaskManager then waits for that worker forever; then start the pool on its port
    before = set(_started_workers(state))
    deadline = time.time() + timeout
    while not set(_started_workers(state)) - before:
        assert time.time() < deadline, "the pool started no worker"
        time.sleep(0.02)
    os.killpg(flink_cluster.read_state(state["dir"])["pool"], signal.SIGKILL)
    flink_cluster.start_worker_pool(state["dir"])


def test_the_worker_pool_killed_mid_release(cluster, big, tmp_path):
    # Measured outcome: the pool started again (its journal) starts the workers the
    # killed one had started, the waiting task goes on (or, for a worker that was
    # already connected, Flink restarts the job) and the release is the FnApiRunner's.
    # Two TaskManagers share the pool (parallelism 2).
    state, flags = cluster
    flags = [f for f in flags if not f.startswith("--parallelism")] + ["--parallelism=2"]
    status, err, job, release, _ = _release_with_a_fault(
        (state, flags), big, tmp_path, _kill_the_pool_as_it_starts_a_worker)
    assert status == 0, err[-3000:]
    assert release == big[1]
    with open(os.path.join(state["dir"], "log", "worker-pool.out"), encoding="utf-8") as fh:
        assert "again" in fh.read()  # the restarted pool started a killed worker again
    assert _rest(state, f"/jobs/{job}")["state"] == "FINISHED"
    assert len(_taskmanagers_of(state, job)) == 2


def test_a_taskmanager_killed_mid_release(cluster, big, tmp_path):
    # Measured outcome: Flink restarts the job (fixed-delay restarts, 3 attempts) on the
    # surviving TaskManager and the replacement, and the release is the FnApiRunner's.
    state, _ = cluster
    status, err, job, release, _ = _release_with_a_fault(cluster, big, tmp_path,
                                                         _kill_a_taskmanager)
    assert status == 0, err[-3000:]
    assert release == big[1]
    # the job did fail and restart in the middle (the fault landed)
    assert _rest(state, f"/jobs/{job}/exceptions")["exceptionHistory"]["entries"]
    assert _rest(state, f"/jobs/{job}")["state"] == "FINISHED"


class _Context:
    def __init__(self, peer):
        self._peer = peer

    def peer(self):
        return self._peer


def _request(worker_id, port):
    from apache_beam.portability.api import beam_fn_api_pb2, endpoints_pb2
    return beam_fn_api_pb2.StartWorkerRequest(
        worker_id=worker_id,
        control_endpoint=endpoints_pb2.ApiServiceDescriptor(url=f"localhost:{port}"))


@pytest.fixture
def sleeping_workers(monkeypatch):
    monkeypatch.setattr(worker_pool, "_command",
                        lambda request: [sys.executable, "-c", "import time; time.sleep(60)"])
    return worker_pool


def test_the_pool_stops_the_worker_of_the_taskmanager_that_asks(sleeping_workers):
    # Two TaskManagers name their first workers alike ("1-1"); each stops its own.
    pool = sleeping_workers.SupervisedWorkerPool()
    try:
        pool.StartWorker(_request("1-1", 1001), _Context("ipv4:127.0.0.1:5001"))
        pool.StartWorker(_request("1-1", 1002), _Context("ipv4:127.0.0.1:5002"))
        pool.StopWorker(_request("1-1", 0), _Context("ipv4:127.0.0.1:5001"))
        left = [w["request"].control_endpoint.url for w in pool._workers.values()]
        assert left == ["localhost:1002"]
        # asked on another connection: the name is ambiguous no more, so it is stopped
        pool.StopWorker(_request("1-1", 0), _Context("ipv4:127.0.0.1:5999"))
        assert not pool._workers
    finally:
        pool.stop_all()


def test_a_restarted_pool_starts_the_workers_it_had_not_stopped(sleeping_workers, tmp_path):
    journal = str(tmp_path / "workers.json")
    first = sleeping_workers.SupervisedWorkerPool(journal)
    first.StartWorker(_request("1-1", 1001), _Context("a"))
    first.StartWorker(_request("2-1", 1001), _Context("b"))
    first.StopWorker(_request("2-1", 0), _Context("b"))
    first.stop_all()  # as if killed: the journal still names 1-1
    second = sleeping_workers.SupervisedWorkerPool(journal)
    try:
        assert [(w["request"].worker_id, w["request"].control_endpoint.url)
                for w in second._workers.values()] == [("1-1", "localhost:1001")]
        assert all(w["proc"].poll() is None for w in second._workers.values())
    finally:
        second.stop_all()


def test_conf_rows_replace_defaults_and_java_options_reach_each_role(tmp_path):
    state = {"dir": str(tmp_path), "rpc_port": 1, "rest_port": 2, "blob_port": 3,
             "conf": {"heartbeat.timeout": "60000", "env.java.opts.all": "-Da=1 -Db=2",
                      "env.java.opts.taskmanager": "-Dc=3"}}
    args = flink_cluster.argparse.Namespace(taskmanagers=1, slots=2, process_size="3500m",
                                            task_off_heap="768m", restart_attempts=3)
    rows = flink_cluster._config(state, args).splitlines()
    assert rows.count("heartbeat.timeout: 60000") == 1
    assert not [r for r in rows if r.startswith("heartbeat.timeout: 8000")]
    assert "env.java.opts.all: -Da=1 -Db=2" in rows
    assert flink_cluster._java_opts(state, "jobmanager") == ["-Da=1", "-Db=2"]
    assert flink_cluster._java_opts(state, "taskmanager") == ["-Da=1", "-Db=2", "-Dc=3"]


@pytest.mark.parametrize("conf, says", [
    ("=1", "expected KEY=VALUE"), ("heartbeat.timeout=", "both non-empty"),
    ("heartbeat.timeout", "expected KEY=VALUE"), ("rest.port=8081", "sets it itself"),
    ("taskmanager.numberOfTaskSlots=4", "use --slots"),
    ("env.java.opts=-Xss4m", "env.java.opts.all")])
def test_a_conf_the_command_cannot_take_is_one_line_and_exit_status_2(tmp_path, capsys, conf,
                                                                     says):
    assert flink_cluster.main(["start", str(tmp_path / "c"), "--conf", conf]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "c").exists()
    with pytest.raises(flink_cluster.UsageError):  # the same refusal from the API
        flink_cluster.start(str(tmp_path / "d"), conf=dict([conf.split("=", 1)])
                            if "=" in conf else {conf: ""})
    assert not (tmp_path / "d").exists()


def test_conf_values_keep_their_equals_signs_and_lose_quotes_around_jvm_options():
    assert flink_cluster.check_conf({" a.b ": "x=y", "env.java.opts.all": "'-Da=1 -Db'"}) == {
        "a.b": "x=y", "env.java.opts.all": "-Da=1 -Db"}


def test_a_cluster_json_written_before_conf_still_adds_taskmanagers_options(tmp_path):
    # an older cluster.json has no "conf": no extra JVM options, the defaults' rows
    state = {"dir": str(tmp_path), "rpc_port": 1, "rest_port": 2, "blob_port": 3}
    assert flink_cluster._java_opts(state, "taskmanager") == []
    args = flink_cluster.argparse.Namespace(taskmanagers=1, slots=2, process_size="3500m",
                                            task_off_heap="768m", restart_attempts=3)
    assert "heartbeat.timeout: 8000" in flink_cluster._config(state, args).splitlines()


def test_stop_spares_a_process_that_took_a_dead_members_pid(tmp_path):
    # A stale cluster folder (its processes died, say at a reboot) names a pid that another
    # process holds now (here: this test's own process): stop signals only the cluster's.
    state = {"dir": str(tmp_path), "pool_port": 1, "pool": os.getpid(),
             "taskmanagers": [os.getpid()], "jobmanager": None}
    flink_cluster._write_state(str(tmp_path), state)
    assert flink_cluster.stop(str(tmp_path), timeout=0.1) == []
    assert not os.path.exists(os.path.join(str(tmp_path), flink_cluster._STATE))
