"""Top-k and k-hitting sets over an unknown domain: discovery then peeling, against baselines.

    python benchmarks/bench_topk_methods.py [--data-dir ../shared/data] [--runs 5]
        [--epsilons 1 3] [--delta 1e-5] [--ks 10 50 200] [--datasets FILE ...]
        [--max-items 100] [--shares 0.25 0.5 0.75] [--output FILE]

Runs the Beam-free core (``run_local``) of each mechanism on the shared datasets
(``*.pairs.tsv.gz``, read with ``dp.data.lines.read_user_items``; a user seen twice
has their counts merged) and prints Markdown tables (also written to
``--output``). Every run draws a fresh ``RunKey``; nothing is hard-coded.

Every private method has the same whole-release guarantee, the target (ε, δ):

* discover-peel (``DiscoverPeelTopK``, ``DiscoverPeelHittingSet``): (ε, δ) split
  between Weighted Gaussian discovery (share ``discovery_share``, default 0.5,
  Δ0 = ``--max-items``) and the peeling stage; its ``guarantee`` is checked to
  be ≤ (ε, δ).
* limited-domain (``TopKMechanism``, Durfee and Rogers' Algorithm 2, no counts)
  with k̄ = k and k̄ = 5k and unrestricted sensitivity (``max_items=None``, as
  the paper runs it when k̄ is finite). Its ``guarantee`` is checked to be
  ≤ (ε, δ). When the constructor's ε is the whole query's (it then reports
  exactly (ε, δ)), it is used as is; when its ε is per selection (the
  guarantee then exceeds the target), the largest per-selection ε whose
  guarantee fits (ε, δ) is found by bisection, and the table header says which.
* Weighted Gaussian then rank (hitting-set baseline): ``WeightedGaussian(ε, δ,
  Δ0)`` with the FULL budget; of its released items, the k with the largest
  noisy weights, each noisy weight being the item's weight plus the noise the
  mechanism's release rule drew for it (the same keyed Gaussian draw, under the
  run key and the purpose ``noise/0``; the script checks every released item's
  noisy weight exceeds the threshold). A benchmark baseline, not a library
  mechanism.

Measures (N(x): the number of users holding item x; N: the number of distinct
(user, item) pairs, the sum of N(x); N_(j): the j-th largest N(x), 0 past the
number of items; S: the released items, at most k):

* top-k missing mass (users), the paper's MM_k (Dick, Joseph and Raman, ICLR
  2026, Definition 4.1): (N_(1) + ... + N_(k) − Σ_{x ∈ S} N(x)) / N. Lower is
  better. It is NOT the library's occurrence-based missing mass
  (``dp/evaluation/utility.py``), which weighs items by occurrences, not users.
* k-relative error: N_(k) − min_{x ∈ S} N(x) when k items were released, and
  N_(k) when fewer were (a missing rank counts as an item held by no one). In
  users; lower is better.
* hit share (k-hitting set): the users holding at least one item of S, divided
  by all users (users with at least one item). Higher is better. The ceiling is
  the non-private greedy maximum coverage on the true data (ties by the item's
  encoded bytes).

Each figure is the mean ± standard error (sd/√runs) over the runs. A comparison
is a win (discover-peel's mean is better), a loss, or a tie when the two means
differ by at most one standard error of the difference, √(se₁² + se₂²).

The share sweep runs ``DiscoverPeelTopK`` at ε = 1 (the first of
``--sweep-epsilon``), k = 50 for each ``--shares`` value on every dataset.
"""
from __future__ import annotations

import argparse
import datetime
import heapq
import math
import pathlib
import platform
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from beam_dpsu.dp.data.lines import read_user_items  # noqa: E402
from beam_dpsu.dp.mechanisms.histogram_threshold import WeightedGaussian  # noqa: E402
from beam_dpsu.dp.mechanisms.peeling import (DiscoverPeelHittingSet,  # noqa: E402
                                             DiscoverPeelTopK)
from beam_dpsu.dp.mechanisms.topk import TopKMechanism  # noqa: E402
from beam_dpsu.dp.randomness.noise import RunKey, encode_value  # noqa: E402

SUFFIX = ".pairs.tsv.gz"


# --------------------------------------------------------------------------
# Data and measures.
# --------------------------------------------------------------------------

def load(path: pathlib.Path) -> Tuple[Dict[str, Dict[str, int]], int]:
    """``({user: {item: count}}, malformed lines)``; a user seen twice is merged."""
    per_user: Dict[str, Dict[str, int]] = {}
    malformed = 0
    for kind, value in read_user_items(str(path)):
        if kind != "user":
            malformed += 1
            continue
        user, counts = value
        merged = per_user.setdefault(user, {})
        for item, n in counts.items():
            merged[item] = merged.get(item, 0) + n
    return per_user, malformed


