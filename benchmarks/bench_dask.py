"""DirectRunner against DaskRunner (2 worker processes, 1 thread each), and Prism, on
synthetic users.

Usage (from the repository root, PYTHONPATH=$PWD; needs ``pip install '.[dask]'``):
    python benchmarks/bench_dask.py --input '/tmp/syn8/part-*' --repeats 3 \
        --mechanisms weighted-gaussian,sips,policy-gaussian --out /tmp/bench_dask.json
    # without --input: generates --users synthetic users into one file under --workdir

For each mechanism the runners alternate (direct, dask, direct, dask, ...); ``prism``
(``--runner=PrismRunner``, after ``beam-dpsu setup-engines prism``) runs Beam's Go
runner with its SDK worker in this process (LOOPBACK); its row adds the peak RSS of the
launcher's child processes (the Prism binary). ``flink-1x2`` and ``flink-2x1`` run on
local Flink session clusters (``beam-dpsu flink-cluster``, started once before the
runs and stopped after them: one TaskManager of 2 slots, and two of 1 slot sharing
the worker pool; ``--flink-process-size``/``--flink-task-off-heap`` per TaskManager of
the 1×2 cluster, half of each for the 2×1 one), each release at parallelism 2 through
``--runner=FlinkRunner`` (which starts Beam's job server, as a user's run does). Their
rows add the peak RSS of each TaskManager, of the SDK workers (the largest one, and
all of them at once), of the launcher's children (the job server), and from Flink's
REST API when the job started and ended (after the launcher's start) and each
vertex's duration and end (after the job's start)::

    python benchmarks/bench_dask.py --input /work/u1m.tsv --repeats 2 \
        --mechanisms weighted-gaussian --runners direct,flink-1x2,dask,flink-2x1,prism

Wall time is that of the whole command-line run
(``beam_dpsu.pipelines.select_partitions.run``), in this process. Peak memory:
the maximum RSS, sampled every 0.2 s with psutil during the run, of this
(launching) process, which also hosts the dask scheduler (LocalCluster), and of
each dask worker process; for each Dask worker also the peak of its managed
memory (what Dask holds and sizes with its ``sizeof``, spilled included) and of
what it has spilled to disk, polled from the scheduler every second (in the
order of the RSS peaks: by worker process id). The workers are restarted before every Dask run
(outside the timing) so that each run starts from fresh processes, unless
``--warm``: then the workers live through all runs, as in a long-lived cluster,
and one untimed run of each runner comes first (imports, compiled kernels). CPU:
user + system seconds (``user_s``/``sys_s`` apart) of the launcher and of each worker during the
run, and the minor page faults of the workers. ``--worker-malloc-trim unset``
starts the workers without the ``MALLOC_TRIM_THRESHOLD_=65536`` that Dask's nanny
sets by default (``distributed.nanny.pre-spawn-environ``; with glibc it also fixes
the mmap threshold at 128 KiB, so every larger array is mapped and faulted anew:
see docs/runners.md, "Dask"). Every run
uses --insecure-test-seed 1 and the released sets of the two runners are
compared. One JSON line per run is printed, and all rows are written to
``--out``.

Bounding a run: ``--fresh-flink`` starts each Flink cluster just before its run and
stops it right after (outside the timing), so that only one cluster holds memory at a
time. A run is stopped after ``--run-timeout`` seconds, when the file WORKDIR/stop-run
appears (it is removed), or, for Prism, when the Prism binary's RSS passes
``--prism-rss-limit-mb``: a Flink run's jobs are cancelled through the REST API (and its
job server killed if the run does not end within 60 s), Prism's processes are killed;
a DirectRunner or Dask run is not stopped: it goes on to its end and is then marked
stopped. ``--fresh-flink`` does not go with ``--warm``. A run that fails or is stopped gets a row with ``outcome`` (the reason) and the peaks
seen; the other runs go on, and its release is left out of the comparison.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")

FLAGS = {
    "weighted-gaussian": ["--epsilon", "1", "--delta", "1e-5", "--max-items-per-user", "10"],
    "sips": ["--rho", "0.5", "--delta", "1e-5", "--max-items-per-user", "10"],
    "policy-gaussian": ["--epsilon", "1", "--delta", "1e-5", "--max-items-per-user", "10"],
}


class PeakRss(threading.Thread):
    """Samples the RSS of ``pids`` every 0.2 s (peak kept); after ``finish()``,
    ``cpu`` holds the CPU seconds (user + system) each used since construction."""

    def __init__(self, pids, groups=None):
        super().__init__(daemon=True)
        import psutil
        self.procs = [psutil.Process(p) for p in pids]
        # name -> function giving pids that come and go (SDK workers): peak of the
        # largest one and of their sum
        self.groups = groups or {}
        self.group_max = {g: 0 for g in self.groups}
        self.group_sum = {g: 0 for g in self.groups}
        self.peak = {p.pid: 0 for p in self.procs}
        self.cpu0 = {p.pid: self._cpu(p) for p in self.procs}
        self.split0 = {p.pid: self._split(p) for p in self.procs}
        self.stop = False

    @staticmethod
    def _cpu(p):
        try:
            t = p.cpu_times()
        except Exception:  # noqa: BLE001 -- the process died (a lost TaskManager)
            return float("nan")
        return t.user + t.system

    @staticmethod
    def _split(p):
        try:
            t = p.cpu_times()
        except Exception:  # noqa: BLE001 -- the process died (a lost TaskManager)
            return float("nan"), float("nan"), 0
        try:
            with open(f"/proc/{p.pid}/stat") as f:
                faults = int(f.read().rsplit(")", 1)[1].split()[7])
        except OSError:
            faults = 0
        return t.user, t.system, faults

    def run(self):
        import psutil
        while not self.stop:
            for p in self.procs:
                try:
                    self.peak[p.pid] = max(self.peak[p.pid], p.memory_info().rss)
                except Exception:
                    pass
            for g, pids_of in self.groups.items():
                rss = []
                for pid in pids_of():
                    try:
                        rss.append(psutil.Process(pid).memory_info().rss)
                    except Exception:
                        pass
                self.group_max[g] = max([self.group_max[g]] + rss)
                self.group_sum[g] = max(self.group_sum[g], sum(rss))
            time.sleep(0.2)

    def finish(self):
        self.stop = True
        self.join()
        self.cpu = {p.pid: round(self._cpu(p) - self.cpu0[p.pid], 2) for p in self.procs}
        self.split = {p.pid: [round(b - a, 2) for a, b in zip(self.split0[p.pid], self._split(p))]
                      for p in self.procs}  # user s, system s, minor faults


class DaskMemory(threading.Thread):
    """Polls the scheduler every second for each worker's managed memory (what Dask
    holds and knows the size of, by dask's ``sizeof``: its in-memory data plus what
    it has spilled, the heartbeat's ``managed_bytes``) and the bytes it has spilled
    to disk; keeps each one's peak (bytes, by worker process id)."""

    def __init__(self, client, pid_of):
        super().__init__(daemon=True)
        self.client, self.pid_of, self.stop = client, pid_of, False  # pid_of: address -> pid
        self.managed, self.spilled = {}, {}

    def run(self):
        while not self.stop:
            try:
                workers = self.client.scheduler_info()["workers"]
            except Exception:
                workers = {}
            for addr, w in workers.items():
                m, pid = w.get("metrics", {}), self.pid_of.get(addr)
                self.managed[pid] = max(self.managed.get(pid, 0), m.get("managed_bytes", 0))
                disk = m.get("spilled_bytes", {}).get("disk", 0)
                self.spilled[pid] = max(self.spilled.get(pid, 0), disk)
            time.sleep(1.0)

    def finish(self):
        self.stop = True
        self.join()

    def peaks_mb(self, peaks, pids):
        """The peaks of ``peaks`` in the order of ``pids`` (MB; None if never seen)."""
        return [round(peaks[p] / 2**20) if p in peaks else None for p in pids]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=100000)
    ap.add_argument("--input", default=None, help="file or glob (default: generated)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--mechanisms", default="weighted-gaussian,sips,policy-gaussian")
    ap.add_argument("--runners", default="direct,dask", help="order within a repeat")
    ap.add_argument("--workdir", default="/tmp/bench_dask")
    ap.add_argument("--out", default=None, help="JSON rows (default: WORKDIR/bench_dask.json)")
    ap.add_argument("--flags", default=None,
                    help="the mechanism's flags for every mechanism, e.g. '--epsilon 3 "
                         "--delta 1e-5 --max-items-per-user 100' (default: FLAGS above)")
    ap.add_argument("--memory-limit", default="auto",
                    help="each Dask worker's memory limit (dask's memory_limit, e.g. 8GB; "
                         "a worker spills its data to disk above 60%% of it; default "
                         "auto: the machine's memory / 2)")
    ap.add_argument("--warm", action="store_true",
                    help="keep the workers through all runs (a long-lived cluster) after one "
                         "untimed run of each runner; default: restart them before each Dask run")
    ap.add_argument("--flink-process-size", default="3500m")
    ap.add_argument("--flink-task-off-heap", default="768m")
    ap.add_argument("--fresh-flink", action="store_true",
                    help="start each Flink cluster just before its run, stop it after")
    ap.add_argument("--run-timeout", type=float, default=None,
                    help="stop a run after this many seconds (default: no limit)")
    ap.add_argument("--prism-rss-limit-mb", type=float, default=None,
                    help="stop a Prism run when the Prism binary's RSS passes this")
    ap.add_argument("--worker-malloc-trim", choices=("dask", "unset"), default="dask",
                    help="dask: the workers get Dask's default MALLOC_TRIM_THRESHOLD_=65536; "
                         "unset: they start without it")
    a = ap.parse_args()
    if a.fresh_flink and a.warm:
        ap.error("--fresh-flink and --warm: the warm-up runs need the clusters started first")

    def mech_flags(mech):
        return a.flags.split() if a.flags else FLAGS[mech]
    os.makedirs(a.workdir, exist_ok=True)
    out_path = a.out or os.path.join(a.workdir, "bench_dask.json")
    data = a.input or os.path.join(a.workdir, f"syn-{a.users}.tsv")
    if not a.input and not os.path.exists(data):
        subprocess.run([sys.executable, "-m", "beam_dpsu.pipelines.cli", "generate",
                        "--users", str(a.users),
                        "--output", data], check=True, cwd=ROOT)
    import dask
    if a.worker_malloc_trim == "unset":
        dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None})
    rows = []
    flink = {}  # runner -> cluster state
    try:
        for runner in a.runners.split(","):
            if runner.startswith("flink-"):
                flink[runner] = None if a.fresh_flink else start_flink(runner, a)
        run_all(a, data, rows, flink, mech_flags)
    finally:
        from beam_dpsu.pipelines import flink_cluster
        for state in flink.values():
            if state:
                flink_cluster.stop(state["dir"])
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


