"""Leave-one-dataset-out evaluation of the cascade-free GW and GW-KT parameter rules.

Question: do the proven (cascade-free) ``gw`` and ``gw-kt`` keep at least 0.9× the items
of the published, unproven greedy on data their parameters were *not* chosen on?

Protocol (``benchmarks/RESULTS.md`` section 11):

* folds. ``gw``: one fold per shared dataset (commits-ansible, commits-rails,
  movielens-small, paths-ansible, reddit-titles). ``gw-kt``: one fold per pairing of a
  private dataset with public counts (distinct users per item) from *other users*:
  commits-ansible ← commits-rails and commits-rails ← commits-ansible (another
  project), and for paths-ansible, reddit-titles and movielens-small the users split
  in two halves by a hash of the user id (private: one half, public counts: the other;
  no second corpus of their kind is shared).
* candidates. A candidate is a *rule*: every parameter a function of public quantities
  only (ε, δ, α, Δ0, the public counts), never of the private data (docs/gw.md,
  section 5). At the protocol's fixed ε, δ, α a rule is one parameter setting; the
  grid is printed with the results.
* leave-one-out. For each fold, the candidate with the largest *smallest* ratio over
  the other folds (ties: the larger mean) is chosen, and its ratio on the left-out
  fold is reported. The 0.9× target is met only if every left-out ratio is ≥ 0.9.
* ratio. Cascade-free released / published released under the same test seed
  (same user order and item hash), mean and standard deviation over the seeds.
  Released is the *expected* released count of the finished histogram,
  Σ_u P(H[u] + Lap(1/ε) > T): the mean of the release given the histogram, without
  the noise's own spread (which only adds variance). The published greedy is run
  with the authors' tie-break (first-occurrence, their reference code's record
  order), and also with the candidate's own tie-break (column ``same tb``).

Speed: each user's full walk (published order) is computed once per dataset, seed and
tie-break with the library's ``GreedyPolicy.prepare``; a candidate then slices K_i out
of it exactly as ``CascadeFreeGreedyPolicy.prepare`` does and runs the library's
compiled kernel (``dp.data.kernels``). ``--check`` verifies on one dataset that this gives the
same histogram as ``GW.histogram_local`` / ``GWKT.histogram_local`` (the library's own
Beam-free run), to 1e-9.

Mismatched public data (``--kt-folds mismatched`` or ``all``; default ``basic``, the five
pairings above): for each shared dataset X, 'X low->high' (public counts from the half of
X's users with fewer distinct items, ranked by (n_i, hash of the id); private: the other
half), 'X high->low' (the reverse) and 'X 10%' (public: a hash-chosen 10% of the users;
private: the other 90%).

Scale rules (``--kt-rules``, the product of the ``--rule-*`` lists; ``ScaleRule``): κ, M
and Δ0 as functions of the private scale and of the public counts: κ = κ0·R^a·(m/m_ref)^b
with R = P_pub/P (``--rule-stat pairs``; P = Σ_i min(n_i, 100), m = P/N) or R = S/N
(``rank-mean``, ``rank-geo``, ``rank-at<q>``: S a statistic of k·c_(k), c_(k) the k-th
largest public count, over the ranks k ≤ N/Γ; ``FoldStats.rank_scale``); Δ0 = gw's rule +
``--rule-extra`` or (``--rule-width D:LOW:HIGH``) the library's ``max_items_from_estimate``;
M = ``--rule-margin`` or (``--rule-margin-fraction F``) ``front_margin_for(Δ0, F)``. The
exact statistics are an oracle; ``--est-share s`` reads them from the library's DP
estimate instead (``release_scale`` of the users' activity histogram at ε_est = s·ε,
``--est-draws`` per seed; N then comes from it and P is not released) and runs the
mechanism at the rest of ε (``noisy_stats``); the published greedy keeps the full ε.
Such a rule is proof-compatible only when it reads DP output (docs/gw.md section 3, "Δ0,
M and κ from a DP estimate"); the exact values are for measurement. The command line's
gw-kt (``default_kt``: the library's constants, its default share) is the first table of
every gw-kt run; ``--fixed-baseline`` adds the fixed front (κ = 10, M = 8).

Runs are seeded (``RunKey.from_test_seed``): reproducible, NOT private; for
measurement only.

    PYTHONPATH=. python benchmarks/gw_generalise.py --data ../shared/data            # full
    PYTHONPATH=. python benchmarks/gw_generalise.py --data ../shared/data --quick    # ~3 min
    PYTHONPATH=. python benchmarks/gw_generalise.py --data ../shared/data --defaults-only
    PYTHONPATH=. python benchmarks/gw_generalise.py --data ../shared/data --only gw-kt \
        --kt-folds all --kt-tie-breaks first-occurrence --kt-rules --rule-stat rank-mean \
        --rule-kappa0 1.28 1.44 1.6 --rule-width 1.25:0.25:2 1.5:0.25:2 2:0.25:2 \
        --rule-margin-fraction 0.4 0.5 0.6 [--est-share 0.01]

Without the datasets it prints which files are missing and exits with status 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import itertools
import json
import math
import os
import pathlib
import statistics
import sys
import time
from typing import Dict, List, Sequence, Tuple

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from beam_dpsu.dp.privacy import calibration as cal  # noqa: E402
from beam_dpsu.dp.data import kernels  # noqa: E402
from beam_dpsu.dp.privacy import params  # noqa: E402
from beam_dpsu.dp.data import sequential as seq  # noqa: E402
from beam_dpsu.dp.mechanisms.activity import (ScaleEstimate, release_scale,  # noqa: E402
                                              scale_statistics)
from beam_dpsu.dp.mechanisms.policy import (FRONT_SCALE_RANGE, GW, GWKT,  # noqa: E402
                                            front_margin_for, max_items_from_estimate)
from beam_dpsu.dp.randomness.noise import RunKey  # noqa: E402

DATASETS = ["commits-ansible", "commits-rails", "movielens-small", "paths-ansible",
            "reddit-titles"]
#: gw-kt folds: (name, private source, public source); "half:X" = X's users split in two.
KT_PAIRS = [("commits-ansible<-commits-rails", "commits-ansible", "commits-rails"),
            ("commits-rails<-commits-ansible", "commits-rails", "commits-ansible"),
            ("paths-ansible halves", "half-a:paths-ansible", "half-b:paths-ansible"),
            ("reddit-titles halves", "half-a:reddit-titles", "half-b:reddit-titles"),
            ("movielens-small halves", "half-a:movielens-small", "half-b:movielens-small")]
#: mismatched gw-kt folds (``--kt-folds mismatched``): public counts from users of other
#: activity or number than the private ones. "low:X"/"high:X": X's users below / at or
#: above the median of distinct items (ties at the median split by the user hash, so both
#: sides hold half the users: paths-ansible's median user holds 1 path, and a strict
#: "below the median" would be empty there); "tenth:X" / "rest:X": a hash-chosen 10% of
#: X's users / the other 90%.
KT_MISMATCHED = [p for x in DATASETS for p in (
    (f"{x} low->high", f"high:{x}", f"low:{x}"),
    (f"{x} high->low", f"low:{x}", f"high:{x}"),
    (f"{x} 10%", f"rest:{x}", f"tenth:{x}"))]
KT_FOLD_SETS = {"basic": KT_PAIRS, "mismatched": KT_MISMATCHED,
                "all": KT_PAIRS + KT_MISMATCHED}
AUTHORS_TIE_BREAK = "first-occurrence"
#: the clip C of the private pair count P = Σ_i min(n_i, C) (the scale rules' statistic).
PAIR_CLIP = 100


# -- data ------------------------------------------------------------------------------

def read_pairs(path: str) -> Dict[str, Dict[str, int]]:
    """``{user: {item: count}}`` of a ``user<TAB>item`` .tsv.gz, each user's items in
    record order (what ``tie_break='first-occurrence'`` reads)."""
    out: Dict[str, Dict[str, int]] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            user, tab, item = line.rstrip("\n").partition("\t")
            if not tab:
                continue
            d = out.get(user)
            if d is None:
                d = out[user] = {}
            d[item] = d.get(item, 0) + 1
    return out


def half(per_user, which: str):
    """The users whose sha256(id) is even ('a') or odd ('b'): a split independent of data."""
    bit = 0 if which == "a" else 1
    return {u: c for u, c in per_user.items()
            if hashlib.sha256(u.encode()).digest()[0] & 1 == bit}


def _uhash(u: str) -> int:
    return int.from_bytes(hashlib.sha256(u.encode()).digest()[:8], "big")


def median_split(per_user, which: str):
    """The half of the users with fewer ('low') / more ('high') distinct items: users
    ranked by (number of distinct items, sha256 of the id), split at the middle."""
    ranked = sorted(per_user, key=lambda u: (len(per_user[u]), _uhash(u)))
    cut = len(ranked) // 2
    keep = set(ranked[:cut] if which == "low" else ranked[cut:])
    return {u: c for u, c in per_user.items() if u in keep}


def tenth_split(per_user, which: str):
    """A hash-chosen 10% of the users ('tenth': sha256(id) mod 10 == 3) or the rest."""
    want = which == "tenth"
    return {u: c for u, c in per_user.items() if (_uhash(u) % 10 == 3) == want}


def users_per_item(per_user) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for counts in per_user.values():
        for item in counts:
            out[item] = out.get(item, 0) + 1
    return out


class Data:
    def __init__(self, root: str):
        self.root = root
        self._cache = {}

    def get(self, source: str):
        if source not in self._cache:
            if source.startswith("half-"):
                which, name = source[5], source.split(":", 1)[1]
                self._cache[source] = half(self.get(name), which)
            elif ":" in source:
                which, name = source.split(":", 1)
                split = median_split if which in ("low", "high") else tenth_split
                self._cache[source] = split(self.get(name), which)
            else:
                self._cache[source] = read_pairs(os.path.join(self.root,
                                                              source + ".pairs.tsv.gz"))
        return self._cache[source]


def missing_files(root: str) -> List[str]:
    return [n for n in DATASETS if not os.path.exists(os.path.join(root, n + ".pairs.tsv.gz"))]


# -- one prepared fold -----------------------------------------------------------------

@dataclasses.dataclass
class Walks:
    """Every user's full walk (ids), in processing order, for one seed and tie-break."""
    walks: List[np.ndarray]
    positions: np.ndarray          # p_i = order hash / 2^64
    public_desc: List[np.ndarray]  # kt: the user's items' public counts, descending
    _flat: tuple = None

    def flat(self):
        """(walk ids, public counts, offsets): the walks concatenated (the fast path)."""
        if self._flat is None:
            lengths = np.fromiter((len(w) for w in self.walks), dtype=np.int64,
                                  count=len(self.walks))
            offsets = np.zeros(len(self.walks) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            ids = (np.concatenate(self.walks) if self.walks else np.zeros(0, np.int64))
            pcs = (np.concatenate(self.public_desc) if self.public_desc and
                   self.public_desc[0] is not None else np.zeros(len(ids)))
            self._flat = (ids.astype(np.int64), pcs.astype(float), offsets)
        return self._flat


def prepare_walks(per_user, seed: int, tie_break: str, public=None) -> Walks:
    rk = RunKey.from_test_seed(seed)
    pol = seq.GreedyPolicy(1.0, rk.subkey("item-order"), use_public_counts=public is not None,
                           tie_break=tie_break)
    order_key = rk.subkey("order")
    rows = []
    for user, counts in per_user.items():
        ids, _ = pol.prepare(user, counts, public)
        if not ids:
            continue
        pcs = None
        if public is not None:
            get = public.get
            pcs = np.sort(np.array([get(u, 1) for u in counts], dtype=float))[::-1]
        rows.append((seq.user_sort_key(order_key, user), np.array(ids, dtype=np.int64), pcs,
                     seq.user_position(order_key, user)))
    rows.sort(key=lambda r: r[0])
    return Walks([r[1] for r in rows], np.array([r[3] for r in rows]), [r[2] for r in rows])


def expected_released(weights: np.ndarray, threshold: float, epsilon: float) -> float:
    """Σ P(w + Lap(1/ε) > T) over the histogram's weights."""
    d = epsilon * (weights - threshold)
    return float(np.where(d >= 0, 1.0 - 0.5 * np.exp(-np.abs(d)), 0.5 * np.exp(-np.abs(d))).sum())


def run_kernel(kind: str, cutoff: float, kept: Sequence[np.ndarray], eta: float = 0.0):
    lengths = np.fromiter((len(k) for k in kept), dtype=np.int64, count=len(kept))
    ids = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    runner = kernels.DenseRunner(kind, cutoff, eta=eta)
    runner.add_users(ids, lengths)
    return runner.arrays()


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One rule at the protocol's (ε, δ, α): Δ0, η, tie-break, and K_i's selection.

    selection: 'prefix' (first Δ0), 'front' (GW-KT: κ, M), 'shift' (GW experiment: the
    window starts at ⌊min(1, κ·p_i)·(n_i − Δ0)⌋, a function of the user's own position).
    """
    max_items: int
    eta: float = params.DEFAULT_GW_ETA
    tie_break: str = "item-hash"
    selection: str = "prefix"
    scale: float = 0.0
    margin: int = 0
    keep: float = 0.0   # 'front' experiment: also keep this fraction of the predicted-full items
    head: int = 0       # 'front' experiment: K_i = the first `head` walk items + the window

    def label(self) -> str:
        s = f"Δ0={self.max_items} η={self.eta:g} {self.tie_break}"
        if self.selection == "front":
            s += f" front κ={self.scale:g} M={self.margin}"
            if self.keep:
                s += f" keep={self.keep:g}"
            if self.head:
                s += f" head={self.head}"
        elif self.selection == "shift":
            s += f" shift c={self.scale:g}"
        return s


def kept_items(w: Walks, c: Candidate, cutoff: float) -> List[np.ndarray]:
    d0 = c.max_items
    out = []
    for k, walk in enumerate(w.walks):
        n = len(walk)
        if n <= d0:
            out.append(walk)
            continue
        start = 0
        p = w.positions[k]
        if c.selection == "front" and p > 0.0:
            bar = c.scale * cutoff / p
            s = int(np.count_nonzero(w.public_desc[k] >= bar))
            start = min(n - d0, max(0, s - c.margin - int(c.keep * s)))
            if c.head and start > 0:
                h = min(c.head, d0)
                start = max(start, h)
                out.append(np.concatenate([walk[:h], walk[start:start + d0 - h]]))
                continue
        elif c.selection == "shift":
            start = int(min(1.0, c.scale * p) * (n - d0))
        out.append(walk[start:start + d0])
    return out


if kernels.available():
    import numba

    @numba.njit(cache=False)
    def _front_kept(ids, pcs, offsets, positions, d0, scale, cutoff, margin, front):
        """kept_items for 'prefix' / 'front' (no keep, no head), flat: (ids, lengths)."""
        n_users = offsets.size - 1
        lengths = np.empty(n_users, np.int64)
        total = 0
        for k in range(n_users):
            lengths[k] = min(offsets[k + 1] - offsets[k], d0)
            total += lengths[k]
        out = np.empty(total, np.int64)
        j = 0
        for k in range(n_users):
            a = offsets[k]
            n = offsets[k + 1] - a
            start = 0
            p = positions[k]
            if front and n > d0 and p > 0.0:
                bar = scale * cutoff / p
                s = 0
                while s < n and pcs[a + s] >= bar:
                    s += 1
                start = min(n - d0, max(0, s - margin))
            for t in range(lengths[k]):
                out[j + t] = ids[a + start + t]
            j += lengths[k]
        return out, lengths


def kept_flat(w: Walks, c: Candidate, cutoff: float):
    """(ids, lengths) of every user's K_i: ``kept_items`` compiled for 'prefix' and
    'front' without keep/head (``--check`` compares the two); the others through it."""
    if c.selection in ("prefix", "front") and not c.keep and not c.head:
        ids, pcs, offsets = w.flat()
        return _front_kept(ids, pcs, offsets, w.positions, c.max_items, float(c.scale),
                           float(cutoff), c.margin, c.selection == "front")
    kept = kept_items(w, c, cutoff)
    lengths = np.fromiter((len(k) for k in kept), dtype=np.int64, count=len(kept))
    return (np.concatenate(kept) if kept else np.zeros(0, np.int64)), lengths


def run_kernel_flat(kind: str, cutoff: float, ids: np.ndarray, lengths: np.ndarray,
                    eta: float = 0.0):
    runner = kernels.DenseRunner(kind, cutoff, eta=eta)
    runner.add_users(ids, lengths)
    return runner.arrays()


@dataclasses.dataclass(frozen=True)
class FoldStats:
    """What a scale rule may read: the private N and P (exact: the oracle; or
    Laplace-noised), and the public counts' own statistics."""
    users: float        # N: private users
    pairs: float        # P = Σ_i min(n_i, PAIR_CLIP), private
    pub_pairs: float    # P_pub = Σ public counts
    pub_items: float    # public items
    pub_max: float      # largest public count
    pub_desc: np.ndarray = dataclasses.field(default=None, compare=False, repr=False)
    #: the exact activity histogram (``activity.scale_statistics``), private
    histogram: np.ndarray = dataclasses.field(default=None, compare=False, repr=False)
    #: what the rules read: the released estimate, or (None) the exact histogram
    scale: "ScaleEstimate | None" = dataclasses.field(default=None, compare=False, repr=False)

    def scale_estimate(self) -> ScaleEstimate:
        """The estimate the rules read: the released one, or the exact histogram as an
        estimate of ε = ``EXACT_EPSILON`` (no bucket read as empty: the oracle)."""
        if self.scale is not None:
            return self.scale
        return ScaleEstimate(tuple(float(x) for x in self.histogram), EXACT_EPSILON)

    @property
    def m(self) -> float:
        return self.pairs / self.users

    def rank_scale(self, cutoff: float, how: str) -> float:
        """S/N, S a statistic of k·c_(k) (k-th largest public count) over the ranks
        k ≤ K = N/Γ the front can reach: with every user spending its whole budget at
        the front, the items full at position p are the top N·p/Γ, i.e. those with
        public count ≥ c_(Np/Γ) = (k·c_(k)/N)·Γ/p — κ's form with κ = k·c_(k)/N.
        how: 'mean', 'geo' (geometric mean) or 'at<q>' (the value at k = q·K)."""
        pc = self.pub_desc
        k_max = max(1, min(len(pc), int(self.users / cutoff)))
        kc = np.arange(1, k_max + 1) * pc[:k_max]
        if how == "mean":
            v = float(kc.mean())
        elif how == "geo":
            v = float(np.exp(np.log(kc).mean()))
        else:
            v = float(kc[max(0, int(float(how[2:]) * k_max) - 1)])
        return v / self.users


#: The oracle's stand-in ε: the exact histogram read as an estimate (nothing dropped).
EXACT_EPSILON = 1e12


def noisy_stats(st: FoldStats, share: float, epsilon: float, name: str, seed: int,
                draw: int) -> FoldStats:
    """``st`` with the library's DP estimate in place of the exact numbers:
    ``release_scale`` of the exact histogram at the calibration's ε (``split_epsilon``'s
    first part, as ``GWKT`` splits it), under a test key per (fold, seed, draw); N is the
    estimate's, P is not released (a rule reading it is refused)."""
    h = hashlib.sha256(f"est|{name}|{seed}|{draw}".encode()).digest()
    est = release_scale(st.histogram, cal.split_epsilon(epsilon, share)[0],
                        RunKey.from_test_seed(int.from_bytes(h[:6], "big")))
    return dataclasses.replace(st, users=est.users, pairs=math.nan, scale=est)


@dataclasses.dataclass(frozen=True)
class ScaleRule:
    """GW-KT's front parameters as a function of the (estimated) private scale:

    κ = κ0 · R^a · (m/m_ref)^b,  m = P/N, with R = P_pub/P (stat 'pairs') or
    R = S/N (stat 'rank-mean', 'rank-geo', 'rank-at<q>': ``FoldStats.rank_scale``);
    Δ0 = round((gw's Δ0 + extra) · (m/m_ref)^db), ≥ 1, or with ``width`` = (divisor,
    low, high) the library's ``max_items_from_estimate`` (the estimated median activity
    over divisor, within [low, high] × gw's Δ0); M = round(M0 · (m/m_ref)^mb), or with
    ``margin_fraction`` the library's ``front_margin_for(Δ0, fraction)``.
    ``share`` > 0: N and the activity come from the library's DP estimate at that share
    of ε (``draws`` noise draws per seed, the mechanism at the rest of ε); 0: the exact
    values (an oracle, not private).
    """
    kappa0: float
    a: float = 1.0
    b: float = 0.0
    m_ref: float = 30.0
    margin: float = params.DEFAULT_FRONT_MARGIN
    mb: float = 0.0
    extra: int = 4
    db: float = 0.0
    tie_break: str = params.DEFAULT_TIE_BREAK
    stat: str = "pairs"
    width: "Tuple[float, float, float] | None" = None
    margin_fraction: "float | None" = None
    share: float = 0.0
    draws: int = 4

    def candidate(self, st: FoldStats, epsilon: float, delta: float = math.exp(-10),
                  alpha: float = params.DEFAULT_ALPHA, total_epsilon: "float | None" = None
                  ) -> Candidate:
        """The candidate at the release's ``epsilon`` (``total_epsilon``: the whole
        budget, which the width rule reads; default ``epsilon``)."""
        total = epsilon if total_epsilon is None else total_epsilon
        if st.scale is not None and not st.scale.informative:
            # the library's fallback (GWKT.calibrated): too few users for the noise
            return dataclasses.replace(fixed_kt(total), tie_break=self.tie_break)
        if math.isnan(st.pairs) and (self.stat == "pairs" or self.b or self.mb or self.db):
            raise ValueError(f"{self.label()} reads P, which the estimate does not release")
        r = 1.0 if math.isnan(st.pairs) else st.m / self.m_ref
        if self.width is not None:
            d0 = max_items_from_estimate(st.scale_estimate(), total, self.width[0],
                                         self.width[1:])
        else:
            d0 = (params.gw_default_max_items(epsilon) + self.extra) * r ** self.db
            d0 = min(params.MAX_MAX_ITEMS, max(1, int(round(d0))))
        if self.margin_fraction is not None:
            margin = front_margin_for(d0, self.margin_fraction)
        else:
            margin = max(0, int(round(self.margin * r ** self.mb)))
        if self.stat == "pairs":
            ratio = st.pub_pairs / st.pairs
        else:
            cutoff = cal.policy_cutoff(cal.gw_cascade_free_threshold(epsilon, delta, d0),
                                       1.0 / epsilon, alpha)
            ratio = st.rank_scale(cutoff, self.stat[5:])
        kappa = self.kappa0 * ratio ** self.a * r ** self.b
        kappa = min(max(kappa, FRONT_SCALE_RANGE[0]), FRONT_SCALE_RANGE[1])
        return Candidate(d0, tie_break=self.tie_break, selection="front", scale=kappa,
                         margin=margin)

    def label(self) -> str:
        s = f"rule κ0={self.kappa0:g} a={self.a:g} b={self.b:g}"
        if self.margin_fraction is not None:
            s += f" M={self.margin_fraction:g}·Δ0"
        else:
            s += f" M0={self.margin:g}" + (f" mb={self.mb:g}" if self.mb else "")
        if self.width is not None:
            s += " Δ0=med/{:g} in [{:g}, {:g}]·gw".format(*self.width)
        else:
            s += f" +{self.extra}" + (f" db={self.db:g}" if self.db else "")
        s += f" m_ref={self.m_ref:g} {self.stat} {self.tie_break}"
        return s + (f" est {self.share:g}×{self.draws}" if self.share else " exact")


class Fold:
    """One left-out unit: a private dataset (and public counts for gw-kt)."""

    def __init__(self, name: str, per_user, public, seeds: Sequence[int], eps: float,
                 delta: float, alpha: float):
        self.name, self.per_user, self.public = name, per_user, public
        self.seeds, self.eps, self.delta, self.alpha = list(seeds), eps, delta, alpha
        self._walks: Dict[Tuple[int, str], Walks] = {}
        self._published: Dict[str, List[float]] = {}
        self._one: Dict[tuple, float] = {}
        self._rules: Dict[ScaleRule, List[float]] = {}
        self._stats = None

    def stats(self) -> FoldStats:
        if self._stats is None:
            pub = self.public or {}
            self._stats = FoldStats(
                float(len(self.per_user)),
                float(sum(min(len(c), PAIR_CLIP) for c in self.per_user.values())),
                float(sum(pub.values())), float(len(pub)), float(max(pub.values(), default=0)),
                np.sort(np.array(list(pub.values()) or [1], dtype=float))[::-1],
                scale_statistics(self.per_user.values()))
        return self._stats

    def walks(self, seed, tie_break) -> Walks:
        key = (seed, tie_break)
        if key not in self._walks:
            self._walks[key] = prepare_walks(self.per_user, seed, tie_break, self.public)
        return self._walks[key]

    def published(self, tie_break: str) -> List[float]:
        """Expected released of the published greedy, per seed."""
        if tie_break not in self._published:
            t = cal.gw_threshold(self.eps, self.delta)
            cutoff = cal.policy_cutoff(t, 1.0 / self.eps, self.alpha)
            self._published[tie_break] = [
                expected_released(run_kernel("greedy", cutoff, self.walks(s, tie_break).walks)[1],
                                  t, self.eps) for s in self.seeds]
        return self._published[tie_break]

    def released_one(self, c: Candidate, seed: int, eps: float) -> float:
        """Expected released of candidate c run at ε = eps, one test seed."""
        key = (c, seed, eps)
        if key not in self._one:
            t = cal.gw_cascade_free_threshold(eps, self.delta, c.max_items)
            cutoff = cal.policy_cutoff(t, 1.0 / eps, self.alpha)
            ids, lengths = kept_flat(self.walks(seed, c.tie_break), c, cutoff)
            self._one[key] = expected_released(
                run_kernel_flat("cascade-free-greedy", cutoff, ids, lengths, c.eta)[1], t, eps)
        return self._one[key]

    def rule_released(self, r: ScaleRule) -> List[float]:
        """A scale rule's expected released per seed: with the exact statistics
        (``r.share`` 0), or the mean over ``r.draws`` DP estimates with the mechanism at
        the rest of ε (``split_epsilon``, as ``GWKT`` splits it)."""
        if r not in self._rules:
            st, out = self.stats(), []
            for s in self.seeds:
                if not r.share:
                    out.append(self.released_one(
                        r.candidate(st, self.eps, self.delta, self.alpha), s, self.eps))
                    continue
                e = cal.split_epsilon(self.eps, r.share)[1]
                out.append(statistics.mean(
                    self.released_one(r.candidate(noisy_stats(st, r.share, self.eps,
                                                              self.name, s, d), e, self.delta,
                                                  self.alpha, self.eps), s, e)
                    for d in range(r.draws)))
            self._rules[r] = out
        return self._rules[r]

    def released(self, c) -> List[float]:
        if isinstance(c, ScaleRule):
            return self.rule_released(c)
        return [self.released_one(c, s, self.eps) for s in self.seeds]

    def ratios(self, c, same_tie_break: bool = False) -> List[float]:
        pub = self.published(c.tie_break if same_tie_break else AUTHORS_TIE_BREAK)
        return [a / b for a, b in zip(self.released(c), pub)]


def summary(xs: Sequence[float]) -> Tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


# -- candidates ------------------------------------------------------------------------

def max_items_rule(epsilon: float, c: float) -> int:
    """Δ0 = 1 + round(c·e^ε): the threshold's tail grows by the factor 1 + c (docs/gw.md §5)."""
    return max(1, 1 + int(round(c * math.exp(epsilon))))


def gw_candidates(eps: float, quick: bool, max_items: Sequence[int] = (),
                  etas: Sequence[float] = (params.DEFAULT_GW_ETA,)) -> List[Candidate]:
    cs = [0.5, 1.0, 1.5] if quick else [0.25, 0.5, 0.75, 1.0, 1.5, 2.0]
    d0s = sorted(set(max_items) if max_items else {max_items_rule(eps, c) for c in cs})
    out = []
    for d0, eta in itertools.product(d0s, etas):
        for tb in ("item-hash", "first-occurrence"):
            out.append(Candidate(d0, eta=eta, tie_break=tb))
    return out


def kt_candidates(eps: float, quick: bool, keeps: Sequence[float] = (0.0,),
                  heads: Sequence[int] = (0,),
                  tie_breaks: Sequence[str] = ("item-hash", "first-occurrence"),
                  max_items: Sequence[int] = (), scales: Sequence[float] = (),
                  margins: Sequence[int] = ()) -> List[Candidate]:
    d0s = list(max_items) or ([params.gwkt_default_max_items(eps)] if quick
                              else [15, 20, 30])
    kappas = list(scales) or ([8, 12, 20] if quick else [6, 8, 10, 12, 16, 20, 28])
    margins = list(margins) or ([0, 4] if quick else [0, 2, 4, 8])
    out = []
    for d0, k, m, keep, head in itertools.product(d0s, kappas, margins, keeps, heads):
        for tb in tie_breaks:
            out.append(Candidate(d0, tie_break=tb, selection="front", scale=k, margin=m,
                                 keep=keep, head=head))
    return out


def default_gw(eps: float) -> Candidate:
    """The command line's gw defaults at this ε."""
    return Candidate(params.gw_default_max_items(eps), params.DEFAULT_GW_ETA,
                     params.DEFAULT_TIE_BREAK)


def fixed_kt(eps: float) -> Candidate:
    """gw-kt with its fixed front (``--calibration-share 0``: κ = 10, M = 8, Δ0 = gw's
    rule + 4) at this ε."""
    return Candidate(params.gwkt_default_max_items(eps, params.DEFAULT_GWKT_SELECTION),
                     params.DEFAULT_GW_ETA, params.DEFAULT_TIE_BREAK,
                     params.DEFAULT_GWKT_SELECTION, params.DEFAULT_FRONT_SCALE,
                     params.DEFAULT_FRONT_MARGIN)


def default_kt(draws: int = 4) -> ScaleRule:
    """The command line's gw-kt: calibrated by the DP estimate at the default share,
    with the library's rules and constants (``draws`` estimates per seed)."""
    return ScaleRule(params.FRONT_SCALE_FACTOR, stat="rank-mean",
                     width=(params.CALIBRATED_WIDTH_DIVISOR, *params.CALIBRATED_WIDTH_RANGE),
                     margin_fraction=params.CALIBRATED_MARGIN_FRACTION,
                     share=params.DEFAULT_GWKT_CALIBRATION_SHARE, draws=draws)


# -- protocol --------------------------------------------------------------------------

def leave_one_out(folds: List[Fold], candidates: List[Candidate], log) -> List[dict]:
    """For each fold: the candidate best on the others (max of min ratio), measured on it."""
    for f in folds:
        for c in candidates:
            f.ratios(c)
        log(f"  scored {len(candidates)} candidates on {f.name}")
    rows = []
    for left in folds:
        train = [f for f in folds if f is not left]

        def score(c):
            means = [statistics.mean(f.ratios(c)) for f in train]
            return (min(means), statistics.mean(means))

        best = max(candidates, key=score)
        m, sd = summary(left.ratios(best))
        ms, _ = summary(left.ratios(best, same_tie_break=True))
        rows.append({"fold": left.name, "chosen": best.label(), "train_min": score(best)[0],
                     "ratio": m, "sd": sd, "min_run": min(left.ratios(best)),
                     "ratio_same_tb": ms})
    return rows


def fixed_rows(folds: List[Fold], c: Candidate) -> List[dict]:
    rows = []
    for f in folds:
        m, sd = summary(f.ratios(c))
        ms, _ = summary(f.ratios(c, same_tie_break=True))
        rel, _ = summary(f.released(c))
        pub, _ = summary(f.published(AUTHORS_TIE_BREAK))
        rows.append({"fold": f.name, "chosen": c.label(), "released": rel, "published": pub,
                     "ratio": m, "sd": sd, "min_run": min(f.ratios(c)), "ratio_same_tb": ms})
    return rows


def print_rows(title: str, rows: List[dict]) -> None:
    print(f"\n{title}\n")
    print("| left-out fold | rule | ratio (mean ± sd) | lowest run | ratio, same tb |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['fold']} | {r['chosen']} | {r['ratio']:.3f} ± {r['sd']:.3f} | "
              f"{r['min_run']:.3f} | {r['ratio_same_tb']:.3f} |")
    ratios = [r["ratio"] for r in rows]
    print(f"\nworst {min(ratios):.3f}, mean {statistics.mean(ratios):.3f}; "
          f"target 0.9 on every fold: {'met' if min(ratios) >= 0.9 else 'NOT met'}")


def check_against_library(data: Data, eps, delta, alpha, log) -> None:
    """The fast path equals the library's Beam-free histogram (gw and gw-kt front)."""
    per_user = data.get("half-a:reddit-titles")
    public = users_per_item(data.get("half-b:reddit-titles"))
    for mech, cand, pub in [
            (GW(eps, delta, alpha, tie_break="first-occurrence", max_items=11),
             Candidate(11, tie_break="first-occurrence"), None),
            (GWKT(eps, delta, public, alpha, max_items=15, front_scale=9, front_margin=2),
             Candidate(15, selection="front", scale=9, margin=2), public)]:
        fold = Fold("check", per_user, pub, [7], eps, delta, alpha)
        ref = mech.histogram_local(per_user, RunKey.from_test_seed(7))
        t = mech.calibration.threshold
        want = expected_released(np.array(list(ref.values())), t, eps)
        got = fold.released(cand)[0]
        if abs(want - got) > 1e-9 * max(1.0, want):
            raise SystemExit(f"fast path differs from the library: {got} != {want}")
        log(f"  check {mech.name}: fast path = library ({got:.6f})")
    w = fold.walks(7, "item-hash")
    for cand in (Candidate(15, selection="front", scale=9, margin=2),
                 Candidate(20, selection="front", scale=0.7, margin=0),
                 Candidate(5, selection="front", scale=40, margin=8), Candidate(11)):
        ref = kept_items(w, cand, 5.3)
        ids, lengths = kept_flat(w, cand, 5.3)
        if list(lengths) != [len(k) for k in ref] or not np.array_equal(
                ids, np.concatenate(ref)):
            raise SystemExit(f"kept_flat differs from kept_items for {cand.label()}")
    log("  check: kept_flat = kept_items")
    # the command line's calibrated gw-kt: the rule here reads the same estimate as the
    # library and gives the same Δ0, M and κ, and the same expected count
    mech = GWKT(eps, delta, public, alpha, tie_break="first-occurrence",
                calibration_share=params.DEFAULT_GWKT_CALIBRATION_SHARE)
    c = mech.calibrated_on(per_user, RunKey.from_test_seed(7))
    fold = Fold("check", per_user, public, [7], eps, delta, alpha)
    st = dataclasses.replace(fold.stats(), users=c.scale_estimate.users, pairs=math.nan,
                             scale=c.scale_estimate)
    release_eps = cal.split_epsilon(eps, params.DEFAULT_GWKT_CALIBRATION_SHARE)[1]
    cand = default_kt().candidate(st, release_eps, delta, alpha, eps)
    if (cand.max_items, cand.margin) != (c.max_items, c.front_margin) or not math.isclose(
            cand.scale, c.front_scale, rel_tol=1e-12):
        raise SystemExit(f"the calibrated rule differs from the library: {cand.label()} "
                         f"!= Δ0 {c.max_items}, M {c.front_margin}, κ {c.front_scale}")
    ref = c.histogram_local(per_user, RunKey.from_test_seed(7))
    want = expected_released(np.array(list(ref.values())), c.calibration.threshold,
                             release_eps)
    got = fold.released_one(cand, 7, release_eps)
    if abs(want - got) > 1e-9 * max(1.0, want):
        raise SystemExit(f"calibrated fast path differs from the library: {got} != {want}")
    log(f"  check calibrated gw-kt: rule = library (Δ0 {c.max_items}, M {c.front_margin}, "
        f"κ {c.front_scale:.4g}; {got:.6f})")


def _width(text: str):
    return None if text == "none" else tuple(float(x) for x in text.split(":"))


def _fraction(text: str):
    return None if text == "none" else float(text)


def rule_grid(args) -> List[ScaleRule]:
    """``--kt-rules``: the product of the ``--rule-*`` lists."""
    return [ScaleRule(k0, a, b, mref, m0, mb, ex, db, tb, st, _width(w), _fraction(mf),
                      args.est_share, args.est_draws)
            for st, k0, a, b, mref, m0, mb, ex, db, tb, w, mf
            in itertools.product(args.rule_stat, args.rule_kappa0, args.rule_a, args.rule_b,
                                 args.rule_m_ref, args.rule_margin, args.rule_mb,
                                 args.rule_extra, args.rule_db, args.kt_tie_breaks,
                                 args.rule_width, args.rule_margin_fraction)]


def print_stats(folds: List[Fold], eps: float) -> None:
    print("\ngw-kt folds: private N, P = Σ min(n_i, %d), m = P/N; public P_pub = Σ counts, "
          "items, largest count\n" % PAIR_CLIP)
    print("| fold | N | P | m | P_pub | P_pub/P | public items | largest |")
    print("|---|---|---|---|---|---|---|---|")
    for f in folds:
        st = f.stats()
        print(f"| {f.name} | {st.users:.0f} | {st.pairs:.0f} | {st.m:.1f} | "
              f"{st.pub_pairs:.0f} | {st.pub_pairs / st.pairs:.3f} | {st.pub_items:.0f} | "
              f"{st.pub_max:.0f} |")


def _sweep(kind, loo_title, folds, defaults, cands, out, log):
    """The command line's defaults on every fold, then (``cands`` not None) every
    candidate and the leave-one-out choice; tables printed, rows kept in ``out``."""
    rows = fixed_rows(folds, defaults)
    print_rows(f"{kind}, the command line's defaults", rows)
    out[f"{kind} defaults"] = rows
    if cands is not None:
        for c in cands:
            rows = fixed_rows(folds, c)
            out.setdefault(f"{kind} grid", []).extend(rows)
            log(f"{kind} {c.label()}: " + ", ".join(f"{r['ratio']:.3f}" for r in rows))
        rows = leave_one_out(folds, cands, log)
        print_rows(f"{kind}, {loo_title} (rule chosen on the other {len(folds) - 1})", rows)
        out[f"{kind} loo"] = rows
    log(f"{kind} done")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--runs", type=int, default=5, help="seeds per cell (default 5)")
    p.add_argument("--quick", action="store_true", help="3 seeds, small grids")
    p.add_argument("--epsilon", type=float, default=3.0)
    p.add_argument("--delta", type=float, default=math.exp(-10))
    p.add_argument("--alpha", type=float, default=params.DEFAULT_ALPHA)
    p.add_argument("--defaults-only", action="store_true",
                   help="only the library's current defaults on every fold")
    p.add_argument("--gw-max-items", type=int, nargs="*", default=(),
                   help="gw: these Δ0 instead of the grid 1 + round(c·e^ε)")
    p.add_argument("--gw-eta", type=float, nargs="*", default=(params.DEFAULT_GW_ETA,),
                   help="gw: these η (default: the library's)")
    p.add_argument("--kt-keep", type=float, nargs="*", default=(0.0,),
                   help="gw-kt experiment: fractions of the predicted-full items also kept")
    p.add_argument("--kt-head", type=int, nargs="*", default=(0,),
                   help="gw-kt experiment: K_i also holds the first HEAD walk items")
    p.add_argument("--kt-tie-breaks", nargs="*", default=("item-hash", "first-occurrence"))
    p.add_argument("--kt-max-items", type=int, nargs="*", default=())
    p.add_argument("--kt-scales", type=float, nargs="*", default=())
    p.add_argument("--kt-margins", type=int, nargs="*", default=())
    p.add_argument("--kt-folds", choices=sorted(KT_FOLD_SETS), default="basic",
                   help="gw-kt folds: 'basic' (the five pairings, default), 'mismatched' "
                   "(per dataset: low->high, high->low, 10%%), 'all'")
    p.add_argument("--kt-rules", action="store_true",
                   help="gw-kt: score scale rules (the product of the --rule-* lists: "
                   "κ = κ0·R^a·(m/m_ref)^b (R: --rule-stat), M = round(M0·(m/m_ref)^mb), "
                   "Δ0 = round((gw's Δ0 + extra)·(m/m_ref)^db)) instead of fixed cells")
    p.add_argument("--rule-stat", nargs="*", default=("pairs",),
                   help="R of the rule: 'pairs' (P_pub/P), 'rank-mean', 'rank-geo', "
                   "'rank-at<q>' (S/N, S a statistic of k·c_(k) over ranks k ≤ N/Γ)")
    p.add_argument("--rule-kappa0", type=float, nargs="*", default=(10.0,))
    p.add_argument("--rule-a", type=float, nargs="*", default=(1.0,))
    p.add_argument("--rule-b", type=float, nargs="*", default=(0.0,))
    p.add_argument("--rule-m-ref", type=float, nargs="*", default=(30.0,))
    p.add_argument("--rule-margin", type=float, nargs="*",
                   default=(float(params.DEFAULT_FRONT_MARGIN),))
    p.add_argument("--rule-mb", type=float, nargs="*", default=(0.0,))
    p.add_argument("--rule-extra", type=int, nargs="*", default=(4,))
    p.add_argument("--rule-db", type=float, nargs="*", default=(0.0,))
    p.add_argument("--rule-width", nargs="*", default=("none",),
                   help="Δ0 of the rule: 'D:LOW:HIGH' (the library's max_items_from_estimate: "
                   "the estimated median activity / D within [LOW, HIGH]·gw's Δ0) or 'none' "
                   "(gw's Δ0 + --rule-extra)")
    p.add_argument("--rule-margin-fraction", nargs="*", default=("none",),
                   help="M of the rule: a fraction F of Δ0 (front_margin_for) or 'none' "
                   "(--rule-margin)")
    p.add_argument("--est-share", type=float, default=0.0,
                   help="rules: read N and the activity from the library's DP estimate at "
                   "this share of ε (the mechanism gets the rest); 0 (default): the exact "
                   "values (oracle)")
    p.add_argument("--est-draws", type=int, default=4, help="estimates per test seed")
    p.add_argument("--stats", action="store_true", help="print the gw-kt folds' statistics")
    p.add_argument("--fixed-baseline", action="store_true",
                   help="gw-kt: also the fixed front (κ = 10, M = 8) on every fold")
    p.add_argument("--only", choices=["gw", "gw-kt"], help="one mechanism only")
    p.add_argument("--check", action="store_true",
                   help="first verify the fast path against the library's histogram")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    missing = missing_files(args.data)
    if missing:
        print(f"gw_generalise: the shared datasets are missing from {args.data}: "
              f"{', '.join(missing)} (see --data); nothing measured", file=sys.stderr)
        return 2
    if not kernels.available():
        print("gw_generalise: needs numba (pip install 'beam-dpsu[fast]')", file=sys.stderr)
        return 2
    runs = 3 if args.quick else args.runs
    seeds = list(range(1, runs + 1))
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:6.0f} s] {msg}", file=sys.stderr, flush=True)

    data = Data(args.data)
    eps, delta, alpha = args.epsilon, args.delta, args.alpha
    print(f"ε = {eps:g}, δ = {delta:.3g}, α = {alpha:g}; {runs} seeds per cell; ratio = "
          f"expected released / the published greedy's (tie-break {AUTHORS_TIE_BREAK}); "
          f"'same tb': against the published greedy with the rule's own tie-break")
    if args.check:
        check_against_library(data, eps, delta, alpha, log)
    out = {}
    if args.only in (None, "gw"):
        folds = [Fold(n, data.get(n), None, seeds, eps, delta, alpha) for n in DATASETS]
        cands = (None if args.defaults_only else
                 gw_candidates(eps, args.quick, args.gw_max_items, args.gw_eta))
        _sweep("gw", "leave one dataset out", folds, default_gw(eps), cands, out, log)
        del folds
    if args.only in (None, "gw-kt"):
        folds = [Fold(name, data.get(priv), users_per_item(data.get(pub)), seeds, eps, delta,
                      alpha) for name, priv, pub in KT_FOLD_SETS[args.kt_folds]]
        if args.stats or args.kt_rules:
            print_stats(folds, eps)
        if args.kt_rules and not args.defaults_only:
            cands = rule_grid(args)
            if args.est_share:
                print(f"\nrules read the DP estimate at {args.est_share:g} of ε "
                      f"({args.est_draws} per seed); the mechanism gets the rest")
        else:
            cands = (None if args.defaults_only else
                     kt_candidates(eps, args.quick, args.kt_keep, args.kt_head,
                                   args.kt_tie_breaks, args.kt_max_items, args.kt_scales,
                                   args.kt_margins))
        if args.fixed_baseline:
            rows = fixed_rows(folds, fixed_kt(eps))
            print_rows("gw-kt with its fixed front (--calibration-share 0)", rows)
            out["gw-kt fixed"] = rows
        _sweep("gw-kt", "leave one pairing out", folds, default_kt(args.est_draws), cands,
               out, log)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
