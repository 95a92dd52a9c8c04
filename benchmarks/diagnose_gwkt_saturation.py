"""Diagnosis for GW-KT's K_i (issue #14): when do items reach Γ, and where is budget wasted?

One run (fresh OS key) on a public/private pair at ε = 3, δ = e^-10, α = 3:

* published GW-KT: for the items that reach Γ, the position p ∈ [0, 1) in the user order
  at which they do, by public-count bucket (median p, median public count × p): the
  "front" that ``kt_selection='front'`` predicts as public count ≥ κ·Γ/p;
* cascade-free GW-KT with ``kt_selection='prefix'`` (Δ0 = 100) and the default
  (``'front'``, Δ0 = 20): Γ, T, the expected released count, and the budget left unspent
  by users whose K_i was all at Γ, per tenth of the order.

Not private output: it reads the finished histograms.

    PYTHONPATH=. python benchmarks/diagnose_gwkt_saturation.py --data /work/shared/data \
        --private commits-ansible --public commits-rails
"""
import argparse
import math
import os
import sys

import numpy as np
from scipy import stats

from beam_dpsu import policies as P
from beam_dpsu import textio
from beam_dpsu.noise import RunKey
from beam_dpsu.ordered import GWKT
from beam_dpsu.pipelines.compare import users_per_item

E10 = math.exp(-10)
BUCKETS = [(1, 50), (50, 100), (100, 200), (200, 500), (500, 1000), (1000, 10 ** 9)]


def walk(per_user, public, mechanism, rk):
    """Applies the policy user by user; yields (position, ids, change of the user's sum)."""
    pol = mechanism.policy(rk)
    order_key = rk.subkey("order")
    keyed, items = [], {}
    for user, counts in per_user.items():
        ids, _ = pol.prepare(user, counts, public)
        for item in counts:
            items[pol.item_ids(item)] = item
        if ids:
            keyed.append((P.user_position(order_key, user), ids))
    keyed.sort(key=lambda k: k[0])
    hist = {}
    for p, ids in keyed:
        before = sum(hist.get(i, 0.0) for i in ids)
        pol.update(hist, ids)
        yield p, ids, sum(hist.get(i, 0.0) for i in ids) - before, hist, pol.cutoff, items


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--private", default="commits-ansible")
    ap.add_argument("--public", default="commits-rails")
    args = ap.parse_args()
    load = lambda n: textio.read_per_user(os.path.join(args.data, n + ".pairs.tsv.gz"))
    per_user = load(args.private)
    public = users_per_item(load(args.public))  # distinct users per item
    print(f"private {args.private}, public {args.public}")

    full_at = {}
    for p, ids, _, hist, cutoff, items in walk(
            per_user, public, GWKT(3, E10, public, 3, variant="published"), RunKey.fresh()):
        for i in ids:
            if i not in full_at and hist.get(i, 0.0) >= cutoff:
                full_at[i] = p
    rows = np.array([(public.get(items[i], 1), p) for i, p in full_at.items()], float)
    print(f"\npublished GW-KT: Γ = {cutoff:.2f}; {len(full_at)} items reach Γ\n")
    print("| public count | items reaching Γ | median position p | median public count × p |")
    print("|---|---|---|---|")
    for lo, hi in BUCKETS:
        sel = (rows[:, 0] >= lo) & (rows[:, 0] < hi)
        if sel.any():
            print(f"| {lo}–{hi if hi < 10 ** 9 else '∞'} | {int(sel.sum())} | "
                  f"{np.median(rows[sel, 1]):.3f} | {np.median(rows[sel, 0] * rows[sel, 1]):.0f} |")

    for label, m in [("prefix, Δ0=100", GWKT(3, E10, public, 3, kt_selection="prefix")),
                     ("front (default), Δ0=20", GWKT(3, E10, public, 3))]:
        waste = np.zeros(10)
        for p, ids, spent, hist, cutoff, _ in walk(per_user, public, m, RunKey.fresh()):
            waste[int(p * 10)] += 1.0 - spent
        r = m.calibration
        w = np.fromiter(hist.values(), float)
        expected = stats.laplace(scale=r.noise_scale).sf(r.threshold - w).sum()
        print(f"\n{label}: Γ = {cutoff:.2f}, T = {r.threshold:.2f}, expected released "
              f"{expected:.1f}; unspent budget per tenth of the order: "
              f"{[int(round(x)) for x in waste]} (total {waste.sum():.0f} of "
              f"{len(per_user)} users)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
