"""Benchmark: what our transforms add inside a user's own pipeline.

A user's pipeline reads ``user<TAB>item`` lines with ``ReadFromText`` and a
``Map`` that splits each line: one ``(user, item)`` element per occurrence.
This script runs, alternating, in one process on the DirectRunner:

* ``read``: that read and split, then a trivial sink (the baseline: no DP);
* ``read+dp``: the same plus ``SelectPartitions(WeightedGaussian(ε, δ, Δ0))``
  and ``WriteToText`` of the released items;
* optionally other variants named with ``--variants``.

It prints each run's wall and CPU time, then per variant the median wall time
and the ratio of medians against ``read`` (the named baseline). Wall times
include building and running the pipeline.

    python benchmarks/bench_embedded.py [--input PATH] [--repeats 5]

Default input: ``../shared/data/commits-rails.pairs.tsv.gz`` (2M lines).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from beam_dpsu.mechanisms import SelectPartitions, WeightedGaussian  # noqa: E402

DEFAULT_INPUT = ROOT.parent / "shared" / "data" / "commits-rails.pairs.tsv.gz"


def split_line(line: str):
    user, _, item = line.partition("\t")
    return user, item


def build_read(p, path):
    return (p
            | "Read" >> beam.io.ReadFromText(path)
            | "Split" >> beam.Map(split_line))


def variant_read(p, path, out):
    build_read(p, path) | "Sink" >> beam.Filter(lambda kv: False)


def variant_read_dp(p, path, out, epsilon=3.0, delta=1e-5, max_items=100):
    (build_read(p, path)
     | "DP" >> SelectPartitions(WeightedGaussian(epsilon, delta, max_items))
     | "Write" >> beam.io.WriteToText(out))


VARIANTS = {"read": variant_read, "read+dp": variant_read_dp}


def run_once(name, path, tmp):
    out = os.path.join(tmp, f"{name}-{time.time_ns()}")
    t0, c0 = time.perf_counter(), time.process_time()
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
        VARIANTS[name](p, path, out)
    return time.perf_counter() - t0, time.process_time() - c0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", default=str(DEFAULT_INPUT))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = ap.parse_args(argv)
    if "read" not in args.variants:
        args.variants.insert(0, "read")
    walls = {v: [] for v in args.variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for v in args.variants:
                wall, cpu = run_once(v, args.input, tmp)
                walls[v].append(wall)
                print(f"round {r}: {v:12s} wall {wall:6.2f} s  cpu {cpu:6.2f} s", flush=True)
    base = statistics.median(walls["read"])
    print(f"\n| variant | median wall s | min | max | ratio to read (medians) |\n|---|---|---|---|---|")
    for v in args.variants:
        m = statistics.median(walls[v])
        print(f"| {v} | {m:.2f} | {min(walls[v]):.2f} | {max(walls[v]):.2f} | {m / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
