"""Δ0 chosen from the data (``--max-items-per-user auto``) against the best fixed Δ0.

    python benchmarks/auto_bound.py sweep [--data-dir ../shared/data] [--jobs 2]
    python benchmarks/auto_bound.py evaluate [--data-dir ../shared/data]
    python benchmarks/auto_bound.py cost [--data-dir ../shared/data]

``sweep`` is the oracle's measurement: every shared dataset × ε ∈ {1, 3} × δ = 1e-5 ×
the mechanisms weighted-gaussian, policy-gaussian, sips and adaptive-2r, each at every
fixed Δ0 of ``GRID`` for ``TRIALS`` trials (``TRIALS_OF``: more where a release is a
few items; the i-th under the test key of seed ``SEED + i``), released counts cached in
``benchmarks/results/auto_bound/sweep.json`` (a run already there is not repeated).

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

Options of ``evaluate`` for the search of other rules: ``--empty-below F`` reads the
estimates (for the choice and the runs) with a bucket below F noise scales as empty;
``--candidates fine`` and ``--criterion bar`` choose among more (q, c) and on the
bar for the default (min(auto / (0.95 × oracle), auto / default)) instead of auto / oracle.

``evaluate --paired-floor 1`` reads each left-out cell's rule at the library's floor (or
``--empty-below``'s) and at 1 noise scale under the same keys (the floor's effect alone,
paired).

``cost`` measures what the estimate's share of ε costs the release by itself (Δ0 = 100
with the budget auto's release keeps against the full ε, same keys): a ceiling on
auto / default that no rule can pass.

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
#: Beyond the grid of the four mechanisms above: the count family's own rule (``--mechanisms``).
EXTRA_MECHANISMS = ["count-gaussian"]
EPSILONS = [1.0, 3.0]
DELTA = 1e-5
GRID = [1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500]
DEFAULT = 100
TRIALS = 5
#: Datasets whose releases are a few items at ε = 1 (noise in the trials' mean is then
#: larger than the rules' differences): more trials, for the oracle and for auto alike.
TRIALS_OF = {"movielens-small": 25}
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


def trials(name):
    """The number of trials of ``name``'s cells (``TRIALS_OF``, else ``TRIALS``)."""
    return TRIALS_OF.get(name, TRIALS)


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
             for e in EPSILONS for d in GRID for t in range(trials(n))
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
    return np.array([np.mean([cache[key(name, mech, eps, d, t)] for t in range(trials(name))])
                     for d in GRID])


QUANTILES = [0.5, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99]
FACTORS = [0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0]
#: ``--candidates fine``: more quantiles, and factors 0.25 to 5.657 in steps of 2^(1/4).
FINE_QUANTILES = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99]
FINE_FACTORS = [round(0.25 * 2 ** (k / 4), 3) for k in range(19)]
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
                  for t in range(trials(name))]
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


def choose(cache, estimates, mech, datasets, fine=False, bar=False):
    """The (q, c) with the largest smallest predicted/oracle ratio over ``datasets`` × ε
    (ties: the larger mean); a cell's prediction is the mean, over its trials' DP
    estimates, of the sweep's curve at the rule's Δ0 (so the estimate's noise counts).
    ``fine``: the ``FINE_`` candidates; ``bar``: a cell's score is min(prediction / (0.95
    × oracle), prediction / default) instead of prediction / oracle."""
    best = None
    for q in FINE_QUANTILES if fine else QUANTILES:
        for c in FINE_FACTORS if fine else FACTORS:
            ratios = []
            for n in datasets:
                for e in EPSILONS:
                    f = curve(cache, n, mech, e)
                    p = np.mean([predicted(f, rule_d0(q, c, est, e))
                                 for est in estimates[n][e]])
                    ratios.append(min(p / (0.95 * f.max()), p / f[GRID.index(DEFAULT)])
                                  if bar else p / f.max())
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
        for t in range(trials(name)):
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
    data_dir, name, mech, eps, rule, share, floor = task
    from beam_dpsu.dp.mechanisms import auto_bound
    saved, auto_bound.AUTO_EMPTY_BELOW = auto_bound.AUTO_EMPTY_BELOW, floor
    try:
        return task, auto_runs(data_dir, name, mech, eps, rule, share)
    finally:
        auto_bound.AUTO_EMPTY_BELOW = saved


