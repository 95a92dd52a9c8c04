"""Benchmark: what our transforms add inside a user's own pipeline.

A user's pipeline reads ``user<TAB>item`` lines with ``ReadFromText`` and a
``Map`` that splits each line: one ``(user, item)`` element per occurrence.
This script runs, alternating, in one process on Beam's FnApiRunner (what the
DirectRunner runs locally, without its Prism attempt):

* ``read``: that read and split, then a trivial sink (the baseline: no DP);
* ``read+dp``: the same plus ``SelectPartitions(WeightedGaussian(ε, δ, Δ0))``
  and ``WriteToText`` of the released items;
* ``read+dp-per-user``: ``read+dp`` with the per-user path (``PerUserItemCounts``
  then ``SelectPartitions(..., per_user=True)``) instead of the blocks of arrays
  ``SelectPartitions`` runs on pairs;
* ``read+dp-bundle-dofn``: ``read+dp`` with the alternative per-user design
  (``PerUserItemCounts(design='bundle-dofn')``: a DoFn aggregating each
  bundle's occurrences in its own dict), to compare the designs;
* ``read+pipelinedp``: the same pipeline with PipelineDP's ``SelectPartitions``
  (Gaussian thresholding, ε, δ, max_partitions_contributed = Δ0) instead of
  ours, when ``pipeline_dp`` is importable (``--variants`` only; slow).

It prints each run's wall and CPU time (of this process: the DirectRunner runs
in it), then per variant the median wall time (min, max), the median CPU time
and the ratios of medians against ``read`` (the named baseline). Wall times
include building and running the pipeline.

    python benchmarks/bench_embedded.py [--input PATH] [--repeats 5] [--warmup 1]

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

from beam_dpsu.dp.mechanisms.histogram_threshold import WeightedGaussian  # noqa: E402
from beam_dpsu.transforms.bounding import PerUserItemCounts  # noqa: E402
from beam_dpsu.transforms.select import SelectPartitions  # noqa: E402

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


def variant_read_dp_per_user(p, path, out, epsilon=3.0, delta=1e-5, max_items=100):
    (build_read(p, path)
     | "PerUser" >> PerUserItemCounts()
     | "DP" >> SelectPartitions(WeightedGaussian(epsilon, delta, max_items), per_user=True)
     | "Write" >> beam.io.WriteToText(out))


def variant_read_dp_bundle_dofn(p, path, out, epsilon=3.0, delta=1e-5, max_items=100):
    (build_read(p, path)
     | "PerUser" >> PerUserItemCounts(design="bundle-dofn")
     | "DP" >> SelectPartitions(WeightedGaussian(epsilon, delta, max_items), per_user=True)
     | "Write" >> beam.io.WriteToText(out))


def variant_read_pipelinedp(p, path, out, epsilon=3.0, delta=1e-5, max_items=100):
    import pipeline_dp
    from pipeline_dp.private_beam import MakePrivate, SelectPartitions as PdpSelect
    from pipeline_dp.private_beam import SelectPartitionsParams
    budget = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    private = (build_read(p, path)
               | "Private" >> MakePrivate(budget_accountant=budget,
                                          privacy_id_extractor=lambda kv: kv[0]))
    params = SelectPartitionsParams(
        max_partitions_contributed=max_items,
        partition_selection_strategy=pipeline_dp.PartitionSelectionStrategy.GAUSSIAN_THRESHOLDING)
    selected = private | "DP" >> PdpSelect(params, partition_extractor=lambda kv: kv[1],
                                          label="SelectPartitions")
    budget.compute_budgets()
    selected | "Write" >> beam.io.WriteToText(out)


VARIANTS = {"read": variant_read, "read+dp": variant_read_dp,
            "read+dp-per-user": variant_read_dp_per_user,
            "read+dp-bundle-dofn": variant_read_dp_bundle_dofn,
            "read+pipelinedp": variant_read_pipelinedp}
DEFAULT_VARIANTS = ["read", "read+dp", "read+dp-bundle-dofn"]


def run_once(name, path, tmp):
    out = os.path.join(tmp, f"{name}-{time.time_ns()}")
    t0, c0 = time.perf_counter(), time.process_time()
    # Beam's DirectRunner would try Prism first where it can download it: every
    # variant runs on the FnApiRunner, as the library's command lines do.
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as p:
        VARIANTS[name](p, path, out)
    return time.perf_counter() - t0, time.process_time() - c0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", default=str(DEFAULT_INPUT))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1,
                    help="uncounted runs of 'read' first (default 1): the first pipeline "
                         "of a process pays one-time costs")
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    args = ap.parse_args(argv)
    if "read" not in args.variants:
        args.variants.insert(0, "read")
    walls = {v: [] for v in args.variants}
    cpus = {v: [] for v in args.variants}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.warmup):  # one-time costs of the process (imports, caches)
            wall, cpu = run_once("read", args.input, tmp)
            print(f"warm-up: read wall {wall:6.2f} s  cpu {cpu:6.2f} s (not counted)", flush=True)
        for r in range(args.repeats):
            for v in args.variants:
                wall, cpu = run_once(v, args.input, tmp)
                walls[v].append(wall)
                cpus[v].append(cpu)
                print(f"round {r}: {v:12s} wall {wall:6.2f} s  cpu {cpu:6.2f} s", flush=True)
    base = statistics.median(walls["read"])
    base_cpu = statistics.median(cpus["read"])
    print(f"\n| variant | median wall s | min | max | median CPU s | wall ratio to read "
          f"(medians) | CPU ratio to read |\n|---|---|---|---|---|---|---|")
    for v in args.variants:
        m, c = statistics.median(walls[v]), statistics.median(cpus[v])
        print(f"| {v} | {m:.2f} | {min(walls[v]):.2f} | {max(walls[v]):.2f} | {c:.2f} | "
              f"{m / base:.2f} | {c / base_cpu:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