class Truth:
    """The non-private quantities of one dataset."""

    def __init__(self, per_user: Dict[str, Dict[str, int]]):
        self.per_user = per_user
        self.users = [set(items) for items in per_user.values() if items]
        n_x: Dict[str, int] = {}
        for held in self.users:
            for x in held:
                n_x[x] = n_x.get(x, 0) + 1
        self.n_x = n_x
        self.total = sum(n_x.values())  # N: distinct (user, item) pairs
        self.sorted_n = sorted(n_x.values(), reverse=True)

    def nth(self, j: int) -> int:
        """N_(j), 1-based; 0 past the number of items."""
        return self.sorted_n[j - 1] if j <= len(self.sorted_n) else 0

    def top_sum(self, k: int) -> int:
        return sum(self.sorted_n[:k])

    def missing_mass_k(self, released: Sequence[Any], k: int) -> float:
        """MM_k: (sum of the k largest N − sum of N over the released) / N."""
        got = sum(self.n_x.get(x, 0) for x in released)
        return (self.top_sum(k) - got) / self.total

    def relative_error_k(self, released: Sequence[Any], k: int) -> float:
        """N_(k) − the smallest released N (N_(k) when fewer than k were released)."""
        if len(released) < k:
            return float(self.nth(k))
        return float(self.nth(k) - min(self.n_x.get(x, 0) for x in released))

    def hit_share(self, released: Sequence[Any]) -> float:
        s = set(released)
        return sum(1 for held in self.users if not s.isdisjoint(held)) / len(self.users)

    def greedy(self, k: int) -> List[str]:
        """Non-private greedy maximum coverage (lazy evaluation; ties by encoded item)."""
        holders: Dict[str, List[int]] = {}
        for u, held in enumerate(self.users):
            for x in held:
                holders.setdefault(x, []).append(u)
        hit = [False] * len(self.users)
        heap = [(-len(us), encode_value(x), x) for x, us in holders.items()]
        heapq.heapify(heap)
        chosen: List[str] = []
        while heap and len(chosen) < k:
            neg, enc, x = heapq.heappop(heap)
            gain = sum(1 for u in holders[x] if not hit[u])
            if heap and (-gain, enc) > heap[0][:2]:
                heapq.heappush(heap, (-gain, enc, x))  # stale: re-insert with its gain
                continue
            chosen.append(x)
            for u in holders[x]:
                hit[u] = True
        return chosen


# --------------------------------------------------------------------------
# Mechanisms at the target guarantee.
# --------------------------------------------------------------------------

def fits(mechanism, epsilon: float, delta: float) -> bool:
    g = mechanism.guarantee
    ok = g.epsilon <= epsilon and g.delta <= delta
    c = getattr(mechanism, "composition", None)
    if c is not None:
        ok = ok and c.epsilon <= epsilon and c.delta <= delta
    return ok


_LD_CACHE: Dict[Tuple[int, int, float, float], Tuple[TopKMechanism, str]] = {}


def limited_domain(k: int, k_bar: int, epsilon: float, delta: float
                   ) -> Tuple[TopKMechanism, str]:
    """``TopKMechanism`` (Algorithm 2, unrestricted sensitivity) whose guarantee fits
    (ε, δ), and how its ε was set: ``'whole-query'`` or ``'bisected per-selection'``."""
    key = (k, k_bar, epsilon, delta)
    if key in _LD_CACHE:
        return _LD_CACHE[key]
    m = TopKMechanism(k, epsilon, delta, k_bar=k_bar, max_items=None)
    if fits(m, epsilon, delta):
        out = (m, "whole-query")
    else:
        out = None
        # Per-selection ε: the largest whose stated guarantee fits the target.
        for d in (delta, delta / 2):
            lo, hi = 0.0, epsilon
            for _ in range(80):
                mid = (lo + hi) / 2
                if fits(TopKMechanism(k, mid, d, k_bar=k_bar, max_items=None), epsilon, delta):
                    lo = mid
                else:
                    hi = mid
            if lo > 0:
                out = (TopKMechanism(k, lo, d, k_bar=k_bar, max_items=None),
                       "bisected per-selection")
                break
        if out is None:
            raise RuntimeError(f"no TopKMechanism(k={k}, k_bar={k_bar}) fits ({epsilon}, {delta})")
    _LD_CACHE[key] = out
    return out


def discover_peel_top_k(k, epsilon, delta, max_items, share):
    m = DiscoverPeelTopK(k, epsilon, delta, max_items=max_items, discovery_share=share)
    assert fits(m, epsilon, delta), m.guarantee
    return m


def items_of(rows) -> List[Any]:
    return [row[1] for row in rows]


