"""Top-k over an unknown domain (Durfee and Rogers), ``docs/mechanisms.md`` section 6.

Counts ``h[u]`` are the number of distinct users holding item ``u`` (each user
counted once per item, optionally after bounding each user to Δ distinct items
with ``dp.contribution.sample_items``). The true top ``k̄ + 1`` are sorted
``h_(1) ≥ … ≥ h_(k̄+1)``; only they are ever noised, so the domain need not be
known.

* Algorithm 2 (``TopKMechanism(with_counts=False)``, Gumbel): the threshold
  ``v_⊥ = h_(k̄+1) + 1 + log(m/δ)/ε + G_⊥`` with ``m = k̄`` (unrestricted
  sensitivity) or ``m = min(Δ, k̄)`` (Δ-restricted), the candidates
  ``v_j = h_(j) + G_j`` for j = 1..k̄, ``G ~ Gumbel(scale 1/ε)``. The items with
  ``v_j > v_⊥`` are released in decreasing ``v``, at most ``k``; no counts. ε is
  PER SELECTION: a query releasing ℓ items is charged ``ℓ + 1`` ε-bounded-range
  selections (``k`` when ℓ = k) and δ; compose with
  ``accounting.PayWhatYouGetAccountant``.
* Algorithm 1 (``with_counts=True``, Laplace, needs Δ): the threshold
  ``h_(k̄+1) + c + L_⊥``, the counts ``h_(j) + L_j``, ``L ~ Lap(b)`` with
  ``b = (Δ + 1)/ε`` and ``c = 1 + s`` (``laplace_tail_offset``); the items with
  noisy count above the noisy threshold are released with their noisy counts,
  at most ``k``, in decreasing order. (ε, δ)-DP per query. The noise is drawn
  on a discrete grid (``noise.KeyedGridLaplace``, ``docs/mechanisms.md`` section 7), so
  every released count is an exact multiple of ``noise.grid_granularity(b)``.

Conventions:

* Fewer than ``k̄ + 1`` items: ``h_(k̄+1) = 0`` (the missing items are items no
  user holds, count 0); the candidates are then all existing items.
* Ties in the true ranking are broken by a keyed hash of the item,
  ``keyed_hash64(run_key.subkey('<purpose>/ties'), encode_value(item))``, larger
  first (then by ``encode_value``, for the negligible case of equal hashes).
  The order depends only on the key and the item, never on other users, so it
  is the fixed, data-independent tie-breaking the analysis assumes; it changes
  from run to run and does not reveal anything about the item strings.
* Randomness: every draw is a PRF of the run key and the item (a retry draws
  the same values). Two queries under ONE key with the same ``purpose`` reuse
  the same noise and are not independent: give each query a fresh
  ``RunKey`` (the default) or a distinct ``purpose``.

``top_k_local`` (``TopKMechanism.run_local``) runs the same functions without
Beam; ``TopK`` (``TopKMechanism.expand_per_user``) is the Beam transform.
Given the same run key and purpose they return the same output. The
calibration formulas are in ``beam_dpsu.dp.calibration`` with the others.
"""
from __future__ import annotations

import heapq
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple


from beam_dpsu.dp import calibration as cal
from beam_dpsu.dp.accounting import PrivacyGuarantee, br_composition_guarantee, selections_charged
from beam_dpsu.dp.contribution import ItemCounts
from beam_dpsu.dp.contribution import sample_items
from beam_dpsu.dp.mechanisms import units
from beam_dpsu.dp.mechanisms.base import Mechanism, RoundCalibration
from beam_dpsu.dp.noise import KeyedGridLaplace, KeyedNoise, RunKey, encode_value, keyed_hash64

__all__ = ["BOTTOM", "DEFAULT_PURPOSE", "RankKey", "rank_key", "true_top", "item_user_counts",
           "TopKMechanism", "top_k_local", "format_line"]


# The message under which the threshold's noise is drawn. Encoded items start
# with b"s", b"b" or b"r" (noise.encode_value), so it never collides with an item.
BOTTOM = b"\x00topk/bottom"
DEFAULT_PURPOSE = "topk/0"


# --------------------------------------------------------------------------
# The true ranking.
# --------------------------------------------------------------------------

class RankKey:
    """Sort key of an ``(item, count)`` pair: larger means ranked higher.

    ``(count, keyed_hash64(tie_key, encode_value(item)), encode_value(item))``:
    decreasing count, ties by the keyed item hash (larger first). Picklable
    (it carries only the tie key), so Beam's ``Top`` combiners use it on every
    worker.
    """

    def __init__(self, tie_key: bytes):
        self._tie_key = tie_key

    def __call__(self, item_count: Tuple[Any, float]):
        item, count = item_count
        b = encode_value(item)
        return (count, keyed_hash64(self._tie_key, b), b)


def rank_key(run_key: RunKey, purpose: str = DEFAULT_PURPOSE) -> RankKey:
    """The ``RankKey`` of a query: ties by ``run_key.subkey(purpose + '/ties')``."""
    return RankKey(run_key.subkey(purpose + "/ties"))