def _floor(args):
    """The estimate's floor for this measurement (``--empty-below``; the library's)."""
    from beam_dpsu.dp.mechanisms import auto_bound
    return auto_bound.AUTO_EMPTY_BELOW if args.empty_below is None else args.empty_below


def evaluate(args):
    from beam_dpsu.dp.mechanisms import auto_bound
    cache = load_cache()
    floor = _floor(args)
    auto_bound.AUTO_EMPTY_BELOW = floor          # the choice reads the estimates so too
    qs = {n: noisy_estimates(args.data_dir, n, args.share) for n in DATASETS}
    print(f"share {args.share}; δ = {DELTA:g}; {TRIALS} trials ({TRIALS_OF}); oracle: best "
          f"fixed Δ0 of {GRID} at the full ε; default Δ0 = {DEFAULT}; a bucket below "
          f"{floor:g} noise scales read as empty")
    tasks, chosen = [], {}
    for mech in args.mechanisms:
        for left in DATASETS:
            rule, score = choose(cache, qs, mech, [n for n in DATASETS if n != left],
                                 args.candidates == "fine", args.criterion == "bar")
            chosen[mech, left] = (rule, score)
            tasks += [(args.data_dir, left, mech, e, rule, args.share, floor)
                      for e in EPSILONS]
    if args.paired_floor is not None:
        tasks += [t[:-1] + (args.paired_floor,) for t in tasks]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = dict(pool.map(_auto_task, tasks))
    if args.paired_floor is not None:
        paired(cache, results, floor, args.paired_floor)
        return
    rows, worst = [], {}
    for (data_dir, left, mech, e, rule, share, _), (got, d0s) in results.items():
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
        rule, score = choose(cache, qs, mech, DATASETS, args.candidates == "fine",
                             args.criterion == "bar")
        print(f"{mech}: left-out auto/oracle min {r[:, 0].min():.3f} mean "
              f"{r[:, 0].mean():.3f}, {(r[:, 0] >= 0.95).sum()}/{len(r)} cells >= 0.95; "
              f"auto/default min {r[:, 1].min():.3f} mean {r[:, 1].mean():.3f}, "
              f"{(r[:, 1] >= 1).sum()}/{len(r)} cells >= 1; rule on all five: q={rule[0]:g} "
              f"c={rule[1]:g} (predicted score min {score[0]:.3f}, mean {score[1]:.3f})")