def wg_rank(per_user, k: int, mechanism: WeightedGaussian, run_key: RunKey) -> List[Any]:
    """Weighted Gaussian's release, its k items of largest noisy weight (the noise the
    release rule drew for each item under the same run key)."""
    rule = mechanism.release_rule(run_key)
    hist = mechanism.histogram_local(per_user, run_key)
    items = [x for x, w in hist.items() if rule(x, w)]
    noisy = [(hist[x] + z, encode_value(x), x) for x, z in zip(items, rule.noise_values(items))]
    return [x for _, _, x in heapq.nlargest(k, noisy)]


# --------------------------------------------------------------------------
# Statistics and formatting.
# --------------------------------------------------------------------------

def mean_se(values: Sequence[float]) -> Tuple[float, float]:
    m = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return m, se


def verdict(ours: Tuple[float, float], theirs: Tuple[float, float], lower_better: bool) -> str:
    """'win', 'tie' or 'loss' of ours (mean, se) against theirs."""
    diff = ours[0] - theirs[0]
    if abs(diff) <= math.hypot(ours[1], theirs[1]):
        return "tie"
    better = diff < 0 if lower_better else diff > 0
    return "win" if better else "loss"


def fmt(ms: Tuple[float, float], digits: int = 4) -> str:
    return f"{ms[0]:.{digits}f} ± {ms[1]:.{digits}f}"


def fmt_err(ms: Tuple[float, float]) -> str:
    return f"{ms[0]:.1f} ± {ms[1]:.1f}"


def repeat(runs: int, f: Callable[[], float]) -> List[float]:
    return [f() for _ in range(runs)]