def true_top(item_counts: Iterable[Tuple[Any, float]], n: int, run_key: RunKey,
             purpose: str = DEFAULT_PURPOSE) -> List[Tuple[Any, float]]:
    """The top ``n`` ``(item, count)`` pairs, rank 1 first (ties as ``RankKey``)."""
    return heapq.nlargest(n, item_counts, key=rank_key(run_key, purpose))


def item_user_counts(per_user: Mapping[Any, ItemCounts], max_items: Optional[int] = None,
                     run_key: Optional[RunKey] = None,
                     purpose: str = DEFAULT_PURPOSE) -> Dict[Any, int]:
    """``{item: number of distinct users}`` from ``{user: {item: count}}``.

    With ``max_items`` = Δ, each user first keeps at most Δ distinct items, the
    subset ``TopK`` keeps (``sample_items`` under ``run_key.subkey(purpose +
    '/sample')``); ``run_key`` is then required.
    """
    key = None
    if max_items is not None:
        max_items = cal.check_max_items(max_items)
        if run_key is None:
            raise ValueError("item_user_counts with max_items needs the run_key")
        key = run_key.subkey(purpose + "/sample")
    hist: Dict[Any, int] = {}
    get = hist.get
    for user, counts in per_user.items():
        if not counts:
            continue
        if key is not None:
            counts = sample_items(user, counts, max_items, key)
        for item in counts:
            hist[item] = get(item, 0) + 1
    return hist


# --------------------------------------------------------------------------
# The mechanism.
# --------------------------------------------------------------------------

