"""Discovery, then peeling: top-k and k-hitting sets over an unknown domain.

Two stages on one dataset, composed (``docs/mechanisms.md`` section 10):

1. **Discovery.** Weighted Gaussian (``histogram_threshold.WeightedGaussian``)
   with the share (ε₁, δ₁) of the budget releases a domain D: each user keeps
   at most Δ0 distinct items, so this stage needs the per-user bound.
2. **Peeling on D.** A known-domain mechanism with the rest (ε₂, δ₂) runs on
   the exact numbers of users N(x) of the items x of D. Adding or removing one
   user changes every N(x) by at most 1, all in the same direction (ℓ∞
   sensitivity 1, monotone), whatever the number of the user's items, so this
   stage needs no Δ0. Each selection is the exponential mechanism with the
   Gumbel trick (argmax of N(x) + Gumbel(1/ε₀)), which is ε₀-DP for monotone
   scores and ε₀²/8-zCDP (bounded range); k selections compose to
   (ε₂, δ₂)-DP with ε₀ = ``peeling_epsilon0(ε₂, δ₂, k)``.

   * top-k (``DiscoverPeelTopK``): the k largest N(x) + Gumbel noise, drawn
     once (the one-shot Gumbel trick is the same distribution as k peeled
     selections);
   * k-hitting set (``DiscoverPeelHittingSet``): k rounds; round j draws fresh
     Gumbel noise, picks the item with the largest number of users not yet hit
     plus noise, and removes the users who hold it (user peeling). A user
     changes each round's scores by at most 1, all upwards, given the earlier
     (public) choices: the same ε₀ per round.

By basic composition the whole release is (ε₁ + ε₂, δ₁ + δ₂)-DP, which
``split_budget`` keeps at most the stated (ε, δ). The discovered domain may be
published too: it is the output of stage 1, covered by the same guarantee.
"""
from __future__ import annotations

import fractions
import heapq
import math
from typing import (Any, Dict, Hashable, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Tuple)

import numpy as np

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.privacy.accounting import PrivacyGuarantee
from beam_dpsu.dp.data.contribution import ItemCounts, canonical_items
from beam_dpsu.dp.mechanisms import units
from beam_dpsu.dp.mechanisms.base import Mechanism
from beam_dpsu.dp.mechanisms.histogram_threshold import WeightedGaussian
from beam_dpsu.dp.randomness.noise import RunKey, encode_value, keyed_gumbel_many
from beam_dpsu.dp.privacy.params import DEFAULT_DISCOVERY_SHARE, DEFAULT_MAX_ITEMS

__all__ = ["split_budget", "check_share", "peeling_epsilon0", "item_users", "peel_top_k",
           "hitting_scores", "peeling_rounds", "pair_rounds", "held_rounds", "user_peeling",
           "DiscoverThenPeel", "DiscoverPeelTopK", "DiscoverPeelHittingSet"]

#: Key purposes of the peeling stage (the discovery uses 'sample/0' and 'noise/0').
TOPK_PURPOSE = "peel/top-k"
HITTING_PURPOSE = "peel/hitting-set"


def split_budget(epsilon: float, delta: float, share: float
                 ) -> Tuple[Tuple[float, float], Tuple[float, float]]:
    """``(ε₁, δ₁), (ε₂, δ₂)``: ``share`` of (ε, δ) for discovery, the rest for peeling.

    Each part is positive and, as exact real numbers, ε₁ + ε₂ ≤ ε and
    δ₁ + δ₂ ≤ δ (floating-point rounding is corrected downwards), so the stated
    (ε, δ) is never below what the two stages spend.

    Args:
      epsilon, delta: the whole release's budget (ε > 0, 0 < δ < 1).
      share: the discovery's fraction in (0, 1) (default 1/2 in ``dp.privacy.params``).
    """
    epsilon, delta = cal.check_epsilon(epsilon), cal.check_delta(delta)
    share = check_share(share)

    def split(total: float) -> Tuple[float, float]:
        first = total * share
        second = total - first
        while fractions.Fraction(first) + fractions.Fraction(second) > fractions.Fraction(total):
            second = math.nextafter(second, 0.0)
        if not (first > 0 and second > 0):
            raise ValueError(f"the budget {total!r} is too small to split with share {share!r}")
        return first, second

    (e1, e2), (d1, d2) = split(epsilon), split(delta)
    return (e1, d1), (e2, d2)