def start_flink(runner, a):
    """A session cluster for ``flink-TxS`` (T TaskManagers of S slots) under --workdir."""
    from beam_dpsu.pipelines import flink_cluster
    tms, slots = (int(x) for x in runner.split("-", 1)[1].split("x"))

    def scaled(size):  # per TaskManager: the 2-slot sizes × slots / 2
        return f"{int(size[:-1]) * slots // 2}{size[-1]}"
    folder = os.path.join(a.workdir, f"cluster-{runner}")
    if os.path.exists(os.path.join(folder, "cluster.json")):
        flink_cluster.stop(folder)
    return flink_cluster.start(folder, tms, slots, scaled(a.flink_process_size),
                               scaled(a.flink_task_off_heap))


def flink_rest(state, path):
    import urllib.request
    with urllib.request.urlopen(f"http://localhost:{state['rest_port']}{path}", timeout=10) as r:
        return json.load(r)


def flink_job_times(state, t0):
    """The last job's start and end (seconds after ``t0``) and its vertices' durations."""
    job = max(flink_rest(state, "/jobs/overview")["jobs"], key=lambda j: j["start-time"])
    detail = flink_rest(state, f"/jobs/{job['jid']}")
    vertices = sorted(((v["duration"] / 1000, v["name"][:60]) for v in detail["vertices"]),
                      reverse=True)
    return {"job_start_s": round(job["start-time"] / 1000 - t0, 1),
            "job_end_s": round(job["end-time"] / 1000 - t0, 1),
            "job_state": job["state"], "vertices": len(vertices),
            "longest_vertices_s": [(round(d, 1), n) for d, n in vertices[:6]],
            # when each vertex ended, after the job's start (in batch all start at once;
            # None: no end time yet when asked)
            "vertex_ends_s": sorted(((round((v["end-time"] - job["start-time"]) / 1000, 1)
                                      if v["end-time"] > 0 else None, v["name"][:60])
                                     for v in detail["vertices"]),
                                    key=lambda e: (e[0] is None, e[0] or 0))}


