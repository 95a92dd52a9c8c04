"""Δ0 chosen from the data (``--max-items-per-user auto``) against the best fixed Δ0.

    python benchmarks/auto_bound.py sweep [--data-dir ../shared/data] [--jobs 2]
    python benchmarks/auto_bound.py evaluate [--data-dir ../shared/data]

``sweep`` is the oracle's measurement: every shared dataset × ε ∈ {1, 3} × δ = 1e-5 ×
the mechanisms weighted-gaussian, policy-gaussian, sips and adaptive-2r, each at every
fixed Δ0 of ``GRID`` for ``TRIALS`` trials (the i-th under the test key of seed
``SEED + i``), released counts cached in ``benchmarks/results/auto_bound/sweep.json``
(a run already there is not repeated).

``evaluate`` chooses each family's rule by leave-one-dataset-out and reports the
left-out figures (``benchmarks/RESULTS.md``):

* the oracle of a cell (dataset, ε, mechanism) is the best fixed Δ0 in hindsight: the
  largest mean released count over the grid, at the full ε;
* a candidate rule maps the DP activity estimate to Δ0 (``dp.mechanisms.auto_bound``'s
  rule family: a quantile q of the users' distinct items times a factor c). For the
  choice, each candidate's Δ0 on a dataset is computed from the library's DP estimates
  at the share (one per trial, so the rule pays for the estimate's noise), and its
  released count read off the sweep's curve (interpolated in log Δ0);
* for each left-out dataset, the candidate with the largest smallest auto/oracle ratio
  over the other datasets' cells (ties: larger mean) is chosen; then the real ``auto``
  runs on the left-out dataset — the estimate released at the share, the rule applied to
  it, the mechanism at the rest of ε — ``TRIALS`` trials each, and auto / oracle and
  auto / default (Δ0 = 100, full ε) are printed;
* finally the rule chosen on all five datasets (the library's constant) is printed.

Runs are seeded (``RunKey.from_test_seed``): reproducible, NOT private; for measurement
only.
"""
import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

DATASETS = ["commits-ansible", "commits-rails", "movielens-small", "paths-ansible",
            "reddit-titles"]
MECHANISMS = ["weighted-gaussian", "policy-gaussian", "sips", "adaptive-2r"]
#: Beyond the issue's grid: the count family's own rule (``--mechanisms``).
EXTRA_MECHANISMS = ["count-gaussian"]
EPSILONS = [1.0, 3.0]
DELTA = 1e-5
GRID = [1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500]
DEFAULT = 100
TRIALS = 5
SEED = 1000
HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.join(HERE, "results", "auto_bound", "sweep.json")

_data = {}


def per_user(data_dir, name):
    if name not in _data:
        from beam_dpsu.pipelines.compare import load_per_user
        _data[name] = load_per_user(os.path.join(data_dir, name + ".pairs.tsv.gz"))
    return _data[name]


def released(data_dir, name, mech, eps, d0, trial):
    from beam_dpsu.dp.mechanisms.registry import make_mechanism
    from beam_dpsu.transforms.run_key import RunKey
    m = make_mechanism(mech, epsilon=eps, delta=DELTA, max_items=d0)
    return len(m.run_local(per_user(data_dir, name), RunKey.from_test_seed(SEED + trial)))


def _task(task):
    data_dir, name, mech, eps, d0, trial = task
    return task[1:], released(data_dir, name, mech, eps, d0, trial)


def key(name, mech, eps, d0, trial):
    return f"{name}|{mech}|{eps:g}|{d0}|{trial}"


def load_cache():
    if os.path.exists(CACHE):
        with open(CACHE) as f:
            return json.load(f)
    return {}


def save_cache(cache):
    os.makedirs(os.path.dirname(CACHE), exist_ok=True)
    tmp = CACHE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(cache, f, indent=0, sort_keys=True)
    os.replace(tmp, CACHE)