# --------------------------------------------------------------------------
# Main.
# --------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"),
                   help="folder of the *.pairs.tsv.gz datasets (default ../shared/data from "
                        "the repository root)")
    p.add_argument("--datasets", nargs="*",
                   help="file names in --data-dir (default: every *.pairs.tsv.gz there)")
    p.add_argument("--runs", type=int, default=5, help="runs per configuration (default 5)")
    p.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0])
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--ks", type=int, nargs="+", default=[10, 50, 200])
    p.add_argument("--max-items", type=int, default=100,
                   help="Δ0 of the Weighted Gaussian discovery and baseline (default 100)")
    p.add_argument("--shares", type=float, nargs="*", default=[0.25, 0.5, 0.75],
                   help="discovery shares of the sweep (none: no sweep)")
    p.add_argument("--sweep-epsilon", type=float, default=1.0)
    p.add_argument("--sweep-k", type=int, default=50)
    p.add_argument("--output", help="also write the Markdown to this file")
    args = p.parse_args(argv)
    if args.runs < 2:
        p.error("--runs must be at least 2 (standard errors)")
    data_dir = pathlib.Path(args.data_dir)
    names = args.datasets or sorted(f.name for f in data_dir.glob("*" + SUFFIX))
    if not names:
        p.error(f"no *{SUFFIX} in {data_dir}")

    started = time.time()
    eps_delta = [(e, args.delta) for e in args.epsilons]
    topk_rows, hs_rows, sweep_rows, data_rows = [], [], [], []
    tally: Dict[str, Dict[str, int]] = {}
    ld_modes = set()

    def count(measure: str, v: str) -> str:
        tally.setdefault(measure, {"win": 0, "tie": 0, "loss": 0})[v] += 1
        return v

    for name in names:
        t0 = time.time()
        per_user, malformed = load(data_dir / name)
        truth = Truth(per_user)
        label = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else name
        greedy = truth.greedy(max(args.ks))
        for epsilon, delta in eps_delta:
            for k in args.ks:
                # -- top-k --------------------------------------------------
                dp_m = discover_peel_top_k(k, epsilon, delta, args.max_items, 0.5)
                lds = []
                for k_bar in (k, 5 * k):
                    m, mode = limited_domain(k, k_bar, epsilon, delta)
                    ld_modes.add(mode)
                    lds.append(m)
                outs: Dict[str, List[Tuple[float, float, int]]] = {}
                for key, mech in (("dp", dp_m), ("ld", lds[0]), ("ld5", lds[1])):
                    res = []
                    for _ in range(args.runs):
                        rel = items_of(mech.run_local(per_user, RunKey.fresh()))
                        res.append((truth.missing_mass_k(rel, k), truth.relative_error_k(rel, k),
                                    len(rel)))
                    outs[key] = res
                mm = {key: mean_se([r[0] for r in v]) for key, v in outs.items()}
                re = {key: mean_se([r[1] for r in v]) for key, v in outs.items()}
                nrel = {key: statistics.fmean(r[2] for r in v) for key, v in outs.items()}
                topk_rows.append(
                    f"| {label} | {epsilon:g} | {k} | {fmt(mm['dp'])} | {fmt(mm['ld'])} | "
                    f"{fmt(mm['ld5'])} | {count('MM_k vs k̄=k', verdict(mm['dp'], mm['ld'], True))}"
                    f" / {count('MM_k vs k̄=5k', verdict(mm['dp'], mm['ld5'], True))} | "
                    f"{fmt_err(re['dp'])} | {fmt_err(re['ld'])} | {fmt_err(re['ld5'])} | "
                    f"{count('k-rel. error vs k̄=k', verdict(re['dp'], re['ld'], True))} / "
                    f"{count('k-rel. error vs k̄=5k', verdict(re['dp'], re['ld5'], True))} | "
                    f"{nrel['dp']:.1f} / {nrel['ld']:.1f} / {nrel['ld5']:.1f} |")
                # -- k-hitting set ------------------------------------------
                hs_m = DiscoverPeelHittingSet(k, epsilon, delta, max_items=args.max_items)
                assert fits(hs_m, epsilon, delta), hs_m.guarantee
                wg_m = WeightedGaussian(epsilon, delta, args.max_items)
                assert fits(wg_m, epsilon, delta), wg_m.guarantee
                hs = mean_se(repeat(args.runs, lambda: truth.hit_share(
                    items_of(hs_m.run_local(per_user, RunKey.fresh())))))
                wg = mean_se(repeat(args.runs, lambda: truth.hit_share(
                    wg_rank(per_user, k, wg_m, RunKey.fresh()))))
                hs_rows.append(
                    f"| {label} | {epsilon:g} | {k} | {truth.hit_share(greedy[:k]):.4f} | "
                    f"{fmt(hs)} | {fmt(wg)} | {count('hit share vs WG-rank', verdict(hs, wg, False))} |")
        if args.shares:
            cells = []
            for share in args.shares:
                m = discover_peel_top_k(args.sweep_k, args.sweep_epsilon, args.delta,
                                        args.max_items, share)
                cells.append(fmt(mean_se(repeat(args.runs, lambda: truth.missing_mass_k(
                    items_of(m.run_local(per_user, RunKey.fresh())), args.sweep_k)))))
            sweep_rows.append(f"| {label} | " + " | ".join(cells) + " |")
        elapsed = time.time() - t0
        data_rows.append(f"| {label} | {len(truth.users):,} | {len(truth.n_x):,} | "
                         f"{truth.total:,} | {truth.nth(10)} / {truth.nth(50)} / "
                         f"{truth.nth(200)} | {malformed} | {elapsed:.0f} |")
        print(f"# {label}: {elapsed:.1f} s", file=sys.stderr, flush=True)

    total = time.time() - started
    cmd = "python benchmarks/bench_topk_methods.py " + " ".join(sys.argv[1:] if argv is None
                                                                 else argv)
    out = [
        f"Command: `{cmd.strip()}`. {datetime.date.today().isoformat()}, Python "
        f"{platform.python_version()}, {args.runs} runs per configuration, δ = {args.delta:g}, "
        f"Δ0 = {args.max_items} (discovery and the Weighted Gaussian baseline); total "
        f"{total:.0f} s. Limited-domain ε: {', '.join(sorted(ld_modes))}.",
        "",
        "| dataset | users | items | N (user-item pairs) | N_(10) / N_(50) / N_(200) | "
        "malformed | seconds |",
        "|---|---|---|---|---|---|---|",
        *data_rows,
        "",
        "Top-k (mean ± se; MM_k = top-k missing mass (users), lower is better; k-rel. error "
        "in users; verdicts are discover-peel's against limited-domain k̄ = k / k̄ = 5k; "
        "released = mean items released, discover-peel / k̄ = k / k̄ = 5k):",
        "",
        "| dataset | ε | k | MM_k discover-peel | MM_k LD k̄=k | MM_k LD k̄=5k | MM_k verdict | "
        "k-rel. err. DP | LD k̄=k | LD k̄=5k | k-rel. verdict | released |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *topk_rows,
        "",
        "k-hitting set (share of users hit, mean ± se; higher is better; greedy is the "
        "non-private ceiling; verdict of discover-peel against WG-rank):",
        "",
        "| dataset | ε | k | greedy (non-private) | discover-peel | WG then rank | verdict |",
        "|---|---|---|---|---|---|---|",
        *hs_rows,
        "",
    ]
    if sweep_rows:
        out += [f"Discovery share sweep: discover-peel top-k MM_k at ε = {args.sweep_epsilon:g}, "
                f"k = {args.sweep_k} (mean ± se):", "",
                "| dataset | " + " | ".join(f"share {s:g}" for s in args.shares) + " |",
                "|---|" + "---|" * len(args.shares), *sweep_rows, ""]
    out += ["Verdict counts (discover-peel: win / tie / loss):", ""]
    out += [f"- {measure}: {v['win']} / {v['tie']} / {v['loss']}" for measure, v in tally.items()]
    text = "\n".join(out) + "\n"
    print(text)
    if args.output:
        pathlib.Path(args.output).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