class Watchdog(threading.Thread):
    """Stops a run (see the module's docstring) and samples the 1-minute load every
    minute of it (``loads``)."""

    def __init__(self, a, runner, state, mon, groups, t0):
        super().__init__(daemon=True)
        self.a, self.runner, self.state, self.mon, self.groups = a, runner, state, mon, groups
        self.t0, self.stop, self.reason, self.loads = t0, False, None, []
        self.flag = os.path.join(a.workdir, "stop-run")

    def run(self):
        next_load = self.t0 + 60
        while not self.stop:
            now = time.time()
            if now >= next_load:
                self.loads.append(round(os.getloadavg()[0], 2))
                next_load += 60
            if self.reason is None:
                if self.a.run_timeout and now - self.t0 > self.a.run_timeout:
                    self.reason = f"--run-timeout {self.a.run_timeout:g} s"
                elif os.path.exists(self.flag):
                    os.remove(self.flag)
                    self.reason = f"{self.flag} at {now - self.t0:.0f} s"
                elif (self.runner == "prism" and self.a.prism_rss_limit_mb and
                      self.mon.group_sum.get("prism", 0) / 2**20 > self.a.prism_rss_limit_mb):
                    self.reason = (f"Prism RSS {self.mon.group_sum['prism'] / 2**20:.0f} MB > "
                                   f"{self.a.prism_rss_limit_mb:g} MB")
                if self.reason:
                    self.stopped_at = now
                    print(json.dumps({"stopping": self.runner, "reason": self.reason}),
                          flush=True)
                    self.end_run(kill=self.runner == "prism")
            elif now - self.stopped_at > (2 if self.runner == "prism" else 60):
                # Beam starts a killed Prism again (3 attempts): kill it again
                self.end_run(kill=True)
                self.stopped_at = now
            time.sleep(1.0)

    def end_run(self, kill):
        import signal
        if self.state and not kill:
            cancelled = 0
            try:
                for job in flink_rest(self.state, "/jobs/overview")["jobs"]:
                    if job["state"] not in ("FINISHED", "FAILED", "CANCELED"):
                        import urllib.request
                        urllib.request.urlopen(urllib.request.Request(
                            f"http://localhost:{self.state['rest_port']}/jobs/{job['jid']}"
                            "?mode=cancel", method="PATCH"), timeout=10).read()
                        cancelled += 1
            except Exception as e:  # noqa: BLE001
                print(json.dumps({"cancel_failed": str(e)}), flush=True)
            if cancelled:  # else no job reached Flink yet: the job server goes
                return
        group = "job_server" if self.state else "prism" if self.runner == "prism" else None
        for pid in (self.groups[group]() if group else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def finish(self):
        self.stop = True
        self.join()


def flink_times_or_error(state, t0):
    try:
        return flink_job_times(state, t0)
    except Exception as e:  # noqa: BLE001 -- e.g. no job reached the cluster
        return {"flink_rest_error": str(e)[:200]}


def run_all(a, data, rows, flink, mech_flags):
    import psutil
    from distributed import Client, LocalCluster
    from beam_dpsu.pipelines import select_partitions
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, memory_limit=a.memory_limit) as cluster, Client(cluster) as client:
        def runner_flags(runner):
            if runner in flink:
                from beam_dpsu.pipelines import flink_cluster
                return flink_cluster.flags(flink[runner]) + ["--parallelism=2"]
            return {"direct": ["--runner=DirectRunner"], "prism": ["--runner=PrismRunner"]}.get(
                runner, ["--runner=DaskRunner", f"--dask_client_address={cluster.scheduler_address}"])

        def select(mech, runner, out):
            select_partitions.run(["--input", data, "--output", out, "--overwrite",
                                   "--mechanism", mech, "--insecure-test-seed", "1",
                                   "--quiet"] + mech_flags(mech) + runner_flags(runner))
        for mech in a.mechanisms.split(","):
            released = {}
            if a.warm:
                for runner in a.runners.split(","):
                    select(mech, runner, os.path.join(a.workdir, f"{mech}-{runner}-warm-up"))
            for rep in range(a.repeats):
                for runner in a.runners.split(","):
                    out = os.path.join(a.workdir, f"{mech}-{runner}-{rep}")
                    if a.fresh_flink and runner in flink:
                        flink[runner] = start_flink(runner, a)
                    if runner == "dask" and not a.warm:
                        client.restart()
                    pid_of = client.run(os.getpid)  # worker address -> pid
                    worker_pids = sorted(pid_of.values())
                    state = flink.get(runner)
                    tm_pids = state["taskmanagers"] if state else []

                    def sdk_workers(state=state):
                        from beam_dpsu.pipelines import flink_cluster
                        pool = flink_cluster.read_state(state["dir"])["pool"]
                        return [c.pid for c in psutil.Process(pool).children(recursive=True)]
                    def children(word):  # the launcher's child processes naming ``word``
                        def pids():
                            found = []
                            for c in psutil.Process().children(recursive=True):
                                try:
                                    if word in " ".join(c.cmdline()):
                                        found.append(c.pid)
                                except psutil.Error:
                                    pass
                            return found
                        return pids
                    groups = ({"sdk": sdk_workers, "job_server": children(
                        f"localhost:{state['rest_port']}")} if state else
                        {"prism": children("prism")} if runner == "prism" else {})
                    mon = PeakRss([os.getpid()] + worker_pids + tm_pids, groups)
                    mon.start()
                    dmem = DaskMemory(client, pid_of) if runner == "dask" else None
                    if dmem:
                        dmem.start()
                    load = os.getloadavg()[0]
                    t0 = time.time()
                    guard = Watchdog(a, runner, state, mon, groups, t0)
                    guard.start()
                    outcome = "ok"
                    try:
                        select(mech, runner, out)
                    except Exception as e:  # noqa: BLE001 -- recorded, the others go on
                        outcome = (f"stopped: {guard.reason}; " if guard.reason else
                                   "failed: ") + (str(e).strip().splitlines() or [""])[-1][:300]
                    wall = time.time() - t0
                    guard.finish()
                    if guard.reason and outcome == "ok":
                        outcome = f"stopped: {guard.reason} (the run ended anyway)"
                    mon.finish()
                    if dmem:
                        dmem.finish()
                    items = []
                    if outcome == "ok":
                        items = open(out + "-items-00000-of-00001").read().split()
                        released[runner] = items
                    if state:
                        row_flink = {
                            "taskmanager_peak_rss_mb": [round(mon.peak[p] / 2**20)
                                                        for p in tm_pids],
                            "sdk_worker_peak_rss_mb": round(mon.group_max["sdk"] / 2**20),
                            "sdk_workers_peak_sum_mb": round(mon.group_sum["sdk"] / 2**20),
                            "taskmanager_cpu_s": [mon.cpu[p] for p in tm_pids],
                            **flink_times_or_error(state, t0)}
                        if a.fresh_flink:
                            from beam_dpsu.pipelines import flink_cluster
                            flink_cluster.stop(state["dir"])
                            flink[runner] = None
                    row = {"mechanism": mech, "runner": runner, "repeat": rep,
                           "outcome": outcome,
                           "wall_s": round(wall, 2),
                           "released": len(items) if outcome == "ok" else None,
                           "input": data, "warm": a.warm,
                           "worker_malloc_trim": a.worker_malloc_trim,
                           "load_1min_before": load,
                           "launcher_peak_rss_mb": round(mon.peak[os.getpid()] / 2**20),
                           "load_1min_during": guard.loads,
                           "children_peak_rss_mb": round(mon.group_sum[
                               "job_server" if state else "prism"] / 2**20)
                           if runner == "prism" or state else None,
                           "launcher_cpu_s": mon.cpu[os.getpid()],
                           "worker_cpu_s": [mon.cpu[p] for p in worker_pids],
                           "launcher_user_sys_faults": mon.split[os.getpid()],
                           "worker_user_sys_faults": [mon.split[p] for p in worker_pids],
                           "worker_peak_rss_mb": [round(mon.peak[p] / 2**20)
                                                  for p in worker_pids] if runner == "dask"
                           else None,
                           "worker_peak_managed_mb": dmem.peaks_mb(dmem.managed, worker_pids)
                           if dmem else None,
                           "worker_peak_spilled_mb": dmem.peaks_mb(dmem.spilled, worker_pids)
                           if dmem else None,
                           **(row_flink if state else {})}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            if len(released) >= 2:
                first = next(iter(released.values()))
                rows.append({"mechanism": mech, "runners": sorted(released),
                             "same_release": all(r == first for r in released.values())})
                print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