def sweep(args):
    cache = load_cache()
    # One dataset per worker at a time keeps each process's data in memory once.
    tasks = [(args.data_dir, n, m, e, d, t) for n in DATASETS for m in args.mechanisms
             for e in EPSILONS for d in GRID for t in range(TRIALS)
             if key(n, m, e, d, t) not in cache]
    print(f"{len(tasks)} runs to do, {len(cache)} cached", file=sys.stderr)
    start, done = time.time(), 0
    with ProcessPoolExecutor(args.jobs) as pool:
        for (n, m, e, d, t), r in pool.map(_task, tasks, chunksize=8):
            cache[key(n, m, e, d, t)] = r
            done += 1
            if done % 50 == 0:
                save_cache(cache)
                print(f"{done}/{len(tasks)} {time.time() - start:.0f} s", file=sys.stderr)
    save_cache(cache)


def curve(cache, name, mech, eps):
    """Mean released count at each Δ0 of the grid."""
    return np.array([np.mean([cache[key(name, mech, eps, d, t)] for t in range(TRIALS)])
                     for d in GRID])


QUANTILES = [0.5, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99]
FACTORS = [0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0]
FAMILY = {"weighted-gaussian": "weighted", "policy-gaussian": "policy", "sips": "sips",
          "adaptive-2r": "adaptive", "count-gaussian": "count"}


def noisy_estimates(data_dir, name, share):
    """{ε: [the library's DP activity estimate of ``name`` at share·ε, one per trial]}, under
    the keys of the real ``auto`` runs (``auto_runs``)."""
    from beam_dpsu.dp.mechanisms.activity import scale_statistics
    from beam_dpsu.dp.mechanisms.auto_bound import AUTO_LAYOUT
    from beam_dpsu.dp.mechanisms.registry import make_mechanism
    from beam_dpsu.transforms.run_key import RunKey
    hist = scale_statistics(per_user(data_dir, name).values(), AUTO_LAYOUT)
    out = {}
    for e in EPSILONS:
        m = make_mechanism("weighted-gaussian", epsilon=e, delta=DELTA, max_items="auto",
                           auto_share=share)
        out[e] = [m.estimate(hist, RunKey.from_test_seed(SEED + 500 + t))
                  for t in range(TRIALS)]
    return out


def predicted(f, d0):
    """The sweep's mean released count at Δ0 = d0, interpolated in log Δ0."""
    x = np.log(np.array(GRID, dtype=float))
    return float(np.interp(math.log(max(1, d0)), x, f))


def rule_d0(q, c, estimate, epsilon):
    """The library's rule of (q, c) on a DP estimate (its fallback when uninformative)."""
    from beam_dpsu.dp.mechanisms.auto_bound import AutoRule
    from beam_dpsu.dp.privacy.params import DEFAULT_MAX_ITEMS
    return AutoRule("candidate", q, c, DEFAULT_MAX_ITEMS).max_items(estimate, epsilon)


def choose(cache, estimates, mech, datasets):
    """The (q, c) with the largest smallest predicted/oracle ratio over ``datasets`` × ε
    (ties: the larger mean); a cell's prediction is the mean, over its trials' DP
    estimates, of the sweep's curve at the rule's Δ0 (so the estimate's noise counts)."""
    best = None
    for q in QUANTILES:
        for c in FACTORS:
            ratios = []
            for n in datasets:
                for e in EPSILONS:
                    f = curve(cache, n, mech, e)
                    ratios.append(np.mean([predicted(f, rule_d0(q, c, est, e))
                                           for est in estimates[n][e]]) / f.max())
            score = (min(ratios), float(np.mean(ratios)))
            if best is None or score > best[0]:
                best = (score, (q, c))
    return best[1], best[0]