def check_share(share: float) -> float:
    """The discovery's share of the budget as a float in (0, 1), or ValueError."""
    if isinstance(share, bool) or not isinstance(share, (int, float, np.floating)) \
            or not 0.0 < float(share) < 1.0:
        raise ValueError(f"discovery_share must be a number in (0, 1), got {share!r}")
    return float(share)


def peeling_epsilon0(epsilon: float, delta: float, k: int) -> float:
    """ε₀ of each of k exponential-mechanism selections so that together they are (ε, δ)-DP.

    The larger of two valid choices: basic composition of k ε₀-DP selections
    (ε₀ = ε/k), and the zCDP route: an ε₀-DP exponential mechanism is
    ε₀²/8-zCDP (bounded range, Cesar and Rogers), k of them k·ε₀²/8-zCDP, and
    ρ-zCDP is (ρ + 2√(ρ·log(1/δ)), δ)-DP; solving ρ + 2√(ρL) = ε with
    L = log(1/δ) gives √ρ = √(L + ε) − √L, so ε₀ = √(8ρ/k) =
    (√(8L + 8ε) − √(8L))/√k (Gillenwater et al. 2022, Lemma 4.2).
    """
    epsilon, delta = cal.check_epsilon(epsilon), cal.check_delta(delta)
    k = cal.check_positive_int(k, "k")
    log_term = math.log(1.0 / delta)
    # √(L + ε) − √L without cancellation: ε / (√(L + ε) + √L).
    root_rho = epsilon / (math.sqrt(log_term + epsilon) + math.sqrt(log_term))
    zcdp = math.sqrt(8.0 / k) * root_rho
    # Lowered by 1e-12 (relative): the floating-point error of these few operations is
    # far smaller, so the composition of k selections never exceeds (ε, δ).
    return max(epsilon / k, zcdp) * (1.0 - 1e-12)


def item_users(per_user: Mapping[Any, ItemCounts], domain: Iterable[Hashable]) -> Dict[Any, int]:
    """``{x: N(x)}`` for the items x of ``domain``: the number of users holding x (every
    user, no Δ0 bound; an item of the domain no user holds counts 0)."""
    counts = {x: 0 for x in domain}
    for items in per_user.values():
        for x in items:
            if x in counts:
                counts[x] += 1
    return counts


def _domain_order(items: Iterable[Hashable]) -> List[Hashable]:
    """The items in canonical order (a function of the set alone): the order in which
    a keyed generator's noise draws are assigned to them."""
    return canonical_items(list(items))


def _tie_order(items: Sequence[Hashable]) -> np.ndarray:
    """Position of each item's encoded bytes among the items' (ties of noisy scores,
    which have probability 0 for continuous noise, are broken by them)."""
    encoded = [encode_value(x) for x in items]
    order = sorted(range(len(items)), key=encoded.__getitem__)
    rank = np.empty(len(items), dtype=np.int64)
    rank[order] = np.arange(len(items))
    return rank


def peel_top_k(counts: Mapping[Hashable, int], k: int, scale: float, run_key: RunKey,
               purpose: str = TOPK_PURPOSE) -> List[Tuple[int, Hashable]]:
    """The peeling exponential mechanism by the one-shot Gumbel trick.

    Each item x of ``counts`` gets N(x) + G(x), G(x) ~ Gumbel(0, ``scale``)
    independent, drawn from a generator keyed by ``run_key.subkey(purpose)``
    in the canonical order of the items; the k largest are released in
    decreasing order as ``(rank, item)``, rank 1 first (fewer when the domain
    has fewer items). The same as k rounds that each pick the argmax of fresh
    noise and remove it (Durfee and Rogers).
    """
    k = cal.check_positive_int(k, "k")
    items = _domain_order(counts)
    if not items:
        return []
    noisy = np.fromiter((counts[x] for x in items), dtype=float, count=len(items))
    noisy = noisy + keyed_gumbel_many(run_key.subkey(purpose), b"gumbel", len(items), scale)
    ties = _tie_order(items)
    best = heapq.nlargest(min(k, len(items)), range(len(items)),
                          key=lambda i: (noisy[i], ties[i]))
    return [(rank, items[i]) for rank, i in enumerate(best, 1)]


def hitting_scores(user_sets: Iterable[Iterable[Hashable]], items: Sequence[Hashable],
                   chosen: Iterable[Hashable]) -> np.ndarray:
    """H(x) for each x of ``items``: the number of users who hold x and none of ``chosen``
    (the score of a user-peeling round after ``chosen``; the definition, computed
    directly, for tests and small inputs)."""
    chosen = set(chosen)
    index = {x: i for i, x in enumerate(items)}
    scores = np.zeros(len(items))
    for held in user_sets:
        held = set(held)
        if held & chosen:
            continue
        for x in held:
            if x in index:
                scores[index[x]] += 1
    return scores


