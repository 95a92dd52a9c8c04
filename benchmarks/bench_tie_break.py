"""Cost of GW's record-order tie-break: ``ReadUserItems(keep_order=True)`` against the default.

Runs the GW pipeline (read → ordered greedy policy → release) on the same input with
``tie_break='item-hash'`` (the baseline: the default reader) and with
``tie_break='first-occurrence'`` (the reader carries each user's first positions through
the merge), alternating, in one process, and prints the median wall times and their
ratio. Default input: synthetic users written to a temporary file.

    PYTHONPATH=. python benchmarks/bench_tie_break.py [--users 100000] [--repeats 2]
        [--input PATH]
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import statistics
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability import fn_api_runner as fn_runner

from beam_dpsu import synthetic
from beam_dpsu.mechanisms import SelectPartitions
from beam_dpsu.noise import RunKey
from beam_dpsu.ordered import GW
from beam_dpsu.textio import ReadUserItems


def run(path: str, tie_break: str) -> float:
    m = GW(3, math.exp(-10), tie_break=tie_break, variant="published")
    start = time.perf_counter()
    p = beam.Pipeline(runner=fn_runner.FnApiRunner(), options=PipelineOptions([]))
    _ = (p | ReadUserItems(path, keep_order=m.needs_record_order)
         | SelectPartitions(m, RunKey.fresh(), per_user=True)
         | beam.combiners.Count.Globally() | beam.Map(lambda n: None))
    p.run().wait_until_finish()
    return time.perf_counter() - start


def main():
    logging.getLogger().setLevel(logging.ERROR)
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--input", help="a user<TAB>item file instead of synthetic users")
    args = ap.parse_args()
    tmp = None
    path = args.input
    if path is None:
        tmp = tempfile.mkdtemp(prefix="bench_tie_")
        path = os.path.join(tmp, "synthetic.tsv.gz")
        lines = synthetic.write_tsv(path, args.users, seed=1)
        print(f"synthetic input: {args.users} users, {lines} lines", flush=True)
    try:
        walls = {"item-hash": [], "first-occurrence": []}
        for r in range(args.repeats):
            for tie in walls:
                walls[tie].append(run(path, tie))
                print(f"round {r}: {tie} {walls[tie][-1]:.1f} s", flush=True)
        base = statistics.median(walls["item-hash"])
        fo = statistics.median(walls["first-occurrence"])
        print(f"median wall: item-hash (baseline) {base:.1f} s, first-occurrence {fo:.1f} s, "
              f"ratio {fo / base:.2f}; load average {os.getloadavg()[0]:.2f}")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
