"""Wall time and peak memory of select_partitions on synthetic data at scale.

Generates N synthetic users (Synthetic_80M recipe, ``pipelines.generate``) once,
then runs each requested mechanism in its own child process (so each peak RSS
is that pipeline's alone) on the DirectRunner, and prints one JSON line per run
plus a Markdown table.

    python benchmarks/bench_scale.py [--users 100000] [--mechanisms weighted-gaussian sips]
        [--max-items-per-user 100] [--keep PATH]

Peak memory is the child's maximum resident set size (``ru_maxrss``).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

FLAGS = {
    "weighted-gaussian": ["--epsilon", "1", "--delta", "1e-6"],
    "count-gaussian": ["--epsilon", "1", "--delta", "1e-6"],
    "weighted-laplace": ["--epsilon", "1", "--delta", "1e-6"],
    "sips": ["--rho", "0.1", "--delta", "1e-5"],
    "policy-gaussian": ["--epsilon", "1", "--delta", "1e-6"],
    "gw": ["--epsilon", "1", "--delta", "1e-6"],
}

CHILD = r"""
import json, resource, sys, time
from pipelines import select_partitions
start = time.time()
summary = select_partitions.run(sys.argv[1:])
summary["child_wall_seconds"] = time.time() - start
summary["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps(summary))
"""


def run_child(args):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", CHILD] + args, capture_output=True, text=True,
                          env=env, cwd=str(ROOT))
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"child failed: {proc.stderr[-2000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic DATA (not of a "
                   "release: every pipeline run draws a fresh key)")
    p.add_argument("--mechanisms", nargs="+", default=["weighted-gaussian", "sips"])
    p.add_argument("--max-items-per-user", type=int, default=100)
    p.add_argument("--keep", help="reuse/keep the generated data at this path")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = args.keep or os.path.join(tmp, "synthetic.tsv.gz")
        if not os.path.exists(data):
            start = time.time()
            from beam_dpsu import synthetic
            lines = synthetic.write_tsv(data, args.users, args.seed)
            print(json.dumps({"generated": data, "users": args.users, "lines": lines,
                              "seconds": round(time.time() - start, 1)}), flush=True)
        rows = []
        for name in args.mechanisms:
            flags = ["--mechanism", name] + FLAGS.get(name, []) + (
                ["--max-items-per-user", str(args.max_items_per_user)]
                if name not in ("gw", "gw-kt") else [])
            s = run_child(["--input", data, "--output", os.path.join(tmp, name)] + flags)
            details = s["PRIVATE_run_details"]  # exact counts and timings: owner-only
            row = {"mechanism": name, "users": details["num_users"],
                   "released": s["num_released"], "pipeline_seconds": details["wall_seconds"],
                   "peak_rss_mib": round(s["peak_rss_mib"], 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| mechanism | users | released | pipeline s | peak RSS MiB |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mechanism']} | {r['users']} | {r['released']} | {r['pipeline_seconds']} | "
              f"{r['peak_rss_mib']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
