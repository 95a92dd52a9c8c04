"""A release on a local Flink session cluster with a fault in the middle of it.

    python benchmarks/flink_faults.py --input /abs/path/data.tsv[.gz] \
        --fault taskmanager|worker-pool|none [--taskmanagers 1 --slots 2] \
        [--mechanism sips] [--seed 9] [--timeout 900]

Starts a cluster (``beam-dpsu flink-cluster start`` in a temporary folder: a JobManager,
the TaskManagers, an EXTERNAL worker pool), releases the input on the FnApiRunner and
then on the cluster under the same test seed. With ``--fault taskmanager`` it SIGKILLs
the TaskManager running the job once the job has finished its first tasks and starts a
replacement (as a cluster manager would); with ``--fault worker-pool`` it SIGKILLs the
worker pool and its SDK workers right after the pool has started a worker (before the
worker connects to its TaskManager) and starts the pool again on its port. It prints one
line: the outcome (the command's exit status, whether the release equals the
FnApiRunner's, whether any release file was left), the wall times, and whether Flink
restarted the job. The cluster is stopped at the end, whatever happens. The suite runs
the TaskManager case on 30,000 users (``tests/test_flink_cluster.py``); at 1M users use
``--process-size 3500m --task-off-heap 768m`` (the defaults).
"""
import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from beam_dpsu.pipelines import flink_cluster, worker_pool


def rest(state, path):
    with urllib.request.urlopen(f"http://localhost:{state['rest_port']}{path}", timeout=5) as r:
        return json.load(r)


def release(cmd, out):
    start = time.time()
    done = subprocess.Popen(cmd + ["--output", out], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return done, start


def lines(out):
    path = out + "-items-00000-of-00001"
    return open(path, encoding="utf-8").read().splitlines() if os.path.exists(path) else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True)
    p.add_argument("--fault", choices=["taskmanager", "worker-pool", "none"], required=True)
    p.add_argument("--taskmanagers", type=int, default=1)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--process-size", default="3500m")
    p.add_argument("--task-off-heap", default="768m")
    p.add_argument("--mechanism", default="sips")
    p.add_argument("--seed", default="9")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--parallelism", type=int, default=None,
                   help="the job's (default: TaskManagers × slots)")
    args = p.parse_args()
    folder = tempfile.mkdtemp(prefix="flink-faults-")
    cmd = [sys.executable, "-m", "beam_dpsu.pipelines.cli", "select", "--input",
           os.path.abspath(args.input), "--mechanism", args.mechanism, "--epsilon", "1",
           "--delta", "1e-6", "--insecure-test-seed", args.seed, "--quiet"]
    t = time.time()
    direct = subprocess.run(cmd + ["--output", os.path.join(folder, "direct")],
                            capture_output=True, text=True)
    direct_s = time.time() - t
    if direct.returncode != 0:
        sys.exit(f"the FnApiRunner's release failed: {direct.stderr.strip()[-500:]}")
    want = lines(os.path.join(folder, "direct"))
    state = flink_cluster.start(os.path.join(folder, "cluster"), args.taskmanagers, args.slots,
                                args.process_size, args.task_off_heap)
    try:
        flags = flink_cluster.flags(state) + [
            f"--parallelism={args.parallelism or args.taskmanagers * args.slots}"]
        out = os.path.join(folder, "flink")
        proc, start = release(cmd + flags, out)
        job, killed = None, None
        while proc.poll() is None and args.fault != "none" and killed is None:
            for j in rest(state, "/jobs/overview")["jobs"]:
                if j["state"] == "RUNNING" and j["tasks"].get("finished", 0) >= 3:
                    job = j["jid"]
            if job is None:
                time.sleep(0.2)
                continue
            current = flink_cluster.read_state(state["dir"])
            if args.fault == "taskmanager":
                logs = [os.path.join(state["dir"], "log", f"taskmanager-{n + 1}.log")
                        for n in range(len(current["taskmanagers"]))]
                victim = [pid for pid, log in zip(current["taskmanagers"], logs)
                          if os.path.exists(log) and job in open(log).read()][0]
                os.kill(victim, signal.SIGKILL)
                killed = time.time() - start
                flink_cluster.add_taskmanager(state["dir"])
            else:
                # right after the pool starts its next worker, before the worker connects
                # (the window in which Beam's worker pool left the job waiting forever)
                journal = os.path.join(state["dir"], "workers.json")
                before = set(worker_pool.started_workers(journal))
                while proc.poll() is None and not set(worker_pool.started_workers(journal)) - before:
                    time.sleep(0.02)
                os.killpg(current["pool"], signal.SIGKILL)
                killed = time.time() - start
                flink_cluster.start_worker_pool(state["dir"])
        try:
            _, err = proc.communicate(timeout=args.timeout)
            status = proc.returncode
        except subprocess.TimeoutExpired:
            proc.terminate()  # a Ctrl-C: the command stops the job server it started
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            status = f"still running after {args.timeout:.0f} s (killed)"
        wall = time.time() - start
        restarted = bool(job and rest(state, f"/jobs/{job}/exceptions")[
            "exceptionHistory"]["entries"])
        got = lines(out)
        left = [os.path.basename(f) for f in glob.glob(out + "*")]
        print(f"fault={args.fault} killed_at={killed and round(killed, 1)}s status={status} "
              f"same_release={got == want} release_files={left} flink_restarted={restarted} "
              f"flink_wall={wall:.1f}s fnapi_wall={direct_s:.1f}s released={len(want)}")
        if status not in (0,):
            print("stderr:", " | ".join(err.strip().splitlines()[-2:]))
    finally:
        flink_cluster.stop(state["dir"])


if __name__ == "__main__":
    main()
