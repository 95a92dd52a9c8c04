"""Two source trees of the library on the same input, alternated: before/after figures.

Runs ``pipelines.select_partitions`` (DirectRunner; one worker, or with ``--workers 1 2``
also two worker processes) in a child process per run, with ``PYTHONPATH`` set to each named tree, alternating trees and mechanisms
round by round, and prints one line per run and a table of medians (wall, CPU of the
child, peak RSS).

    git archive 7112737 beam_dpsu pipelines | tar -x -C /tmp/base   # the tree before
    PYTHONPATH=. python benchmarks/bench_versions.py --input /tmp/syn100k.tsv.gz \\
        --tree base=/tmp/base --tree new=. --mechanisms weighted-gaussian policy-gaussian \\
        --repeats 2

ε = 3, δ = 1e-5, Δ0 = 100.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_scale as bs  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True)
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH (repeatable)")
    ap.add_argument("--mechanisms", nargs="+", default=["weighted-gaussian", "policy-gaussian"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workers", type=int, choices=(1, 2), nargs="+", default=[1],
                    help="1: one worker; 2: --direct_num_workers=2 "
                         "--direct_running_mode=multi_processing (both: alternated)")
    args = ap.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree)
    configs = [(m if w == 1 else f"{m} (2 workers)", t) for m in args.mechanisms
               for w in args.workers for t in trees]
    res = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for config, tree in configs:
                mech, two = config.split(" ")[0], config.endswith("(2 workers)")
                root = os.path.abspath(trees[tree])
                cmd = [sys.executable, "-c", bs.CHILD, "--input", args.input,
                       "--output", os.path.join(tmp, f"{tree}-{mech}-{two}-{r}"),
                       "--mechanism", mech, "--epsilon", "3", "--delta", "1e-5",
                       "--max-items-per-user", "100"] + (bs.TWO_WORKERS if two else [])
                c0, t0 = bs._children_cpu(), time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root,
                                      env=dict(os.environ, PYTHONPATH=root))
                wall, cpu = time.perf_counter() - t0, bs._children_cpu() - c0
                lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                if not lines:
                    raise RuntimeError(f"child failed: {proc.stderr[-3000:]}")
                s = json.loads(lines[0][len("RESULT "):])
                res[(config, tree)].append((wall, cpu, s["peak_rss_mib"]))
                print(json.dumps({"round": r, "tree": tree, "mechanism": config,
                                  "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                                  "released": s["num_released"]}), flush=True)
    print("\n| mechanism | tree | median wall s (min–max) | median CPU s | peak RSS MiB |\n"
          "|---|---|---|---|---|")
    for (mech, tree), runs in res.items():
        walls = [w for w, _, _ in runs]
        print(f"| {mech} | {tree} | {statistics.median(walls):.2f} ({min(walls):.2f}–"
              f"{max(walls):.2f}) | {statistics.median(c for _, c, _ in runs):.2f} | "
              f"{statistics.median(m for _, _, m in runs):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