class TopKMechanism(Mechanism):
    """A calibrated top-k query: Algorithm 2 (Gumbel) or Algorithm 1 (Laplace).

    A ``Mechanism`` whose release is a ranked list: ``expand_per_user`` and
    ``run_local`` return ``(rank, item[, noisy_count])`` rows (``TopK`` and
    ``top_k_local`` under the default purpose), and it has no per-item
    ``release_rule`` (its candidates are compared with each other).

    Args:
      k: the most items to release (integer ≥ 1).
      k_bar: k̄ ≥ k, the number of candidates (the true top k̄ are noised and
        ``h_(k̄+1)`` sets the threshold); default ``k``. A larger k̄ lets items
        just outside the true top k compete, at the price of a higher threshold
        (log(k̄/δ)/ε for unrestricted sensitivity).
      epsilon: ε > 0. Algorithm 2: per SELECTION (a query is charged ℓ + 1
        selections, or k); Algorithm 1: of the whole query.
      delta: 0 < δ < 1 per query: the probability bound of releasing an item
        outside the neighbour's top k̄.
      max_items: Δ, distinct items kept per user (integer ≥ 1), or None for
        unrestricted sensitivity (Algorithm 2 only). With Δ, Algorithm 2's
        threshold uses log(min(Δ, k̄)/δ); Algorithm 1 needs Δ (b = (Δ+1)/ε).
      with_counts: False (default) for Algorithm 2 (items only), True for
        Algorithm 1 (items and noisy counts on a discrete grid).
    """

    def __init__(self, k: int, epsilon: float, delta: float, k_bar: Optional[int] = None,
                 max_items: Optional[int] = None, with_counts: bool = False):
        self.k = cal.check_positive_int(k, "k")
        self.k_bar = self.k if k_bar is None else cal.check_positive_int(k_bar, "k_bar")
        if self.k_bar < self.k:
            raise ValueError(f"k_bar must be >= k={self.k}, got {k_bar!r}")
        self.epsilon = cal.check_epsilon(epsilon)
        self.delta = cal.check_delta(delta)
        max_items = None if max_items is None else cal.check_max_items(max_items)
        self.with_counts = bool(with_counts)
        if self.with_counts:
            if max_items is None:
                raise ValueError("with_counts (Algorithm 1) needs max_items_per_user (Δ)")
            self.noise = "laplace"
            self.noise_scale = cal.topk_laplace_scale(self.epsilon, max_items)
            self.threshold_offset = cal.laplace_threshold_offset(self.epsilon, self.delta,
                                                                 max_items)
            self.name = "top-k-laplace"
        else:
            self.noise = "gumbel"
            self.noise_scale = 1.0 / self.epsilon
            self.threshold_offset = cal.gumbel_threshold_offset(self.epsilon, self.delta,
                                                                self.k_bar, max_items)
            self.name = "top-k-gumbel"
        self.rounds = [RoundCalibration(None, self.noise, self.noise_scale, max_items, "count")]

    # -- accounting --------------------------------------------------------

    def charge(self, num_released: int) -> Dict[str, Any]:
        """What a query that released ``num_released`` items costs.

        Algorithm 2: ``selections`` (ℓ + 1, or k) ε-BR selections, one query and
        δ (the pay-what-you-get charge). Algorithm 1: one (ε, δ)-DP query.
        """
        if self.with_counts:
            return {"selections": None, "queries": 1, "epsilon": self.epsilon,
                    "delta": self.delta}
        return {"selections": selections_charged(self.k, num_released), "queries": 1,
                "epsilon_per_selection": self.epsilon, "delta": self.delta}

    @property
    def guarantee(self) -> PrivacyGuarantee:
        """The (ε, δ)-DP of one query on its own (before it runs).

        Algorithm 2: at most k selections, so the budget (k selections, one
        query) composed by ``br_composition_guarantee`` with δ₁ = δ. Algorithm 1:
        (ε, δ).
        """
        if self.with_counts:
            return PrivacyGuarantee(self.epsilon, self.delta, note="(ε, δ)-DP per query")
        return br_composition_guarantee(self.epsilon, self.delta, self.k, 1, self.delta)

    def describe(self) -> Dict[str, Any]:
        """JSON-ready statement of the calibration and the stand-alone guarantee."""
        g = self.guarantee
        return {
            "mechanism": self.name,
            "algorithm": 1 if self.with_counts else 2,
            "k": self.k, "k_bar": self.k_bar,
            "epsilon": self.epsilon, "delta": self.delta,
            "epsilon_meaning": ("per query" if self.with_counts else
                                "per selection (pay what you get)"),
            "max_items_per_user": self.max_items,
            "noise": self.noise, "noise_scale": self.noise_scale,
            "threshold_offset": self.threshold_offset,
            "query_guarantee": {"epsilon": g.epsilon, "delta": g.delta, "note": g.note},
            "units": units.topk_units(self.with_counts),
        }

    def __repr__(self) -> str:
        return (f"<TopKMechanism {self.name}: k={self.k}, k̄={self.k_bar}, ε={self.epsilon:g}, "
                f"δ={self.delta:g}, Δ={self.max_items}>")

    # -- the release -------------------------------------------------------

    def release(self, top: Sequence[Tuple[Any, float]], run_key: RunKey,
                purpose: str = DEFAULT_PURPOSE) -> List[tuple]:
        """Runs the algorithm on the true top list; returns the ranked release.

        Args:
          top: ``(item, count)`` pairs of the true top k̄ + 1 (or all items
            when fewer exist); any order, re-ranked here with the ``RankKey``.
            Longer lists are cut to the top k̄ + 1.
          run_key: the query's ``RunKey``.
          purpose: the key purpose (distinct per query under one key).
        Returns:
          ``[(rank, item), ...]`` (Algorithm 2) or ``[(rank, item, noisy_count),
          ...]`` (Algorithm 1), rank 1 first.
        """
        ranked = true_top(top, self.k_bar + 1, run_key, purpose)
        h_bottom = float(ranked[self.k_bar][1]) if len(ranked) > self.k_bar else 0.0
        candidates = ranked[:self.k_bar]
        if self.with_counts:
            noise = KeyedGridLaplace(run_key, self.noise_scale, purpose + "/laplace")
            v_bottom = noise(h_bottom + self.threshold_offset, BOTTOM)
            noisy = [(noise(float(h), encode_value(item)), j, item)
                     for j, (item, h) in enumerate(candidates)]
        else:
            noise = KeyedNoise(run_key, "gumbel", self.noise_scale, purpose + "/gumbel")
            v_bottom = h_bottom + self.threshold_offset + noise(BOTTOM)
            noisy = [(float(h) + noise(encode_value(item)), j, item)
                     for j, (item, h) in enumerate(candidates)]
        # Decreasing noisy value; equal values (probability ~2^-40) by true rank.
        noisy.sort(key=lambda t: (-t[0], t[1]))
        out = []
        for v, _, item in noisy:
            if len(out) == self.k or not v > v_bottom:
                break
            out.append((len(out) + 1, item, v) if self.with_counts else (len(out) + 1, item))
        return out

    # -- the contract: the Beam expansion and the Beam-free run --------------

    def run_local(self, per_user, run_key: RunKey) -> List[tuple]:
        """``top_k_local``: the ranked rows on in-memory data."""
        return top_k_local(per_user, self, RunKey.resolve(run_key))


def top_k_local(per_user: Mapping[Any, ItemCounts], mechanism: TopKMechanism, run_key: RunKey,
                purpose: str = DEFAULT_PURPOSE) -> List[tuple]:
    """The Beam-free ``TopK``: the same release from ``{user: {item: count}}``."""
    hist = item_user_counts(per_user, mechanism.max_items, run_key, purpose)
    return mechanism.release(true_top(hist.items(), mechanism.k_bar + 1, run_key, purpose),
                             run_key, purpose)


def format_line(row: tuple) -> str:
    """``(rank, item[, noisy_count])`` → ``rank<TAB>item[<TAB>noisy_count]``."""
    fields = [str(row[0]), row[1] if isinstance(row[1], str) else str(row[1])]
    if len(row) > 2:
        fields.append(repr(float(row[2])))
    return "\t".join(fields)


# --------------------------------------------------------------------------
# Beam.
# --------------------------------------------------------------------------