def peeling_rounds(user_sets: Iterable[Iterable[Hashable]], domain: Iterable[Hashable], k: int,
                   scale: float, run_key: RunKey, purpose: str = HITTING_PURPOSE
                   ) -> Iterator[Tuple[np.ndarray, Hashable]]:
    """The rounds of the user peeling mechanism: ``(scores, chosen item)`` per round.

    Round j (0-based) scores each item x of the domain (in canonical order;
    items already chosen score -inf) by H_j(x), the number of users not hit yet
    who hold x (``hitting_scores`` after the earlier choices), adds fresh
    Gumbel(0, ``scale``) noise drawn from a generator keyed by
    ``run_key.subkey(purpose)`` and the round, and chooses the largest; the
    users who hold it are hit. min(k, |domain|) rounds always run, so the
    output's length is a function of the public domain and k alone (rounds
    after every user is hit choose by noise alone).
    """
    k = cal.check_positive_int(k, "k")
    items = _domain_order(set(domain))
    if not items:
        return
    index = {x: i for i, x in enumerate(items)}
    user_of, item_of = [], []
    users = 0
    for held in user_sets:
        ids = sorted({index[x] for x in held if x in index})
        if ids:
            user_of.extend([users] * len(ids))
            item_of.extend(ids)
            users += 1
    yield from pair_rounds(np.asarray(user_of, dtype=np.int64),
                           np.asarray(item_of, dtype=np.int64), items, k, scale, run_key,
                           purpose)


def pair_rounds(user_of: np.ndarray, item_of: np.ndarray, items: Sequence[Hashable], k: int,
                scale: float, run_key: RunKey, purpose: str = HITTING_PURPOSE
                ) -> Iterator[Tuple[np.ndarray, Hashable]]:
    """``peeling_rounds`` on arrays: the (user, item) pairs held, as ``user_of[j]``,
    ``item_of[j]`` (item indices into ``items``, which must be the domain in
    ``_domain_order``; each pair once; users numbered from 0, any order). The same
    rounds as ``peeling_rounds`` on the same users, whatever their numbering."""
    order = np.argsort(np.asarray(user_of), kind="stable")
    user_of = np.asarray(user_of)[order]
    users = int(user_of[-1]) + 1 if len(user_of) else 0
    yield from held_rounds(np.searchsorted(user_of, np.arange(users + 1)),
                           np.asarray(item_of)[order], items, k, scale, run_key, purpose)


def held_rounds(user_start: np.ndarray, held: np.ndarray, items: Sequence[Hashable], k: int,
                scale: float, run_key: RunKey, purpose: str = HITTING_PURPOSE
                ) -> Iterator[Tuple[np.ndarray, Hashable]]:
    """``peeling_rounds`` on the users' items as one array: user u holds the items
    ``held[user_start[u]:user_start[u + 1]]`` (indices into ``items``, the domain in
    ``_domain_order``; each of a user's items once).

    Memory: ``held`` and one offset per user, one score per item; each round finds
    the chosen item's holders by one pass over ``held`` (no index by item)."""
    k = cal.check_positive_int(k, "k")
    m = len(items)
    if not m:
        return
    user_start = np.asarray(user_start, dtype=np.int64)
    scores = np.bincount(held, minlength=m).astype(float)
    hit = np.zeros(max(len(user_start) - 1, 0), dtype=bool)
    user_lengths = np.diff(user_start)
    ties = _tie_order(items).astype(float)
    key = run_key.subkey(purpose)
    for j in range(min(k, m)):
        noise = keyed_gumbel_many(key, b"round %d" % j, m, scale)
        noisy = scores + noise
        best = np.flatnonzero(noisy == noisy.max())
        pick = int(best[np.argmax(ties[best])])
        yield scores.copy(), items[pick]
        scores[pick] = -np.inf
        # the holders, each once (a user holds an item once)
        holders = np.searchsorted(user_start, np.flatnonzero(held == pick), side="right") - 1
        new = holders[~hit[holders]]
        if len(new):
            hit[new] = True
            # every item of each newly hit user loses that user (an integer count, so
            # the subtraction is exact; chosen items stay at -inf)
            starts = user_start[new]
            lengths = user_start[new + 1] - starts
            total = int(lengths.sum())
            if 8 * total < len(held):  # few pairs: their positions
                offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])),
                                    lengths)
                lost = held[np.arange(total) + offsets]
            else:  # many: one flag per pair, not eight bytes per position
                newly = np.zeros(len(hit), dtype=bool)
                newly[new] = True
                lost = held[np.repeat(newly, user_lengths)]
            scores -= np.bincount(lost, minlength=m)


