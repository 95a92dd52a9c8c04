"""DirectRunner against DaskRunner (2 worker processes, 1 thread each) on synthetic users.

Usage (from the repository root, PYTHONPATH=$PWD):
    python benchmarks/bench_dask.py --users 100000 --repeats 1 \
        --mechanisms weighted-gaussian,sips,policy-gaussian --out benchmarks/results/dask.json

For each mechanism the two runners alternate (direct, dask, direct, dask, ...).
Wall time is that of the whole command-line run (select_partitions.run), in
this process; peak memory is the maximum RSS of this (launching) process and,
for Dask, the peak RSS of each worker process (sampled every 0.2 s with
psutil) and of the scheduler (here, in this process: LocalCluster). Every run
uses --insecure-test-seed 1 and the released sets are compared.
"""
import argparse
import json
import os
import resource
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
    def __init__(self, pids):
        super().__init__(daemon=True)
        import psutil
        self.procs = [psutil.Process(p) for p in pids]
        self.peak = {p.pid: 0 for p in self.procs}
        self.stop = False

    def run(self):
        while not self.stop:
            for p in self.procs:
                try:
                    self.peak[p.pid] = max(self.peak[p.pid], p.memory_info().rss)
                except Exception:
                    pass
            time.sleep(0.2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=100000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--mechanisms", default="weighted-gaussian,sips,policy-gaussian")
    ap.add_argument("--workdir", default="/tmp/bench_dask")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "dask.json"))
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    data = os.path.join(a.workdir, f"syn-{a.users}.tsv")
    if not os.path.exists(data):
        subprocess.run([sys.executable, "-m", "pipelines.generate", "--users", str(a.users),
                        "--output", data], check=True, cwd=ROOT)
    from distributed import LocalCluster
    from pipelines import select_partitions
    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        worker_pids = [w.process.pid for w in cluster.workers.values()]
        for mech in a.mechanisms.split(","):
            released = {}
            for rep in range(a.repeats):
                for runner in ("direct", "dask"):
                    flags = (["--runner=DirectRunner"] if runner == "direct" else
                             ["--runner=DaskRunner",
                              f"--dask_client_address={cluster.scheduler_address}"])
                    out = os.path.join(a.workdir, f"{mech}-{runner}-{rep}")
                    mon = PeakRss([os.getpid()] + worker_pids)
                    mon.start()
                    t0 = time.time()
                    select_partitions.run(["--input", data, "--output", out, "--overwrite",
                                           "--mechanism", mech, "--insecure-test-seed", "1"]
                                          + FLAGS[mech] + flags)
                    wall = time.time() - t0
                    mon.stop = True
                    mon.join()
                    items = open(out + "-items-00000-of-00001").read().split()
                    released[runner] = items
                    row = {"mechanism": mech, "runner": runner, "repeat": rep,
                           "wall_s": round(wall, 2), "released": len(items),
                           "launcher_peak_rss_mb": round(
                               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                           "worker_peak_rss_mb": [round(mon.peak[p] / 2**20)
                                                  for p in worker_pids] if runner == "dask"
                           else None}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            rows.append({"mechanism": mech, "same_release": released["direct"] == released["dask"]})
            print(json.dumps(rows[-1]), flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
