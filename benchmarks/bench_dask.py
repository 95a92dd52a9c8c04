"""DirectRunner against DaskRunner (2 worker processes, 1 thread each), and Prism, on
synthetic users.

Usage (from the repository root, PYTHONPATH=$PWD; needs ``pip install '.[dask]'``):
    python benchmarks/bench_dask.py --input '/tmp/syn8/part-*' --repeats 3 \
        --mechanisms weighted-gaussian,sips,policy-gaussian --out /tmp/bench_dask.json
    # without --input: generates --users synthetic users into one file under --workdir

For each mechanism the runners alternate (direct, dask, direct, dask, ...); ``prism``
(``--runner=PrismRunner``, after ``beam-dpsu setup-engines prism``) runs Beam's Go
runner with its SDK worker in this process (LOOPBACK); its row adds the peak RSS of the
launcher's child processes (the Prism binary).
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

    def __init__(self, pids):
        super().__init__(daemon=True)
        import psutil
        self.procs = [psutil.Process(p) for p in pids]
        self.peak = {p.pid: 0 for p in self.procs}
        self.children_peak = 0  # the launcher's child processes, summed (Prism)
        self.cpu0 = {p.pid: self._cpu(p) for p in self.procs}
        self.split0 = {p.pid: self._split(p) for p in self.procs}
        self.stop = False

    @staticmethod
    def _cpu(p):
        t = p.cpu_times()
        return t.user + t.system

    @staticmethod
    def _split(p):
        t = p.cpu_times()
        try:
            with open(f"/proc/{p.pid}/stat") as f:
                faults = int(f.read().rsplit(")", 1)[1].split()[7])
        except OSError:
            faults = 0
        return t.user, t.system, faults

    def run(self):
        import psutil
        launcher = psutil.Process(os.getpid())
        while not self.stop:
            for p in self.procs:
                try:
                    self.peak[p.pid] = max(self.peak[p.pid], p.memory_info().rss)
                except Exception:
                    pass
            total = 0
            for child in launcher.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except Exception:
                    pass
            self.children_peak = max(self.children_peak, total)
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
    ap.add_argument("--worker-malloc-trim", choices=("dask", "unset"), default="dask",
                    help="dask: the workers get Dask's default MALLOC_TRIM_THRESHOLD_=65536; "
                         "unset: they start without it")
    a = ap.parse_args()

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
    from distributed import Client, LocalCluster
    from beam_dpsu.pipelines import select_partitions
    if a.worker_malloc_trim == "unset":
        dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None})
    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, memory_limit=a.memory_limit) as cluster, Client(cluster) as client:
        def runner_flags(runner):
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
                    if runner == "dask" and not a.warm:
                        client.restart()
                    pid_of = client.run(os.getpid)  # worker address -> pid
                    worker_pids = sorted(pid_of.values())
                    mon = PeakRss([os.getpid()] + worker_pids)
                    mon.start()
                    dmem = DaskMemory(client, pid_of) if runner == "dask" else None
                    if dmem:
                        dmem.start()
                    load = os.getloadavg()[0]
                    t0 = time.time()
                    select(mech, runner, out)
                    wall = time.time() - t0
                    mon.finish()
                    if dmem:
                        dmem.finish()
                    items = open(out + "-items-00000-of-00001").read().split()
                    released[runner] = items
                    row = {"mechanism": mech, "runner": runner, "repeat": rep,
                           "wall_s": round(wall, 2), "released": len(items),
                           "input": data, "warm": a.warm,
                           "worker_malloc_trim": a.worker_malloc_trim,
                           "load_1min_before": load,
                           "launcher_peak_rss_mb": round(mon.peak[os.getpid()] / 2**20),
                           "children_peak_rss_mb": round(mon.children_peak / 2**20)
                           if runner == "prism" else None,
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
                           if dmem else None}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            if len(released) >= 2:
                first = next(iter(released.values()))
                rows.append({"mechanism": mech, "runners": sorted(released),
                             "same_release": all(r == first for r in released.values())})
                print(json.dumps(rows[-1]), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
