"""Benchmark: beam_dpsu against PipelineDP's partition selection, on one machine.

What it measures
----------------
In one Python process, on Beam's FnApiRunner (what the DirectRunner runs
locally, without its Prism attempt), on one ``user_id<TAB>item``
text file (default: the commits-rails data set, 2M lines, 6,817 users), with
ε = 3, δ = 1e-5 and Δ0 = max_items = max_partitions_contributed = 100:

1. ``ours-CG``: beam_dpsu ``CountGaussian`` (``ReadUserItems`` →
   ``SelectPartitions(..., per_user=True)``);
2. ``ours-WG``: beam_dpsu ``WeightedGaussian``, same pipeline;
3. ``pdp-GT``: PipelineDP's Gaussian thresholding partition selection
   (``DPEngine.select_partitions`` with
   ``PartitionSelectionStrategy.GAUSSIAN_THRESHOLDING`` and a
   ``NaiveBudgetAccountant``) through PipelineDP's ``BeamBackend``, the input
   read as a PipelineDP user would: ``ReadFromText`` and a ``Map`` splitting
   each line on its first tab;
4. optionally (``--with-pipelinedp-weighted``; slow) ``pdp-WG``: PipelineDP's
   ``PartitionSelectionStrategy.WEIGHTED_GAUSSIAN_THRESHOLDING``, same input.

The runs alternate (ours-CG, ours-WG, pdp-GT[, pdp-WG], then again) for
``--repeats`` rounds. Each run's wall time covers building the pipeline, running
it and waiting for it to finish (the released items are written with
``WriteToText`` into a temporary directory; counting their lines afterwards is
not timed). The script prints each run's wall time and number of released
items (and its process CPU time, which shows when other load on the machine
inflated a wall time), then per configuration the median wall time, the median
CPU time, the median released count, the ratios ours / PipelineDP of the
median wall times (target: ≤ 0.25), and the process's peak RSS
(``resource.getrusage``).

Every run draws fresh randomness (beam_dpsu: a fresh ``RunKey`` from the
operating system; PipelineDP: its own noise), so released counts vary slightly
between runs.

Install
-------
PipelineDP is NOT a dependency of beam_dpsu: install it into a separate
virtual environment used only for this benchmark::

    python3 -m venv /tmp/venv-bench
    /tmp/venv-bench/bin/pip install apache-beam numpy scipy pipeline-dp

Versions measured together without conflict (nothing needed pinning):
pipeline-dp 0.3.1 (with python-dp 1.1.5), apache-beam 2.77.0, numpy 2.4.6,
scipy 1.17.1, on Python 3.11.

Run
---
From the repository root (beam_dpsu is imported from the source tree)::

    PYTHONPATH=. /tmp/venv-bench/bin/python benchmarks/bench_pipelinedp.py \\
        [--input PATH] [--repeats 3] [--with-pipelinedp-weighted]

The default input is ``/work/shared/data/commits-rails.pairs.tsv.gz``; it is
read in place, never copied.
"""
from __future__ import annotations

import argparse
import glob
import logging
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_dpsu.dp.mechanisms.histogram_threshold import CountGaussian, WeightedGaussian
from beam_dpsu.transforms.select import SelectPartitions
from beam_dpsu.transforms.textio import ReadUserItems

try:
    import pipeline_dp
except ImportError:  # pragma: no cover - depends on the benchmark environment
    sys.exit("pipeline_dp is not installed: pip install pipeline-dp into a separate "
             "virtualenv (see this script's docstring)")

DEFAULT_INPUT = "/work/shared/data/commits-rails.pairs.tsv.gz"
TARGET_RATIO = 0.25


def _options() -> PipelineOptions:
    # Beam's DirectRunner would try Prism first where it can download it: both
    # libraries run on the FnApiRunner, as beam_dpsu's command lines do.
    return PipelineOptions(["--runner=FnApiRunner"])


def split_first_tab(line: str) -> Tuple[str, str]:
    """``'user<TAB>item'`` → ``('user', 'item')`` (the item may contain tabs)."""
    user, item = line.split("\t", 1)
    return user, item


def _privacy_id(row):
    return row[0]


def _partition_key(row):
    return row[1]


def run_ours(mechanism_cls, path: str, epsilon: float, delta: float, max_items: int,
             out_prefix: str) -> None:
    mechanism = mechanism_cls(epsilon=epsilon, delta=delta, max_items=max_items)
    with beam.Pipeline(options=_options()) as p:
        items = p | "Read" >> ReadUserItems(path) | "DPSU" >> SelectPartitions(
            mechanism, per_user=True)
        items | "Write" >> beam.io.WriteToText(out_prefix)


def run_pipelinedp(strategy, path: str, epsilon: float, delta: float, max_items: int,
                   out_prefix: str) -> None:
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
    params = pipeline_dp.SelectPartitionsParams(
        max_partitions_contributed=max_items, partition_selection_strategy=strategy)
    extractors = pipeline_dp.DataExtractors(privacy_id_extractor=_privacy_id,
                                            partition_extractor=_partition_key)
    with beam.Pipeline(options=_options()) as p:
        rows = (p
                | "ReadText" >> beam.io.ReadFromText(path)
                | "SplitTab" >> beam.Map(split_first_tab))
        partitions = engine.select_partitions(rows, params, extractors)
        accountant.compute_budgets()  # must happen before the pipeline runs
        partitions | "Write" >> beam.io.WriteToText(out_prefix)