def paired(cache, results, floor, other):
    """Each cell's rule (chosen at ``floor``) read at ``floor`` and at ``other``, under the
    same keys: the change of the reading alone, with the paired standard error of the
    difference of the means."""
    print(f"the rules chosen on the other four datasets at floor {floor:g}, read at floor "
          f"{floor:g} and at {other:g} (same keys; ± the paired standard error)")
    print(f"| mechanism | left-out dataset | ε | rule | Δ0 mean, {floor:g} → "
          f"{other:g} | auto | difference | auto / oracle | auto / default |")
    print("|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for (data_dir, left, mech, e, rule, share, fl), (got, d0s) in sorted(results.items()):
        if fl != floor:
            continue
        new, new_d0s = results[(data_dir, left, mech, e, rule, share, other)]
        f = curve(cache, left, mech, e)
        a, b = np.array(got, float), np.array(new, float)
        se = float(np.std(b - a, ddof=1) / math.sqrt(len(a)))
        o, d = f.max(), f[GRID.index(DEFAULT)]
        summary.setdefault(mech, []).append((a.mean() / o, b.mean() / o, a.mean() / d,
                                             b.mean() / d))
        print(f"| {mech} | {left} | {e:g} | q={rule[0]:g}, c={rule[1]:g} | "
              f"{np.mean(d0s):.0f} → {np.mean(new_d0s):.0f} | {a.mean():.1f} → "
              f"{b.mean():.1f} | {b.mean() - a.mean():+.1f} ± {se:.1f} | "
              f"{a.mean() / o:.3f} → {b.mean() / o:.3f} | {a.mean() / d:.3f} → "
              f"{b.mean() / d:.3f} |")
    print()
    for mech, r in summary.items():
        r = np.array(r)
        print(f"{mech}: auto/oracle mean {r[:, 0].mean():.3f} → {r[:, 1].mean():.3f}, min "
              f"{r[:, 0].min():.3f} → {r[:, 1].min():.3f}, cells >= 0.95 "
              f"{(r[:, 0] >= 0.95).sum()} → {(r[:, 1] >= 0.95).sum()}; cells >= default "
              f"{(r[:, 2] >= 1).sum()} → {(r[:, 3] >= 1).sum()}")


def cost(args):
    """What the estimate's share costs the release alone: each cell's released count at
    Δ0 = ``DEFAULT`` with the budget ``auto``'s release keeps (``AutoBound.release_at``:
    ε − ε₁, or more where the composition is tight) against the sweep's at the full ε,
    under the same keys (the sweep's trials), so the two runs differ only by the budget.
    Where the default is within this cost of the oracle, no rule can beat the default:
    even the oracle's Δ0 with that budget releases less."""
    from beam_dpsu.dp.mechanisms.registry import make_mechanism
    from beam_dpsu.transforms.run_key import RunKey
    cache = load_cache()
    print(f"share {args.share}: released at Δ0 = {DEFAULT} with what auto's release keeps "
          f"against the full ε, same keys")
    print("| mechanism | dataset | ε | Δ0 = 100 / oracle (full ε) | auto's release / full ε | "
          "ceiling of auto / default |")
    print("|---|---|---|---|---|---|")
    short = 0
    for mech in args.mechanisms:
        for n in DATASETS:
            for e in EPSILONS:
                release = make_mechanism(mech, epsilon=e, delta=DELTA, max_items="auto",
                                         auto_share=args.share).release_at(DEFAULT)
                part = [len(release.run_local(per_user(args.data_dir, n),
                                       RunKey.from_test_seed(SEED + t)))
                        for t in range(trials(n))]
                full = [cache[key(n, mech, e, DEFAULT, t)] for t in range(trials(n))]
                f = curve(cache, n, mech, e)
                d, c = f[GRID.index(DEFAULT)] / f.max(), np.mean(part) / np.mean(full)
                short += c / d < 1
                print(f"| {mech} | {n} | {e:g} | {d:.3f} | {c:.3f} | {c / d:.3f} |", flush=True)
    print(f"{short} cells where the oracle's Δ0 at (1 − share)·ε (taking the cost at Δ0 = "
          f"{DEFAULT} for it) releases less than Δ0 = {DEFAULT} at the full ε")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("phase", choices=["sweep", "evaluate", "cost"])
    p.add_argument("--data-dir", default=os.path.join(HERE, "..", "..", "shared", "data"))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--mechanisms", type=lambda s: s.split(","), default=MECHANISMS,
                   help=f"comma-separated (default {','.join(MECHANISMS)}; also "
                        f"{','.join(EXTRA_MECHANISMS)})")
    p.add_argument("--share", type=float, default=None,
                   help="evaluate: the estimate's share of ε (default the library's)")
    p.add_argument("--empty-below", type=float, default=None,
                   help="evaluate: read the estimates with a bucket below this many noise "
                        "scales as empty (default the library's AUTO_EMPTY_BELOW)")
    p.add_argument("--candidates", choices=["coarse", "fine"], default="coarse",
                   help="evaluate: QUANTILES × FACTORS, or the FINE_ ones")
    p.add_argument("--criterion", choices=["oracle", "bar"], default="oracle",
                   help="evaluate: choose on prediction / oracle, or on the bar for the default "
                        "(min of prediction / (0.95 × oracle) and prediction / default)")
    p.add_argument("--paired-floor", type=float, default=None,
                   help="evaluate: the rules chosen (at --empty-below), read at it and at "
                        "this floor under the same keys, paired")
    args = p.parse_args()
    if args.share is None:
        from beam_dpsu.dp.privacy.params import DEFAULT_AUTO_SHARE
        args.share = DEFAULT_AUTO_SHARE
    if args.phase == "sweep":
        sweep(args)
    elif args.phase == "cost":
        cost(args)
    else:
        evaluate(args)


if __name__ == "__main__":
    main()
