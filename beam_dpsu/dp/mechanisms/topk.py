"""Top-k over an unknown domain (Durfee and Rogers), ``docs/mechanisms.md`` section 6.

Counts ``h[u]`` are the number of distinct users holding item ``u`` (each user
counted once per item, optionally after bounding each user to Δ distinct items
with ``dp.data.contribution.sample_items``). The true top ``k̄ + 1`` are sorted
``h_(1) ≥ … ≥ h_(k̄+1)``; only they are ever noised, so the domain need not be
known.

* Algorithm 2 (``TopKMechanism(with_counts=False)``, Gumbel): the threshold
  ``v_⊥ = h_(k̄+1) + 1 + log(m/δ)/ε + G_⊥`` with ``m = k̄`` (unrestricted
  sensitivity) or ``m = min(Δ, k̄)`` (Δ-restricted), the candidates
  ``v_j = h_(j) + G_j`` for j = 1..k̄, ``G ~ Gumbel(scale 1/ε)``. The items with
  ``v_j > v_⊥`` are released in decreasing ``v``, at most ``k``; no counts. The
  ε of the Gumbel noise is PER SELECTION: a query releasing ℓ items is charged
  ``ℓ + 1`` ε-bounded-range selections (``k`` when ℓ = k) and δ. Given the whole
  query's (ε, δ) (the default), the per-selection ε is calibrated from it: the
  largest whose composition over k selections
  (``accounting.pay_what_you_get_epsilon``, one query: δ/2 for the threshold,
  δ/2 for the conversion) is within (ε, δ). ``epsilon_per_selection=`` gives it
  directly instead; compose many queries with ``accounting.PayWhatYouGetAccountant``.
* Algorithm 1 (``with_counts=True``, Laplace, needs Δ): the threshold
  ``h_(k̄+1) + c + L_⊥``, the counts ``h_(j) + L_j``, ``L ~ Lap(b)`` with
  ``b = (Δ + 1)/ε`` and ``c = 1 + s`` (``laplace_tail_offset``); the items with
  noisy count above the noisy threshold are released with their noisy counts,
  at most ``k``, in decreasing order. (ε, δ)-DP per query. The noise is drawn
  on a discrete grid (``noise.KeyedGridLaplace``, ``docs/mechanisms.md`` section 7), so
  every released count is an exact multiple of ``noise.grid_granularity(b)``.
* Both algorithms decide relative to h_(k̄+1), exactly: Algorithm 1 on grid
  indices with the offset rounded up to the grid (``laplace_threshold_index``),
  Algorithm 2 in rationals (``gumbel_margin``). The offset is never rounded away
  at large counts, where the double ``h_(k̄+1) + c`` would lose up to half its ulp.

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
calibration formulas are in ``beam_dpsu.dp.privacy.calibration`` with the others.
"""
from __future__ import annotations

import heapq
import math
from fractions import Fraction
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple


from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.privacy.accounting import (PrivacyGuarantee, br_composition_guarantee, figure,
                                     pay_what_you_get_epsilon, selections_charged)
from beam_dpsu.dp.data.contribution import ItemCounts
from beam_dpsu.dp.data.contribution import sample_items
from beam_dpsu.dp.mechanisms import units
from beam_dpsu.dp.mechanisms.base import Mechanism, RoundCalibration
from beam_dpsu.dp.randomness.noise import (KeyedGridLaplace, KeyedNoise, RunKey, encode_value, keyed_hash64,
                                round_to_grid)

__all__ = ["BOTTOM", "DEFAULT_PURPOSE", "RankKey", "rank_key", "true_top", "item_user_counts",
           "laplace_threshold_index", "gumbel_margin", "TopKMechanism", "top_k_local",
           "format_line"]


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
# The decisions, exact at every count.
# --------------------------------------------------------------------------
#
# A threshold built as the double ``h_b + offset`` rounds the offset by up to
# ulp(h_b)/2 (3e-7 at h_b = 3e9), and no margin of the calibration covers that. Both
# algorithms therefore decide relative to h_b, in exact arithmetic.

def laplace_threshold_index(h_bottom: float, offset: float, granularity: float) -> int:
    """Algorithm 1's unnoised threshold as a grid index: ``h_b/g + ceil(c/g)``.

    The offset c is rounded UP to the grid (never below c), h_b to the grid as every
    count is (``noise.round_to_grid``; exact when g ≤ 1, as h_b is an integer); both in
    exact integers, so the offset keeps its value at every h_b. The noisy threshold is
    this index plus the grid noise's integer.

    Args:
      h_bottom: h_(k̄+1) ≥ 0, the (k̄+1)-th count (0 when fewer items exist).
      offset: c > 0 (``calibration.laplace_threshold_offset``).
      granularity: g, the grid (a power of two, ``noise.grid_granularity``).
    """
    steps = Fraction(offset) / Fraction(granularity)
    return round_to_grid(h_bottom, granularity) + math.ceil(steps)


