"""Benchmark: the ordered-user stage (sequential policies) in Beam and alone.

What it measures
----------------
1. ``beam-rails``: the whole pipeline ``ReadUserItems → SelectPartitions``
   with Policy Gaussian (ε = 3, δ = e^-10, Δ0 = 300, α = 5) on
   ``commits-rails`` (6,817 users), on the Python FnApiRunner (what the
   DirectRunner uses for batch; ordered-list state).
2. ``beam-synthetic``: the same on 100,000 synthetic users
   (``beam_dpsu.synthetic``, DP-SIPS Synthetic_80M style, written to a
   temporary gzip file that is deleted afterwards).
3. ``core-synthetic``: the policy core alone (``policies.run_in_order`` on
   users already prepared and sorted, as the sequential DoFn sees them) on
   1,000,000 synthetic users; preparing them is timed separately.

For the Beam runs the script reports the wall time and, from Beam metrics
written by the transform, the time spent inside the sequential stateful DoFn
(adding users to state, then the timer: reading the state in order, running
the policy, emitting the histogram) and inside the parallel prepare DoFn. The
"ordered stage" throughput is users (and kept user-item pairs) divided by
the sequential DoFn's time; the prepare step runs in parallel on any number
of workers and is reported separately. Peak memory is the process's maximum
RSS (``resource.getrusage``; the FnApiRunner runs in-process). The script also
prints the cost of a bare Python loop iteration on the machine, to compare
figures between machines.

Run
---
From the repository root::

    PYTHONPATH=. python benchmarks/bench_ordered.py [--rails PATH] [--synthetic-users 100000]
        [--core-users 1000000] [--skip-core]
    PYTHONPATH=. python benchmarks/bench_ordered.py --reference-runs 5   # the 7 reference numbers
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import resource
import shutil
import tempfile
import time

import apache_beam as beam
import numpy as np
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import fn_runner

from beam_dpsu import policies, synthetic
from beam_dpsu.mechanisms import SelectPartitions
from beam_dpsu.noise import RunKey
from beam_dpsu.ordered import PolicyGaussian, encode_ids, decode_ids
from beam_dpsu.textio import ReadUserItems

E10 = math.exp(-10)
RAILS = "/work/shared/data/commits-rails.pairs.tsv.gz"


def mechanism():
    return PolicyGaussian(3, E10, 300, alpha=5)


def counter(result, name):
    res = result.metrics().query(MetricsFilter().with_namespace("beam_dpsu").with_name(name))
    return int(sum((c.committed if c.committed is not None else c.attempted) or 0
                   for c in res["counters"]))


def run_beam(label, path):
    m = mechanism()
    start = time.perf_counter()
    p = beam.Pipeline(runner=fn_runner.FnApiRunner(), options=PipelineOptions([]))
    _ = (p | ReadUserItems(path) | SelectPartitions(m, RunKey.fresh(), per_user=True)
         | beam.combiners.Count.Globally() | beam.Map(lambda n: None))
    result = p.run()
    result.wait_until_finish()
    wall = time.perf_counter() - start
    users, pairs = counter(result, "ordered_users"), counter(result, "ordered_pairs")
    add = counter(result, "ordered_sequential_add_micros") / 1e6
    timer = counter(result, "ordered_sequential_timer_micros") / 1e6
    seq = add + timer
    prep = counter(result, "ordered_prepare_micros") / 1e6
    released = counter(result, "released")
    print(f"{label}: users={users} kept_pairs={pairs} released={released} wall={wall:.2f}s")
    print(f"  sequential DoFn {seq:.3f}s: {users / seq:,.0f} users/s, {pairs / seq / 1e6:.2f}M "
          f"pairs/s (state adds {add:.3f}s, timer {timer:.3f}s)")
    print(f"  prepare DoFn {prep:.3f}s; prepare+sequential: {users / (seq + prep):,.0f} users/s, "
          f"{pairs / (seq + prep) / 1e6:.2f}M pairs/s")
    return dict(users=users, pairs=pairs, seq=seq, add=add, timer=timer, prep=prep, wall=wall)


def run_core(num_users):
    m = mechanism()
    rk = RunKey.fresh()
    policy = m.policy(rk)
    order_key = rk.subkey("order")
    t0 = time.perf_counter()
    keyed = []
    pairs = 0
    for first, sizes, items in synthetic.user_blocks(num_users, seed=1):
        pos = 0
        for j, size in enumerate(sizes.tolist()):
            vals, cnts = np.unique(items[pos:pos + size], return_counts=True)
            pos += size
            user = f"u{first + j}"
            counts = dict(zip([f"i{v}" for v in vals.tolist()], cnts.tolist()))
            ids, _ = policy.prepare(user, counts)
            pairs += len(ids)
            keyed.append((policies.user_sort_key(order_key, user)[0], encode_ids(ids)))
    keyed.sort(key=lambda e: e[0])
    prep = time.perf_counter() - t0
    lengths = np.fromiter((len(b) >> 3 for _, b in keyed), dtype=np.int64, count=len(keyed))
    ids = np.frombuffer(b"".join(b for _, b in keyed), dtype="<i8")
    from beam_dpsu import kernels
    kernels.warm_up()
    t1 = time.perf_counter()
    hist = dict(policies.run_packed([(lengths, ids)], policy))   # what the DoFn runs
    core = time.perf_counter() - t1
    engine = "compiled kernels" if kernels.available() else "dict"
    print(f"core-synthetic: users={num_users} kept_pairs={pairs} items={len(hist)} "
          f"prepare+sort={prep:.1f}s")
    print(f"  policy core ({engine}) {core:.2f}s: {num_users / core:,.0f} users/s, "
          f"{pairs / core / 1e6:.2f}M pairs/s")
    t2 = time.perf_counter()
    slow = policies.run_in_order((decode_ids(b) for _, b in keyed), policy)
    dict_core = time.perf_counter() - t2
    print(f"  policy core (plain-Python dict) {dict_core:.2f}s: {num_users / dict_core:,.0f} "
          f"users/s, {pairs / dict_core / 1e6:.2f}M pairs/s; same histogram: "
          f"{ {k: v for k, v in slow.items() if v > 0} == hist}")
    return dict(users=num_users, pairs=pairs, core=core)


def load_per_user(path):
    from beam_dpsu.textio import read_per_user
    return read_per_user(path)   # each user's items in record order


def reference_numbers(runs, data_dir="/work/shared/data", only=None):
    """Mean released count (and expected count) over ``runs`` fresh keys, Beam-free core."""
    from scipy import stats
    from beam_dpsu.ordered import GW, GWKT, PolicyLaplace
    rails = load_per_user(os.path.join(data_dir, "commits-rails.pairs.tsv.gz"))
    reddit = load_per_user(os.path.join(data_dir, "reddit-titles.pairs.tsv.gz"))
    public = {}
    for items in load_per_user(os.path.join(data_dir, "commits-ansible.pairs.tsv.gz")).values():
        for item in items:
            public[item] = public.get(item, 0) + 1
    cases = [("commits-rails", PolicyLaplace(3, E10, 10), 562.0),
             ("commits-rails", PolicyGaussian(3, E10, 300, alpha=5), 1250.2),
             ("commits-rails", PolicyGaussian(3, E10, 100, alpha=3), 1161.4),
             ("commits-rails", GW(3, E10, variant="published"), 713.4),
             ("commits-rails", GW(3, E10, tie_break="first-occurrence", variant="published"), 713.4),
             ("commits-rails", GWKT(3, E10, public, variant="published"), 986.8),
             ("commits-rails", GWKT(3, E10, public, tie_break="first-occurrence", variant="published"), 986.8),
             ("reddit-titles", GW(3, E10, variant="published"), 750.6),
             ("reddit-titles", GW(3, E10, tie_break="first-occurrence", variant="published"), 750.6),
             ("reddit-titles", PolicyGaussian(3, E10, 50, alpha=5), 821.2)]
    for name, m, authors in cases:
        if only and only not in f"{name} {m.name}":
            continue
        data = rails if name == "commits-rails" else reddit
        r = m.calibration
        dist = stats.norm(scale=r.noise_scale) if r.noise == "gaussian" \
            else stats.laplace(scale=r.noise_scale)
        released, expected = [], []
        for _ in range(runs):
            rk = RunKey.fresh()
            hist = m.histogram_local(data, rk)
            rule = m.release_rule(rk)
            released.append(sum(1 for item, w in hist.items() if rule(item, w)))
            expected.append(float(dist.sf(r.threshold - np.fromiter(hist.values(), float)).sum()))
        tie = f" tie_break={m.tie_break}" if hasattr(m, "tie_break") else ""
        print(f"{name} {m.name}{tie} Δ0={m.max_items} α={m.alpha:g}: released mean "
              f"{np.mean(released):.1f} {released}; expected mean {np.mean(expected):.1f} "
              f"(sd {np.std(expected, ddof=1):.2f}); authors {authors} "
              f"({np.mean(released) / authors - 1:+.2%})", flush=True)


def loop_cost_ns():
    n = 2_000_000
    t = time.perf_counter()
    x = 0
    for _ in range(n):
        x += 1
    return (time.perf_counter() - t) / n * 1e9


def main():
    logging.getLogger().setLevel(logging.ERROR)
    ap = argparse.ArgumentParser()
    ap.add_argument("--rails", default=RAILS)
    ap.add_argument("--synthetic-users", type=int, default=100_000)
    ap.add_argument("--core-users", type=int, default=1_000_000)
    ap.add_argument("--skip-core", action="store_true")
    ap.add_argument("--reference-runs", type=int, default=0,
                    help="only print the reference-number table over this many runs")
    ap.add_argument("--reference-only", help="with --reference-runs: cases whose "
                    "'data mechanism' contains this text")
    args = ap.parse_args()
    if args.reference_runs:
        reference_numbers(args.reference_runs, only=args.reference_only)
        return
    print(f"bare Python loop iteration: {loop_cost_ns():.0f} ns; cores: {os.cpu_count()}; "
          f"load average: {os.getloadavg()[0]:.2f}")
    if os.path.exists(args.rails):
        run_beam("beam-rails", args.rails)
    if args.synthetic_users:
        tmp = tempfile.mkdtemp(prefix="bench_ordered_")
        try:
            path = os.path.join(tmp, "synthetic.tsv.gz")
            lines = synthetic.write_tsv(path, args.synthetic_users, seed=1)
            print(f"synthetic input: {args.synthetic_users} users, {lines} lines")
            run_beam("beam-synthetic", path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"peak RSS after the Beam runs: "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if not args.skip_core:
        run_core(args.core_users)
        print(f"peak RSS (including the core run): "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
