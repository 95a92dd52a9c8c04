"""Measures top-k's released count against k̄ on the shared datasets (what chose the
default k̄ = 10·k, ``calibration.default_k_bar``).

For each dataset, ε in {1, 3}, δ = 1e-6, k in {10, 50}, Algorithm 2 (unrestricted) and
Algorithm 1 (``--with-counts``, Δ = 10), and k̄ = MULT·k for each multiplier, prints the
mean number of items released over ``--trials`` keys (the same keys for every k̄).
Runs the Beam-free release (``TopKMechanism.release`` on the true top k̄ + 1).

    python benchmarks/topk_k_bar.py [--data DIR] [--trials 5] [--multipliers 1,2,4,10,20,50,100]
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from beam_dpsu.dp.mechanisms.topk import TopKMechanism, item_user_counts, true_top  # noqa: E402
from beam_dpsu.dp.randomness.noise import RunKey  # noqa: E402
from beam_dpsu.pipelines import compare  # noqa: E402

DATASETS = ["reddit-titles", "movielens-small", "paths-ansible", "commits-rails",
            "commits-ansible"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--multipliers", default="1,2,4,10,20,50,100")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args(argv)
    mults = [int(x) for x in args.multipliers.split(",")]
    for name in args.only or DATASETS:
        per_user = compare.load_per_user(f"{args.data}/{name}.pairs.tsv.gz")
        hist = item_user_counts(per_user)
        top = sorted(hist.values(), reverse=True)
        print(f"## {name}: {len(per_user)} users; h_10 = {top[9]}, h_50 = {top[49]}", flush=True)
        got = collections.defaultdict(list)
        for t in range(args.trials):
            key = RunKey.from_test_seed(1000 + t)       # a measurement, not a release
            sampled = item_user_counts(per_user, 10, key)
            for eps in (1.0, 3.0):
                for k in (10, 50):
                    for counts in (False, True):
                        for mult in mults:
                            m = TopKMechanism(k, eps, 1e-6, k_bar=k * mult,
                                              max_items=10 if counts else None,
                                              with_counts=counts)
                            h = sampled if counts else hist
                            got[eps, k, counts, mult].append(
                                len(m.release(true_top(h.items(), k * mult + 1, key), key)))
        for eps in (1.0, 3.0):
            for k in (10, 50):
                for counts in (False, True):
                    print(f"ε={eps:g} k={k} {'Algorithm 1' if counts else 'Algorithm 2'}: "
                          + ", ".join(f"k̄={k * m}: {statistics.mean(got[eps, k, counts, m]):.1f}"
                                      for m in mults), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
