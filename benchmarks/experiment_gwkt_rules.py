"""Experiment: rules for choosing GW-KT's kept items K_i (issue #14), on any public/private pair.

Every rule keeps at most Δ0 items of the user's public-count walk order and
depends only on the user's own items, the public counts, the run key and the
user's own position p_i ∈ [0, 1) in the keyed processing order
(``user_sort_key(run_key.subkey('order'), user)[0] / 2^64``), so the proof of
docs/gw.md applies to each of them. A user with n ≤ Δ0 items keeps all of them.
For n > Δ0 the kept items are the Δ0 walk items starting at ``start``:

* ``prefix:D0``            start = 0 (the library's rule until issue #14's follow-up);
* ``window:D0:C``          start = ⌊min(1, C·p_i)·(n − Δ0)⌋ (section 4 of RESULTS-gw.md);
* ``pred:D0:K[:M]``        start = min(n − Δ0, max(0, s − M)), s = the number of the user's
                           items with public count ≥ K·Γ/p_i ("predicted to be at Γ before
                           p_i": an item held by c users fills after about Γ/c of the order
                           when each holder puts 1 on it); M items of margin (default 0).

``published`` runs the published GW-KT (unproven) for the comparison; ``library`` the
library's default ``GWKT`` (``kt_selection='front'``, which is ``pred:20:20:4``) and
``library-prefix`` its ``kt_selection='prefix'`` (Δ0 = 100, which is ``prefix:100``).

Metric ``expected`` (default): Σ_items P(weight + noise > T) over a run's finished
histogram (free of the noise's own spread); ``released``: one noisy release per run
(``core.run_local``). ε = 3, δ = e^-10, α = 3, η = 0.001; public counts = distinct users
per item of the public dataset. Fresh OS keys for every run.

    PYTHONPATH=. python benchmarks/experiment_gwkt_rules.py --data /work/shared/data \
        --private commits-ansible --public commits-rails prefix:100 window:50:1 pred:50:1
"""
import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
from scipy import stats

from beam_dpsu import core
from beam_dpsu import policies as P
from beam_dpsu import textio
from beam_dpsu.noise import RunKey
from beam_dpsu.ordered import GWKT
from beam_dpsu.pipelines.compare import users_per_item

E10 = math.exp(-10)
EPS, ALPHA, ETA = 3.0, 3.0, 0.001


class RulePolicy(P.CascadeFreeGreedyPolicy):
    def __init__(self, *a, order_key, rule, params, **k):
        super().__init__(*a, **k)
        self.order_key, self.rule, self.params = order_key, rule, params

    def prepare(self, user, counts, public_counts=None):
        ids, items = P.GreedyPolicy.prepare(self, user, counts, public_counts)
        n, d0 = len(ids), self.max_items
        if n <= d0:
            return ids, items
        p = P.user_sort_key(self.order_key, user)[0] / 2.0 ** 64
        if self.rule == "prefix":
            start = 0
        elif self.rule == "window":
            start = int(min(1.0, self.params[0] * p) * (n - d0))
        elif self.rule == "pred":
            k, m = self.params[0], (int(self.params[1]) if len(self.params) > 1 else 0)
            if p <= 0:
                s = 0
            else:
                bar = k * self.cutoff / p
                get = public_counts.get
                s = sum(1 for u in counts if get(u, 1) >= bar)
            start = min(n - d0, max(0, s - m))
        else:
            raise ValueError(self.rule)
        ids = ids[start:start + d0]
        kept, iid = set(ids), self.item_ids
        return ids, [u for u in items if iid(u) in kept]


class RuleGWKT(GWKT):
    """The cascade-free GW-KT mechanism (library calibration and release) with a K_i rule."""

    def __init__(self, public, d0, rule, params):
        super().__init__(EPS, E10, public, ALPHA, max_items=d0, eta=ETA)
        self.rule, self.params = rule, params

    def policy(self, run_key):
        return RulePolicy(self.cutoff, run_key.subkey("item-order"), self.max_items, self.eta,
                          use_public_counts=True, order_key=run_key.subkey("order"),
                          rule=self.rule, params=self.params)


def run_one(per_user, public, setting, metric):
    parts = setting.split(":")
    if parts[0] == "published":
        m = GWKT(EPS, E10, public, ALPHA, variant="published")
    elif parts[0] == "library":
        m = GWKT(EPS, E10, public, ALPHA)
    elif parts[0] == "library-prefix":
        m = GWKT(EPS, E10, public, ALPHA, kt_selection="prefix")
    else:
        m = RuleGWKT(public, int(parts[1]), parts[0], [float(x) for x in parts[2:]])
    rk = RunKey.fresh()
    if metric == "released":
        return len(core.run_local(per_user, m, rk))
    r = m.calibration
    w = np.fromiter(m.histogram_local(per_user, rk).values(), float)
    return float(stats.laplace(scale=r.noise_scale).sf(r.threshold - w).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--private", default="commits-rails")
    ap.add_argument("--public", default="commits-ansible")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--metric", choices=("expected", "released"), default="expected")
    ap.add_argument("settings", nargs="+")
    args = ap.parse_args()
    load = lambda name: textio.read_per_user(os.path.join(args.data, name + ".pairs.tsv.gz"))
    per_user = load(args.private)
    public = users_per_item(load(args.public))  # distinct users per item
    print(f"private {args.private}, public {args.public}, metric {args.metric}, "
          f"{args.runs} runs", flush=True)
    for setting in args.settings:
        t0 = time.time()
        out = [run_one(per_user, public, setting, args.metric) for _ in range(args.runs)]
        sd = statistics.stdev(out) if len(out) > 1 else 0.0
        print(f"{setting}: {statistics.mean(out):.1f} ± {sd:.1f} "
              f"(runs {[round(x) for x in out]}; {time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
