"""DP-SIPS (I = 3) against one-round Weighted Gaussian (zCDP), same data, one process.

Runs the two pipelines alternately on the DirectRunner (ρ = 0.1, δ = 1e-5,
Δ0 = 100, r = 1/3), reading the same file, and prints each wall time, the
medians and the ratio sips / weighted-gaussian (target: at most 2.5 on
commits-rails). The baseline is the one-round Weighted Gaussian of this
library, run in the same process.

    python benchmarks/bench_sips.py [--input ../shared/data/commits-rails.pairs.tsv.gz] [--repeats 5]

For time and peak memory at 100,000 synthetic users use
``python benchmarks/bench_scale.py --users 100000 --mechanisms weighted-gaussian sips``.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines import select_partitions  # noqa: E402

COMMON = ["--rho", "0.1", "--delta", "1e-5", "--max-items-per-user", "100"]
RUNS = {
    "weighted-gaussian": ["--mechanism", "weighted-gaussian"] + COMMON,
    "sips": ["--mechanism", "sips", "--rounds", "3", "--ratio", str(1 / 3)] + COMMON,
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", default=str(ROOT.parent / "shared" / "data" /
                                          "commits-rails.pairs.tsv.gz"))
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    times = {name: [] for name in RUNS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, flags in RUNS.items():
                start = time.perf_counter()
                s = select_partitions.run(["--input", args.input, "--output",
                                           os.path.join(tmp, f"{name}-{rep}")] + flags)
                wall = time.perf_counter() - start
                times[name].append(wall)
                print(json.dumps({"run": rep, "mechanism": name, "seconds": round(wall, 3),
                                  "released": s["num_released"]}), flush=True)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(json.dumps({"median_seconds": {k: round(v, 3) for k, v in med.items()},
                      "ratio_sips_over_weighted_gaussian":
                          round(med["sips"] / med["weighted-gaussian"], 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