def user_peeling(user_sets: Iterable[Iterable[Hashable]], domain: Iterable[Hashable], k: int,
                 scale: float, run_key: RunKey, purpose: str = HITTING_PURPOSE
                 ) -> List[Tuple[int, Hashable]]:
    """The user peeling mechanism: a noisy greedy k-hitting set on ``domain``
    (``peeling_rounds``), as ``(rank, item)`` rows in the order chosen.

    Args:
      user_sets: each user's items (any iterable; items outside ``domain`` are
        ignored, repeats count once).
      domain: the discovered items.
      k: the most items to choose (integer ≥ 1).
      scale: the Gumbel scale 1/ε₀.
      run_key, purpose: the noise's key and purpose.
    Memory: one integer per (user, domain item) pair held, in two index arrays,
    plus one score per domain item.
    """
    return [(rank, item) for rank, (_, item) in
            enumerate(peeling_rounds(user_sets, domain, k, scale, run_key, purpose), 1)]


class DiscoverThenPeel(Mechanism):
    """Base of the discovery-then-peeling mechanisms (module docstring).

    Args:
      k: the most items to release (integer ≥ 1). No effect on the guarantee, which
        ``epsilon`` states for the whole release: a larger k leaves each step less.
      epsilon: ε > 0 of the whole release's (ε, δ)-DP guarantee.
      delta: 0 < δ < 1 of the whole release.
      max_items: Δ0 ≥ 1 of the discovery stage only (default 100): each user's
        items kept by Weighted Gaussian. No effect on the guarantee; the
        peeling stage counts every user's items and needs no bound.
      discovery_share: the fraction in (0, 1) of ε and of δ spent on discovery
        (default 1/2, the authors' choice); the rest goes to peeling. No effect
        on the total guarantee.
    """

    ranked = True

    name = ""
    _purpose = ""

    def __init__(self, k: int, epsilon: float, delta: float,
                 max_items: int = DEFAULT_MAX_ITEMS,
                 discovery_share: float = DEFAULT_DISCOVERY_SHARE):
        self.k = cal.check_positive_int(k, "k")
        self.epsilon, self.delta = cal.check_epsilon(epsilon), cal.check_delta(delta)
        self.discovery_share = check_share(discovery_share)
        (e1, d1), (e2, d2) = split_budget(self.epsilon, self.delta, self.discovery_share)
        self.discovery = WeightedGaussian(e1, d1, max_items)
        self.peel_epsilon, self.peel_delta = e2, d2
        self.epsilon0 = peeling_epsilon0(e2, d2, self.k)
        self.noise_scale = 1.0 / self.epsilon0
        self.rounds = list(self.discovery.rounds)
        self.guarantee = PrivacyGuarantee(self.epsilon, self.delta,
                                          note="(ε, δ)-DP: discovery and peeling composed")

    def describe(self) -> Dict[str, Any]:
        d = self.discovery.describe()
        return {
            "mechanism": self.name,
            "epsilon": self.epsilon, "delta": self.delta, "rho": None, "zcdp_delta": None,
            "guarantee": self.guarantee.note,
            "k": self.k,
            "max_items_per_user": self.discovery.max_items,
            "discovery_share": self.discovery_share,
            "discovery": {"mechanism": d["mechanism"], "epsilon": d["epsilon"],
                          "delta": d["delta"], "threshold": d["threshold"],
                          "noise": d["noise"], "noise_scale": d["noise_scale"]},
            "peeling": {"epsilon": self.peel_epsilon, "delta": self.peel_delta,
                        "epsilon_per_selection": self.epsilon0, "noise": "gumbel",
                        "noise_scale": self.noise_scale},
            "units": units.peeling_units(),
        }

    def discover_local(self, per_user: Mapping[Any, ItemCounts], run_key: RunKey) -> set:
        """Stage 1 on in-memory data: the discovered domain D."""
        return self.discovery.run_local(per_user, RunKey.resolve(run_key))

    def peel_local(self, per_user: Mapping[Any, ItemCounts], domain, run_key: RunKey):
        raise NotImplementedError

    def run_local(self, per_user: Mapping[Any, ItemCounts], run_key: RunKey):
        run_key = RunKey.resolve(run_key)
        return self.peel_local(per_user, self.discover_local(per_user, run_key), run_key)

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.name}: k={self.k}, ε={self.epsilon:g}, "
                f"δ={self.delta:g}, Δ0={self.discovery.max_items}>")