def gumbel_margin(h: float, h_bottom: float, noise: float) -> Fraction:
    """Algorithm 2's candidate value relative to h_b, exactly: ``(h − h_b) + G``.

    The candidate clears the threshold iff this exceeds ``offset + G_⊥`` (in exact
    rationals: ``Fraction(offset) + Fraction(G_⊥)``); candidates are ranked by it.
    """
    return Fraction(h) - Fraction(h_bottom) + Fraction(noise)


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
      k: the most items to release (integer ≥ 1). No effect on the guarantee, which
        ``epsilon`` states for the whole query: a larger k leaves each selection less.
      epsilon: ε > 0 of the WHOLE query's (ε, δ)-DP guarantee, for both
        algorithms. Algorithm 2 calibrates its per-selection ε from it: the largest
        whose composition over k selections is within (ε, δ)
        (``accounting.pay_what_you_get_epsilon`` with one query). Give either
        ``epsilon`` or ``epsilon_per_selection``. Privacy: the stated ε.
      delta: 0 < δ < 1. With ``epsilon``: the whole query's δ (Algorithm 2 uses
        δ/2 as the probability bound of releasing an item outside the
        neighbour's top k̄, and δ/2 for the conversion of its composition).
        With ``epsilon_per_selection``: that probability bound itself, per query
        (the stated δ is then the composition's, up to 2δ). Privacy: the stated δ.
      k_bar: k̄ ≥ k, the number of candidates (the true top k̄ are noised and
        ``h_(k̄+1)`` sets the threshold); default 10·k (``calibration.default_k_bar``,
        measured on the shared datasets). A larger k̄ sets the threshold from a
        smaller count, at the price of a higher offset (log(k̄/δ)/ε for unrestricted
        sensitivity; none with counts). No privacy effect.
      max_items: Δ, distinct items kept per user (integer in [1,
        ``params.MAX_MAX_ITEMS``]), or None (default) for unrestricted
        sensitivity (Algorithm 2 only). With Δ, Algorithm 2's threshold uses
        log(min(Δ, k̄)/δ); Algorithm 1 needs Δ (b = (Δ+1)/ε). No privacy effect:
        the calibration accounts for it.
      with_counts: False (default) for Algorithm 2 (items only), True for
        Algorithm 1 (items and noisy counts on a discrete grid).
      epsilon_per_selection: Algorithm 2 only, keyword only, instead of
        ``epsilon``: ε > 0 of each bounded-range selection (the Gumbel scale is
        1/ε), e.g. from a ``PayWhatYouGetAccountant`` that composes many queries.
        Privacy: the stated guarantee is the composition of k such selections
        (``br_composition_guarantee`` with δ₁ = δ), larger than it.

    Attributes: ``epsilon``, ``delta`` (the whole query's stated guarantee, as
    ``guarantee``), ``epsilon_per_selection`` and ``delta_per_query``
    (Algorithm 2's calibration; None and δ for Algorithm 1), ``calibrated_from``
    (``'epsilon'`` or ``'epsilon_per_selection'``).
    """

    ranked = True

    def __init__(self, k: int, epsilon: Optional[float] = None, delta: Optional[float] = None,
                 k_bar: Optional[int] = None, max_items: Optional[int] = None,
                 with_counts: bool = False, *, epsilon_per_selection: Optional[float] = None):
        self.k = cal.check_positive_int(k, "k")
        self.k_bar = (cal.default_k_bar(self.k) if k_bar is None
                      else cal.check_positive_int(k_bar, "k_bar"))
        if self.k_bar < self.k:
            raise ValueError(f"k_bar must be >= k={self.k}, got {k_bar!r}")
        self.with_counts = cal.check_flag(with_counts, "with_counts")
        if epsilon is not None and epsilon_per_selection is not None:
            raise ValueError("epsilon (the whole query's) and epsilon_per_selection cannot "
                             "both be given")
        if epsilon is None and epsilon_per_selection is None:
            raise ValueError("epsilon must be given (the whole query's guarantee), or "
                             "epsilon_per_selection for Algorithm 2")
        if delta is None:
            raise ValueError("delta must be given (0 < δ < 1)")
        delta = cal.check_delta(delta)
        max_items = None if max_items is None else cal.check_max_items(max_items)
        if self.with_counts:
            if epsilon_per_selection is not None:
                raise ValueError("epsilon_per_selection applies to Algorithm 2 only (not "
                                 "with_counts): Algorithm 1's epsilon is the whole query's")
            if max_items is None:
                raise ValueError("with_counts (Algorithm 1) needs max_items_per_user (Δ)")
            epsilon = cal.check_epsilon(epsilon)
            self.calibrated_from = "epsilon"
            self.epsilon_per_selection, self.delta_per_query = None, delta
            self.conversion_delta = None
            self.noise = "laplace"
            self.noise_scale = cal.topk_laplace_scale(epsilon, max_items)
            self.threshold_offset = cal.laplace_threshold_offset(epsilon, delta, max_items)
            self.name = "top-k-laplace"
            self._guarantee = PrivacyGuarantee(epsilon, delta,
                                               note="(ε, δ)-DP for the whole query (Algorithm 1)")
            self.composition = None
        else:
            if epsilon is not None:
                epsilon = cal.check_epsilon(epsilon)
                self.calibrated_from = "epsilon"
                eps_sel, delta_q, delta_1 = pay_what_you_get_epsilon(epsilon, delta, self.k, 1)
            else:
                self.calibrated_from = "epsilon_per_selection"
                eps_sel = cal.check_epsilon(epsilon_per_selection, "epsilon_per_selection")
                delta_q = delta_1 = delta
            self.epsilon_per_selection, self.delta_per_query = eps_sel, delta_q
            self.conversion_delta = delta_1
            self.noise = "gumbel"
            self.noise_scale = 1.0 / eps_sel
            self.threshold_offset = cal.gumbel_threshold_offset(eps_sel, delta_q,
                                                                self.k_bar, max_items)
            self.name = "top-k-gumbel"
            # At most k selections and one query: the composition of the budget.
            self.composition = br_composition_guarantee(eps_sel, delta_q, self.k, 1, delta_1)
            c = self.composition
            if epsilon is None:
                self._guarantee = c
            else:
                # The composition is within (ε, δ) by the calibration; the stated
                # guarantee is the (ε, δ) asked for, which is never below it.
                self._guarantee = PrivacyGuarantee(
                    epsilon, delta, rho=c.rho, zcdp_delta=c.zcdp_delta,
                    note=(f"(ε, δ)-DP for the whole query: {self.k} selections of "
                          f"ε = {eps_sel!r} each compose to ({figure(c.epsilon)}, "
                          f"{figure(c.delta)}) ≤ ({figure(epsilon)}, {figure(delta)}); "
                          f"{c.note}"))
        self.epsilon, self.delta = self._guarantee.epsilon, self._guarantee.delta
        self.rounds = [RoundCalibration(None, self.noise, self.noise_scale, max_items, "count")]

    # -- accounting --------------------------------------------------------

    def charge(self, num_released: int) -> Dict[str, Any]:
        """What a query that released ``num_released`` items costs.

        Algorithm 2: ``selections`` (ℓ + 1, or k) ε-BR selections of
        ``epsilon_per_selection``, one query and its δ (``delta``: the
        per-query δ of the pay-what-you-get charge). Algorithm 1: one (ε, δ)-DP
        query, whatever it released.
        """
        if self.with_counts:
            return {"selections": None, "queries": 1, "epsilon": self.epsilon,
                    "delta": self.delta}
        return {"selections": selections_charged(self.k, num_released), "queries": 1,
                "epsilon_per_selection": self.epsilon_per_selection,
                "delta": self.delta_per_query}

    def release_note(self, num_released: int) -> str:
        """One public sentence: how many items the query released out of k, and why.

        Fewer than k means the next candidate's noisy count fell below the noisy
        threshold (or no candidate was left): the query stops at the first one
        that does. Algorithm 2 then pays what it got, ``ℓ + 1`` selections; the
        statement is still the whole query's guarantee (the charge depends on the
        data). ``num_released`` is public (it is the length of the release).
        """
        n = num_released
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.k:
            raise ValueError(f"num_released must be an integer in [0, k={self.k}], got {n!r}")
        if n == self.k:
            return f"released {n} of k = {self.k} items"
        why = (f"released {n} of k = {self.k} items: the next candidate's noisy count fell "
               f"below the noisy threshold (or no candidate was left), so the query stopped "
               f"there")
        if self.with_counts:
            return why + " (Algorithm 1 is charged the whole query whatever it releases)"
        if n + 1 >= self.k:  # the failed selection was the k-th: all k were made
            return why + f" (all {self.k} selections were made and are charged)"
        return why + (f" (pay what you get: only the {n + 1} selections made are charged, "
                      f"not {self.k}; the stated guarantee covers all {self.k})")

    @property
    def guarantee(self) -> PrivacyGuarantee:
        """The (ε, δ)-DP of the whole query on its own (before it runs).

        Calibrated from ``epsilon``: the (ε, δ) given (the composition of k
        selections of the calibrated per-selection ε is within it). From
        ``epsilon_per_selection``: that composition (k selections, one query, δ₁ =
        δ; ``br_composition_guarantee``, rounded up). Algorithm 1: (ε, δ).
        """
        return self._guarantee

    def describe(self) -> Dict[str, Any]:
        """JSON-ready statement of the calibration and the whole query's guarantee."""
        g = self.guarantee
        c = self.composition
        if self.with_counts:
            meaning = "the guarantee of the whole query (Algorithm 1)"
        elif self.calibrated_from == "epsilon":
            meaning = ("the guarantee of the whole query (at most k selections); "
                       "epsilon_per_selection was calibrated from it: the largest whose "
                       "composition over k selections is within (epsilon, delta)")
        else:
            meaning = ("the guarantee of the whole query: the composition of k selections of "
                       "epsilon_per_selection (given), with delta_per_query")
        return {
            "mechanism": self.name,
            "algorithm": 1 if self.with_counts else 2,
            "k": self.k, "k_bar": self.k_bar,
            "epsilon": g.epsilon, "delta": g.delta,
            "epsilon_meaning": meaning,
            "calibrated_from": self.calibrated_from,
            "epsilon_per_selection": self.epsilon_per_selection,
            "delta_per_query": self.delta_per_query,
            "max_items_per_user": self.max_items,
            "noise": self.noise, "noise_scale": self.noise_scale,
            "threshold_offset": self.threshold_offset,
            "query_guarantee": {"epsilon": g.epsilon, "delta": g.delta, "note": g.note},
            "composition": None if c is None else {"epsilon": c.epsilon, "delta": c.delta,
                                                   "note": c.note},
            "units": dict(units.topk_units(self.with_counts), **{
                "epsilon": "ε of the (ε, δ)-DP guarantee of the whole query (every "
                           "selection it makes)",
                "delta_per_query": "δ of one query in the pay-what-you-get analysis "
                                   "(Algorithm 2: the probability bound of releasing an "
                                   "item outside the neighbour's top k̄; Algorithm 1: the "
                                   "query's δ)",
                "calibrated_from": "'epsilon' (the whole query's, given) or "
                                   "'epsilon_per_selection' (given)",
                "composition": "Algorithm 2: the composition of k selections of "
                               "epsilon_per_selection (rounded up); null with counts"}),
        }

    def __repr__(self) -> str:
        per = ("" if self.epsilon_per_selection is None
               else f", ε per selection={self.epsilon_per_selection:.6g}")
        return (f"<TopKMechanism {self.name}: k={self.k}, k̄={self.k_bar}, "
                f"ε={figure(self.epsilon)}, δ={figure(self.delta)}{per}, Δ={self.max_items}>")

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
        h_bottom = ranked[self.k_bar][1] if len(ranked) > self.k_bar else 0
        candidates = ranked[:self.k_bar]
        # Every decision is exact, relative to h_b (``laplace_threshold_index``,
        # ``gumbel_margin``): no rounding of h_b + offset at large counts.
        if self.with_counts:
            noise = KeyedGridLaplace(run_key, self.noise_scale, purpose + "/laplace")
            g = noise.granularity
            bottom = (laplace_threshold_index(h_bottom, self.threshold_offset, g)
                      + noise.index(0.0, BOTTOM))
            noisy = [(noise.index(float(h), encode_value(item)), j, item)
                     for j, (item, h) in enumerate(candidates)]
        else:
            noise = KeyedNoise(run_key, "gumbel", self.noise_scale, purpose + "/gumbel")
            bottom = Fraction(self.threshold_offset) + Fraction(noise(BOTTOM))
            noisy = [(gumbel_margin(h, h_bottom, noise(encode_value(item))), j, item)
                     for j, (item, h) in enumerate(candidates)]
        # Decreasing noisy value; equal values (probability ~2^-40) by true rank.
        noisy.sort(key=lambda t: (-t[0], t[1]))
        out = []
        for v, _, item in noisy:
            if len(out) == self.k or not v > bottom:
                break
            out.append((len(out) + 1, item, float(v) * g) if self.with_counts
                       else (len(out) + 1, item))
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


