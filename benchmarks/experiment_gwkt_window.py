"""Experiment (NOT the library's algorithm): GW-KT with a position-dependent window K_i.

The cascade-free GW-KT keeps K_i = the first Δ0 items of the public-count walk.
Every user walks the same public ranking, so its top items fill up early and a
late user whose K_i is all at Γ wastes budget (``RESULTS-gw.md``). This script
tries a variant: a user with n > Δ0 items keeps the window of Δ0 walk items
starting at ``⌊min(1, c·p_i)·(n − Δ0)⌋``, where ``p_i ∈ [0, 1)`` is the user's
position in the processing order (their keyed order hash / 2^64). K_i then
depends on the user's own data, the public counts, the run key and the user id
only, so the proof of docs/gw.md applies unchanged (condition (a′) with the
order position as part of the key-derived choice). It is a proposal for a
follow-up, not implemented in ``beam_dpsu``; the rule that was implemented
(``kt_selection='front'``) and its comparison with this window are in
``benchmarks/RESULTS-gw.md`` section 6 (``experiment_gwkt_rules.py``).

Reports the expected released count (Σ P(weight + noise > T) over the finished
histogram) on commits-rails with public counts from commits-ansible, ε = 3,
δ = e^-10, α = 3, η = 0.001, 3 runs per setting.

    PYTHONPATH=. python benchmarks/experiment_gwkt_window.py --data /work/shared/data \
        100:0 50:1 40:1 60:1 100:1
"""
import argparse
import math
import os
import statistics

import numpy as np
from scipy import stats

from beam_dpsu import calibration as cal
from beam_dpsu import policies as P
from beam_dpsu import textio
from beam_dpsu.noise import RunKey

E10 = math.exp(-10)


class WindowPolicy(P.CascadeFreeGreedyPolicy):
    def __init__(self, *a, order_key=None, c=1.0, **k):
        super().__init__(*a, **k)
        self.order_key, self.c = order_key, c

    def prepare(self, user, counts, public_counts=None):
        ids, items = P.GreedyPolicy.prepare(self, user, counts, public_counts)
        n = len(ids)
        if n <= self.max_items:
            return ids, items
        p = P.user_sort_key(self.order_key, user)[0] / 2.0 ** 64
        start = int(min(1.0, self.c * p) * (n - self.max_items))
        ids = ids[start:start + self.max_items]
        kept, iid = set(ids), self.item_ids
        return ids, [u for u in items if iid(u) in kept]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("settings", nargs="+", help="DELTA0:C pairs (C = 0: the library's K_i)")
    args = ap.parse_args()
    per_user = textio.read_per_user(os.path.join(args.data, "commits-rails.pairs.tsv.gz"))
    public = {}
    for items in textio.read_per_user(
            os.path.join(args.data, "commits-ansible.pairs.tsv.gz")).values():
        for item in items:
            public[item] = public.get(item, 0) + 1
    for setting in args.settings:
        d0, c = int(setting.split(":")[0]), float(setting.split(":")[1])
        t = cal.gw_cascade_free_threshold(3, E10, d0)
        lam = cal.weighted_laplace_scale(3)
        cutoff = cal.policy_cutoff(t, lam, 3)
        out = []
        for _ in range(args.runs):
            rk = RunKey.fresh()
            pol = WindowPolicy(cutoff, rk.subkey("item-order"), d0, 0.001,
                               use_public_counts=True, order_key=rk.subkey("order"), c=c)
            w = np.fromiter(P.run_sequential(per_user, pol, rk, public).values(), float)
            out.append(float(stats.laplace(scale=lam).sf(t - w).sum()))
        print(f"Δ0={d0} c={c:g}: expected released {statistics.mean(out):.1f} "
              f"(runs {[round(x) for x in out]})", flush=True)


if __name__ == "__main__":
    main()
