"""Benchmark: the cascade-free GW's Δ0 × η sweep, beside the published GW and the policies.

For every shared dataset (user<TAB>item lines, read with
``textio.read_per_user``, which keeps each user's record order) and
ε = 3, δ = e^-10, α = 3, it releases with ``core.run_local`` (fresh OS keys
for every run) and records the mean and standard deviation of the number of
released items over ``--runs`` runs for:

* the cascade-free GW (``ordered.GW``) on the grid Δ0 × η;
* the published GW (``variant='published'``, unproven; the baseline the
  cascade-free variant must stay within 0.9× of), both tie-breaks;
* Policy Laplace and Policy Gaussian at Δ0 = 100 (same α);
* on commits-rails only: GW-KT, cascade-free (the default: ``kt_selection='front'``,
  Δ0 = 20; the old ``'prefix'`` rule at Δ0 = 100; and a ``'prefix'`` Δ0 sweep at the
  default η, ``--runs`` runs each) and published,
  with public counts = the number of distinct users per item in
  commits-ansible (as ``tests/test_ordered_reference_numbers.py`` builds them).

The released counts are one noisy draw per run (not the expectation), as the
authors report them. The output is a Markdown table per dataset on stdout
(and ``--json PATH``); ``benchmarks/RESULTS-gw.md`` holds the run that chose
the defaults, with the command that made it.

Run (from the repository root; the data directory is not part of the repo)::

    PYTHONPATH=. python benchmarks/sweep_gw.py --data /work/shared/data \
        --max-items 10,30,100,300 --etas 0.01,0.05,0.2 --runs 3 --check-runs 5
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

from beam_dpsu import core, textio
from beam_dpsu.noise import RunKey
from beam_dpsu.ordered import GW, GWKT, PolicyGaussian, PolicyLaplace

E10 = math.exp(-10)
DATASETS = ("commits-rails", "reddit-titles", "commits-ansible", "movielens-small",
            "paths-ansible")


METRIC = {"name": "released"}


def one_run(mechanism, per_user):
    """Released items of one run, or (``--metric expected``) their expectation given the
    run's finished histogram, Σ P(weight + noise > T): free of the noise's own spread."""
    if METRIC["name"] == "released":
        return len(core.run_local(per_user, mechanism, RunKey.fresh()))
    from scipy import stats
    import numpy as np
    r = mechanism.calibration
    dist = stats.norm(scale=r.noise_scale) if r.noise == "gaussian" \
        else stats.laplace(scale=r.noise_scale)
    hist = mechanism.histogram_local(per_user, RunKey.fresh())
    return float(dist.sf(r.threshold - np.fromiter(hist.values(), float)).sum())


def released(mechanism, per_user, runs):
    counts = [one_run(mechanism, per_user) for _ in range(runs)]
    return statistics.mean(counts), (statistics.stdev(counts) if runs > 1 else 0.0), counts


def load(data_dir, name):
    return textio.read_per_user(os.path.join(data_dir, name + ".pairs.tsv.gz"))


def public_counts_from(per_user):
    counts = {}
    for items in per_user.values():
        for item in items:
            counts[item] = counts.get(item, 0) + 1
    return counts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="directory of NAME.pairs.tsv.gz files")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--max-items", default="10,30,100,300")
    p.add_argument("--etas", default="0.01,0.05,0.2")
    p.add_argument("--runs", type=int, default=3, help="runs per grid cell")
    p.add_argument("--check-runs", type=int, default=5,
                   help="runs of the defaults and the baselines (the 0.9x checks)")
    p.add_argument("--kt-max-items", default="20,50,100,200",
                   help="commits-rails: GW-KT with kt_selection='prefix' (default η) at these Δ0")
    p.add_argument("--metric", choices=("released", "expected"), default="released",
                   help="released items per run (default) or their expectation given the "
                        "run's histogram")
    p.add_argument("--json")
    args = p.parse_args(argv)
    METRIC["name"] = args.metric
    eps, delta, alpha = 3.0, E10, 3.0
    grid_d0 = [int(x) for x in args.max_items.split(",")]
    grid_eta = [float(x) for x in args.etas.split(",")]
    out = {"epsilon": eps, "delta": delta, "alpha": alpha, "runs": args.runs,
           "check_runs": args.check_runs, "datasets": {}}
    public = None
    for name in args.datasets.split(","):
        t0 = time.time()
        per_user = load(args.data, name)
        res = {"users": len(per_user), "grid": {}, "baselines": {}}
        tie_breaks = ["item-hash", "first-occurrence"]
        for tb in tie_breaks:
            res["baselines"][f"gw published {tb}"] = released(
                GW(eps, delta, alpha, tie_break=tb, variant="published"), per_user,
                args.check_runs)[:2]
            res["baselines"][f"gw cascade-free default {tb}"] = released(
                GW(eps, delta, alpha, tie_break=tb), per_user, args.check_runs)[:2]
        res["baselines"]["policy-laplace Δ0=100"] = released(
            PolicyLaplace(eps, delta, 100, alpha), per_user, args.check_runs)[:2]
        res["baselines"]["policy-gaussian Δ0=100"] = released(
            PolicyGaussian(eps, delta, 100, alpha), per_user, args.check_runs)[:2]
        if name == "commits-rails":
            if public is None:
                public = public_counts_from(load(args.data, "commits-ansible"))
            res["baselines"]["gw-kt published item-hash"] = released(
                GWKT(eps, delta, public, alpha, variant="published"), per_user,
                args.check_runs)[:2]
            res["baselines"]["gw-kt cascade-free default (front, Δ0=20) item-hash"] = released(
                GWKT(eps, delta, public, alpha), per_user, args.check_runs)[:2]
            res["baselines"]["gw-kt cascade-free prefix Δ0=100 item-hash"] = released(
                GWKT(eps, delta, public, alpha, kt_selection="prefix"), per_user,
                args.check_runs)[:2]
            for d0 in [int(x) for x in args.kt_max_items.split(",")]:
                res["baselines"][f"gw-kt cascade-free prefix Δ0={d0} (default η)"] = released(
                    GWKT(eps, delta, public, alpha, max_items=d0, kt_selection="prefix"),
                    per_user, args.runs)[:2]
        for d0 in grid_d0:
            for eta in grid_eta:
                res["grid"][f"{d0}/{eta:g}"] = released(
                    GW(eps, delta, alpha, max_items=d0, eta=eta), per_user, args.runs)[:2]
                print(f"{name} Δ0={d0} η={eta:g}: {res['grid'][f'{d0}/{eta:g}']}",
                      file=sys.stderr, flush=True)
        res["seconds"] = round(time.time() - t0, 1)
        out["datasets"][name] = res
        print(markdown_one(name, res, grid_d0, grid_eta, args), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)
    return 0


def markdown_one(name, res, grid_d0, grid_eta, args):
    lines = [f"### {name} ({res['users']:,} users; {res['seconds']} s)", "",
             f"Cascade-free GW (item-hash tie-break), {METRIC['name']} items, mean ± sd of "
             f"{args.runs} runs:", "",
             "| Δ0 \\ η | " + " | ".join(f"{e:g}" for e in grid_eta) + " |",
             "|---|" + "---|" * len(grid_eta)]
    for d0 in grid_d0:
        cells = [res["grid"][f"{d0}/{e:g}"] for e in grid_eta]
        lines.append(f"| {d0} | " + " | ".join(f"{m:.1f} ± {s:.1f}" for m, s in cells) + " |")
    lines += ["", f"Baselines and defaults ({args.check_runs} runs; the GW-KT Δ0 sweep "
              f"{args.runs}):", "",
              "| mechanism | released (mean ± sd) |", "|---|---|"]
    for k, (m, s) in res["baselines"].items():
        lines.append(f"| {k} | {m:.1f} ± {s:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