def count_output_lines(out_prefix: str) -> int:
    n = 0
    for shard in glob.glob(out_prefix + "*"):
        with open(shard, "rb") as f:
            for _ in f:
                n += 1
    return n


def timed_run(fn: Callable[[str], None]) -> Tuple[float, float, int]:
    """Runs ``fn(out_prefix)``; returns (wall s, process CPU s, released item count)."""
    tmp = tempfile.mkdtemp(prefix="bench_pipelinedp_")
    try:
        prefix = os.path.join(tmp, "released")
        t0, c0 = time.perf_counter(), time.process_time()
        fn(prefix)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return wall, cpu, count_output_lines(prefix)
    finally:
        for _ in range(3):  # Beam may still be removing its own beam-temp-* directory
            shutil.rmtree(tmp, ignore_errors=True)
            if not os.path.exists(tmp):
                break
            time.sleep(0.5)


def peak_rss_mib() -> Tuple[float, float]:
    """Peak RSS of this process and of its waited-for children, MiB (Linux: ru_maxrss in KiB)."""
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return self_kib / 1024.0, child_kib / 1024.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", default=DEFAULT_INPUT,
                    help="user_id<TAB>item text file (.gz ok); default: %(default)s")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (default %(default)s)")
    ap.add_argument("--epsilon", type=float, default=3.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--max-items", type=int, default=100,
                    help="Δ0 = max_partitions_contributed (default %(default)s)")
    ap.add_argument("--with-pipelinedp-weighted", action="store_true",
                    help="also run PipelineDP's weighted Gaussian selection (slow)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if not os.path.exists(args.input):
        ap.error(f"input not found: {args.input}")
    logging.getLogger().setLevel(logging.ERROR)

    eps, delta, k, path = args.epsilon, args.delta, args.max_items, args.input
    PSS = pipeline_dp.PartitionSelectionStrategy
    configs: List[Tuple[str, Callable[[str], None]]] = [
        ("ours-CG", lambda out: run_ours(CountGaussian, path, eps, delta, k, out)),
        ("ours-WG", lambda out: run_ours(WeightedGaussian, path, eps, delta, k, out)),
        ("pdp-GT", lambda out: run_pipelinedp(PSS.GAUSSIAN_THRESHOLDING, path, eps, delta, k,
                                              out)),
    ]
    if args.with_pipelinedp_weighted:
        if hasattr(PSS, "WEIGHTED_GAUSSIAN_THRESHOLDING"):
            configs.append(("pdp-WG", lambda out: run_pipelinedp(
                PSS.WEIGHTED_GAUSSIAN_THRESHOLDING, path, eps, delta, k, out)))
        else:
            print("note: this pipeline_dp has no weighted Gaussian selection; skipped")

    print(f"input={path} epsilon={eps:g} delta={delta:g} max_items={k} "
          f"repeats={args.repeats} runner=FnApiRunner")
    print(f"python {sys.version.split()[0]}, apache-beam {beam.__version__}, "
          f"pipeline-dp {getattr(pipeline_dp, '__version__', '?')}, "
          f"numpy {__import__('numpy').__version__}")
    times: Dict[str, List[float]] = {name: [] for name, _ in configs}
    cpus: Dict[str, List[float]] = {name: [] for name, _ in configs}
    released: Dict[str, List[int]] = {name: [] for name, _ in configs}
    for r in range(1, args.repeats + 1):
        for name, fn in configs:
            wall, cpu, n = timed_run(fn)
            times[name].append(wall)
            cpus[name].append(cpu)
            released[name].append(n)
            print(f"round {r} {name:8s} wall {wall:8.2f} s  cpu {cpu:8.2f} s  released {n:6d}",
                  flush=True)

    print("\nsummary (medians over rounds)")
    print(f"{'config':8s} {'median s':>9s} {'min s':>8s} {'max s':>8s} {'cpu s':>8s} "
          f"{'released':>9s}  released per run")
    med = {}
    for name, _ in configs:
        med[name] = statistics.median(times[name])
        print(f"{name:8s} {med[name]:9.2f} {min(times[name]):8.2f} {max(times[name]):8.2f} "
              f"{statistics.median(cpus[name]):8.2f} "
              f"{statistics.median(released[name]):9g}  {released[name]}")
    print("\nratios of median wall times (target ours/PipelineDP <= %.2f)" % TARGET_RATIO)
    pairs = [("ours-CG", "pdp-GT"), ("ours-WG", "pdp-GT")]
    if "pdp-WG" in med:
        pairs += [("ours-WG", "pdp-WG")]
    for ours, theirs in pairs:
        ratio = med[ours] / med[theirs]
        verdict = "meets target" if ratio <= TARGET_RATIO else "MISSES target"
        print(f"{ours}/{theirs} = {ratio:.3f}  ({verdict})")
    self_mib, child_mib = peak_rss_mib()
    print(f"\npeak RSS: this process {self_mib:.0f} MiB; children {child_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
