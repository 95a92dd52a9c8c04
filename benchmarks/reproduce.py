"""Released counts of the command-line pipeline against the authors' published means.

Runs ``beam-dpsu select`` (``beam_dpsu.pipelines.select_partitions.run``;
DirectRunner, fresh OS randomness each run) N times per configuration on the
shared datasets and prints a Markdown table of mean, standard deviation and the
authors' figure (also written to ``--output`` when given).

    python benchmarks/reproduce.py [--runs 5] [--data ../shared/data] [--only NAME ...]
        [--output FILE]

The datasets are not part of the project; point ``--data`` at a folder holding
them (``commits-rails.pairs.tsv.gz`` and the others).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from beam_dpsu.pipelines import select_partitions  # noqa: E402

E10 = math.exp(-10)
# (label, dataset, mechanism flags, authors' mean of 5 runs, source)
CONFIGS = [
    ("wg-300", "commits-rails", ["--mechanism", "weighted-gaussian", "--epsilon", "3",
                                 "--delta", repr(E10), "--max-items-per-user", "300"], 971.0),
    ("wg-100", "commits-rails", ["--mechanism", "weighted-gaussian", "--epsilon", "3",
                                 "--delta", repr(E10), "--max-items-per-user", "100"], 921.4),
    ("wl-10", "commits-rails", ["--mechanism", "weighted-laplace", "--epsilon", "3",
                                "--delta", repr(E10), "--max-items-per-user", "10"], 302.6),
    ("cg-50", "commits-rails", ["--mechanism", "count-gaussian", "--epsilon", "3",
                                "--delta", repr(E10), "--max-items-per-user", "50"], 701.8),
    ("wg-zcdp-100", "commits-rails", ["--mechanism", "weighted-gaussian", "--rho", "0.1",
                                      "--delta", "1e-5", "--max-items-per-user", "100"], 588.0),
    ("sips", "commits-rails", ["--mechanism", "sips", "--rho", "0.1", "--delta", "1e-5",
                               "--max-items-per-user", "100", "--rounds", "3",
                               "--ratio", str(1 / 3)], 753.0),
    ("sips", "commits-ansible", ["--mechanism", "sips", "--rho", "0.1", "--delta", "1e-5",
                                 "--max-items-per-user", "100", "--rounds", "3",
                                 "--ratio", str(1 / 3)], 638.0),
    ("sips", "reddit-titles", ["--mechanism", "sips", "--rho", "0.1", "--delta", "1e-5",
                               "--max-items-per-user", "100", "--rounds", "3",
                               "--ratio", str(1 / 3)], 408.0),
    ("sips-1-round", "commits-rails", ["--mechanism", "sips", "--rho", "0.1", "--delta", "1e-5",
                                       "--max-items-per-user", "100", "--rounds", "1"], 588.0),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--only", nargs="*", help="labels to run (default: all)")
    p.add_argument("--output", help="also write the table to this file")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, dataset, flags, authors in CONFIGS:
            if args.only and label not in args.only:
                continue
            path = os.path.join(args.data, dataset + ".pairs.tsv.gz")
            counts, walls = [], []
            for run in range(args.runs):
                prefix = os.path.join(tmp, f"{label}-{dataset}-{run}")
                summary = select_partitions.run(["--input", path, "--output", prefix] + flags)
                counts.append(summary["num_released"])
                walls.append(summary["PRIVATE_run_details"]["wall_seconds"])
            mean = statistics.mean(counts)
            sd = statistics.stdev(counts) if len(counts) > 1 else 0.0
            dev = (mean - authors) / authors
            rows.append((label, dataset, " ".join(flags), mean, sd, authors, dev,
                         statistics.median(walls), counts))
            print(json.dumps({"config": label, "dataset": dataset, "mean": mean, "sd": round(sd, 1),
                              "authors": authors, "deviation": round(dev, 4),
                              "counts": counts}), flush=True)
    lines = [
        "# Released items: beam_dpsu vs the authors' published means",
        "",
        f"Command: `python benchmarks/reproduce.py --runs {args.runs}` "
        f"(DirectRunner, fresh OS randomness per run, {time.strftime('%Y-%m-%d')}).",
        "",
        "| config | dataset | flags | mean | sd | authors | deviation | median wall s | counts |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, dataset, flags, mean, sd, authors, dev, wall, counts in rows:
        lines.append(f"| {label} | {dataset} | `{flags}` | {mean:.1f} | {sd:.1f} | {authors} | "
                     f"{dev:+.1%} | {wall:.2f} | {counts} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.output:
        pathlib.Path(args.output).write_text(table, encoding="utf-8")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