def auto_runs(data_dir, name, mech, eps, rule, share):
    """``TRIALS`` real ``auto`` runs with ``rule``: (released counts, Δ0s)."""
    from beam_dpsu.dp.mechanisms import auto_bound
    from beam_dpsu.dp.mechanisms.registry import make_mechanism
    from beam_dpsu.transforms.run_key import RunKey
    family = FAMILY[mech]
    saved = auto_bound.AUTO_RULES[family]
    auto_bound.AUTO_RULES[family] = rule
    try:
        out, d0s = [], []
        for t in range(TRIALS):
            m = make_mechanism(mech, epsilon=eps, delta=DELTA, max_items="auto",
                               auto_share=share)
            key = RunKey.from_test_seed(SEED + 500 + t)
            c = m.calibrated_on(per_user(data_dir, name), key)
            d0s.append(c.max_items)
            out.append(len(c.run_local(per_user(data_dir, name), key)))
        return out, d0s
    finally:
        auto_bound.AUTO_RULES[family] = saved


def _auto_task(task):
    data_dir, name, mech, eps, rule, share = task
    return task, auto_runs(data_dir, name, mech, eps, rule, share)


def evaluate(args):
    cache = load_cache()
    qs = {n: noisy_estimates(args.data_dir, n, args.share) for n in DATASETS}
    print(f"share {args.share}; δ = {DELTA:g}; {TRIALS} trials; oracle: best fixed Δ0 of "
          f"{GRID} at the full ε; default Δ0 = {DEFAULT}")
    tasks, chosen = [], {}
    for mech in args.mechanisms:
        for left in DATASETS:
            rule, score = choose(cache, qs, mech, [n for n in DATASETS if n != left])
            chosen[mech, left] = (rule, score)
            tasks += [(args.data_dir, left, mech, e, rule, args.share) for e in EPSILONS]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = dict(pool.map(_auto_task, tasks))
    rows, worst = [], {}
    for (data_dir, left, mech, e, rule, share), (got, d0s) in results.items():
        f = curve(cache, left, mech, e)
        best = int(np.argmax(f))
        auto = float(np.mean(got))
        r_or, r_def = auto / f.max(), auto / f[GRID.index(DEFAULT)]
        worst.setdefault(mech, []).append((r_or, r_def))
        rows.append(f"| {mech} | {left} | {e:g} | q={rule[0]:g}, c={rule[1]:g} | "
                    f"{np.mean(d0s):.0f} ({min(d0s)}–{max(d0s)}) | {auto:.1f} | "
                    f"{f.max():.1f} (Δ0 {GRID[best]}) | {f[GRID.index(DEFAULT)]:.1f} | "
                    f"{r_or:.3f} | {r_def:.3f} |")
    print("| mechanism | left-out dataset | ε | rule chosen on the other four | Δ0 auto "
          "(range) | auto | oracle (best Δ0) | Δ0 = 100 | auto / oracle | auto / default |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(sorted(rows)))
    print()
    for mech in args.mechanisms:
        r = np.array(worst[mech])
        rule, score = choose(cache, qs, mech, DATASETS)
        print(f"{mech}: left-out auto/oracle min {r[:, 0].min():.3f} mean "
              f"{r[:, 0].mean():.3f}; auto/default min {r[:, 1].min():.3f} mean "
              f"{r[:, 1].mean():.3f}; rule on all five: q={rule[0]:g} c={rule[1]:g} "
              f"(predicted min {score[0]:.3f}, mean {score[1]:.3f})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("phase", choices=["sweep", "evaluate"])
    p.add_argument("--data-dir", default=os.path.join(HERE, "..", "..", "shared", "data"))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--mechanisms", type=lambda s: s.split(","), default=MECHANISMS,
                   help=f"comma-separated (default {','.join(MECHANISMS)}; also "
                        f"{','.join(EXTRA_MECHANISMS)})")
    p.add_argument("--share", type=float, default=None,
                   help="evaluate: the estimate's share of ε (default the library's)")
    args = p.parse_args()
    if args.share is None:
        from beam_dpsu.dp.privacy.params import DEFAULT_AUTO_SHARE
        args.share = DEFAULT_AUTO_SHARE
    if args.phase == "sweep":
        sweep(args)
    else:
        evaluate(args)


if __name__ == "__main__":
    main()