class DiscoverPeelTopK(DiscoverThenPeel):
    """Top-k over an unknown domain: Weighted Gaussian discovery, then the peeling
    exponential mechanism on the discovered items' user counts (Dick, Joseph and
    Raman, ICLR 2026). The release: ``(rank, item)`` rows, rank 1 first, at most k.
    """ + DiscoverThenPeel.__doc__.split("\n\n", 1)[1]

    name = "top-k-discover-peel"

    def peel(self, counts: Mapping[Hashable, int], run_key: RunKey) -> List[Tuple[int, Any]]:
        """Stage 2 on the discovered items' user counts ``{x: N(x)}``."""
        return peel_top_k(counts, self.k, self.noise_scale, run_key)

    def peel_local(self, per_user, domain, run_key):
        return self.peel(item_users(per_user, domain), run_key)


class DiscoverPeelHittingSet(DiscoverThenPeel):
    """k-hitting set over an unknown domain: Weighted Gaussian discovery, then the user
    peeling mechanism on the discovered items (Dick, Joseph and Raman, ICLR 2026).
    The release: ``(rank, item)`` rows in the order chosen, min(k, |D|) of them.
    """ + DiscoverThenPeel.__doc__.split("\n\n", 1)[1]

    name = "hitting-set"

    def peel(self, user_sets: Iterable[Iterable[Hashable]], domain, run_key: RunKey
             ) -> List[Tuple[int, Any]]:
        """Stage 2 on each user's items within the discovered domain."""
        return user_peeling(user_sets, domain, self.k, self.noise_scale, run_key)

    def peel_pairs(self, parts: Iterable[Tuple[Sequence[Hashable], np.ndarray, np.ndarray]],
                   domain, run_key: RunKey, total_pairs: Optional[int] = None
                   ) -> List[Tuple[int, Any]]:
        """Stage 2 on users given as pairs, in parts of distinct users (a user in one
        part only): each part ``(items, user_of, item_of)``, pair j being (the part's
        user number ``user_of[j]``, ``items[item_of[j]]``), each pair once, every item
        in ``domain`` (``dp.data.columnar.held_pairs`` of a user group's pairs within the
        domain). The same rows as ``peel`` on the same users' item sets.

        ``total_pairs``: the number of pairs of all parts, when known: the items are
        then copied into one array of that size as the parts come (``parts`` may be a
        generator reading one part at a time), not gathered and joined. Memory: one
        integer per pair and one offset per user (``held_rounds``)."""
        items = _domain_order(set(domain))
        index = {x: i for i, x in enumerate(items)}
        kind = np.int32 if len(items) < 2 ** 31 else np.int64
        held = None if total_pairs is None else np.empty(total_pairs, kind)
        pieces: List[np.ndarray] = []
        lengths: List[np.ndarray] = []
        filled = 0
        for part_items, part_users, part_item_of in parts:
            if not len(part_users):
                continue
            part_users = np.asarray(part_users)
            order = np.argsort(part_users, kind="stable")
            to_domain = np.fromiter((index[x] for x in part_items), dtype=kind,
                                    count=len(part_items))
            mapped = to_domain[np.asarray(part_item_of)[order]]
            counts = np.bincount(part_users)
            lengths.append(counts[counts > 0])
            if held is None:
                pieces.append(mapped)
                continue
            if filled + len(mapped) > total_pairs:
                raise ValueError(f"the parts hold more than total_pairs={total_pairs} pairs")
            held[filled:filled + len(mapped)] = mapped
            filled += len(mapped)
        if held is None:
            held = np.concatenate(pieces) if pieces else np.zeros(0, kind)
        elif filled != total_pairs:
            raise ValueError(f"the parts hold {filled} pairs, not total_pairs={total_pairs}")
        user_start = np.concatenate([[0]] + [np.cumsum(np.concatenate(lengths))]
                                    if lengths else [[0]]).astype(np.int64)
        return [(rank, item) for rank, (_, item) in enumerate(
            held_rounds(user_start, held, items, self.k, self.noise_scale, run_key), 1)]

    def peel_local(self, per_user, domain, run_key):
        return self.peel((items for items in per_user.values()), domain, run_key)
