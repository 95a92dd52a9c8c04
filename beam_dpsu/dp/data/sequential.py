"""Sequential update policies: one user at a time, in a fixed keyed order.

The policy mechanisms (``docs/mechanisms.md`` section 4) build
the histogram ``H`` by visiting the users in the order of a keyed hash of the
user id; each user spends a budget of 1 (in the ℓ1 or ℓ2 norm) raising their
items towards the cutoff ``Γ = T + α·(λ or σ)``, and no item is ever raised
above ``Γ``. Noise and the threshold ``T`` are applied afterwards to the
finished histogram, exactly as in section 2.

This module is pure Python and numpy (no Beam). It has three layers:

* reference functions on numpy arrays (``l1_descent``, ``l2_descent``,
  ``greedy_fill``): the user's current values in, the new values out. They are
  written to read like ``docs/mechanisms.md`` and are what the unit tests check;
* the fast in-place updates on a ``{item: weight}`` dict (``apply_l1``,
  ``apply_l2``, ``apply_greedy``, ``apply_cascade_free``) that the Beam
  transform and the Beam-free core both run (plain Python dict operations: measured faster per user than
  numpy for the item counts of real data, where a user has tens of items);
* ``UserPolicy`` objects (``L1DescentPolicy``, ``L2DescentPolicy``,
  ``CascadeFreeGreedyPolicy``, and the published ``GreedyPolicy``):
  ``prepare(user, counts)`` does everything that depends on one user only
  (Δ0 sampling, the greedy item order, K_i — for GW-KT's ``'front'`` selection
  also the user's own position in the keyed order, ``user_position``) and can
  run in parallel;
  ``update(hist, prepared)`` is the sequential step.

Why a sequential policy is private: a data-independent user order is NOT
enough by itself. The proof (``docs/gw.md``) needs, besides an order that
depends on no user's data and per-user choices (sampled items, walk order)
that depend on the user's own data only, two properties of the update:

(b) contractivity: each update is monotone (H ≤ H′ ⇒ f(H) ≤ f(H′)) and
    non-expansive (ℓ1, or ℓ2 for ℓ2-descent) on ordered pairs, so the finished
    histograms of neighbouring datasets stay within 1 of each other;
(c) the support condition: only the added user's own kept items can be
    non-zero in H′ and zero in H (at most Δ0 items whose weights have norm
    ≤ 1, which the threshold accounts for).

ℓ1-descent (water-filling) and ℓ2-descent satisfy (c) because they raise
*every* kept item below Γ by a positive amount; the cascade-free greedy
satisfies it through its step 1 (ℓ1-descent with budget η over K_i). The
published greedy (``GreedyPolicy``) satisfies (b) but NOT (c): with an added
user x, a later user can find an item x filled to Γ, skip it and spend budget
on an item it never reached without x (the "cascade"), so it is not proven
private and is kept for research only. The walk orders never depend on the
histogram. A policy that ranks items by their current weight ("fill the items
closest to Γ first") is NOT private; see ``tests/test_policies.py`` for the
counterexample, and ``tests/test_gw_cascade.py`` for (b) and (c) on fuzzed
neighbouring pairs.

Floating point: every raised value is clamped to ``Γ``, so no item ever
exceeds the cutoff, and each user's change has norm at most ``1`` up to
rounding of a few units in the last place.
"""
from __future__ import annotations

import math
from operator import itemgetter
from typing import Any, Callable, Dict, Hashable, Iterable, List, Mapping, Optional, Sequence, \
    Tuple

import numpy as np

from beam_dpsu.dp.data.contribution import ItemCounts, sample_items
from beam_dpsu.dp.privacy.calibration import check_eta, check_max_items
from beam_dpsu.dp.data.lines import iter_line_counts, open_local_binary, parse_line
from beam_dpsu.dp.randomness.noise import KeyedHash64, RunKey, encode_value, keyed_hash64
from beam_dpsu.dp.privacy.params import DEFAULT_FRONT_SCALE, DEFAULT_FRONT_MARGIN

__all__ = ["public_counts_from_pairs", "format_public_counts", "Histogram", "l1_descent", "l2_descent", "greedy_fill", "TIE_BREAKS",
           "check_tie_break", "greedy_order", "apply_l1", "apply_l2", "apply_greedy",
           "cascade_free_fill", "apply_cascade_free", "user_sort_key", "user_position",
           "KT_SELECTIONS", "check_kt_selection", "check_front_scale", "check_front_margin",
           "front_start", "UserPolicy", "L1DescentPolicy", "L2DescentPolicy", "ItemIds",
           "GreedyPolicy", "CascadeFreeGreedyPolicy", "run_in_order", "run_packed",
           "run_packed_arrays", "is_sampled", "ItemIdCollision", "add_id_mapping",
           "run_sequential",
           "read_public_counts", "parse_public_count_line"]


Histogram = Dict[Hashable, float]

# ---------------------------------------------------------------------------
# Reference functions (numpy arrays in, numpy arrays out).
# ---------------------------------------------------------------------------


def _check_cutoff(cutoff: float) -> float:
    c = float(cutoff)
    if not (c > 0 and math.isfinite(c)):
        raise ValueError(f"cutoff must be a finite number > 0, got {cutoff!r}")
    return c


def l1_descent(current, cutoff: float, budget: float = 1.0) -> np.ndarray:
    """ℓ1-descent (Policy Laplace, ``docs/mechanisms.md`` section 4) on one user's items.

    Water-filling: the items below the cutoff are raised by the same amount
    until the smallest gap closes, that item is dropped, and so on until the
    budget is spent. Items at or above the cutoff are unchanged.

    Args:
      current: ``H[u]`` for each of the user's kept items (any order).
      cutoff: Γ > 0.
      budget: the user's ℓ1 budget (1 in every mechanism).
    Returns:
      The new values, same order. The total change is ``min(budget, Σ gaps)``
      and no value exceeds Γ.
    """
    cutoff = _check_cutoff(cutoff)
    h = np.asarray(current, dtype=float)
    out = h.copy()
    below = np.flatnonzero(h < cutoff)
    if below.size == 0:
        return out
    gaps = cutoff - h[below]
    order = np.argsort(gaps, kind="stable")
    g = gaps[order]
    m = g.size
    remaining = float(budget)
    prev = 0.0
    for j in range(m):
        cost = (g[j] - prev) * (m - j)
        if cost <= remaining:
            remaining -= cost
            prev = g[j]
            continue
        level = prev + remaining / (m - j)
        idx = below[order]
        out[idx[:j]] = cutoff
        out[idx[j:]] = np.minimum(h[idx[j:]] + level, cutoff)
        return out
    out[below] = cutoff
    return out


def l2_descent(current, cutoff: float, budget: float = 1.0) -> np.ndarray:
    """ℓ2-descent (Policy Gaussian, ``docs/mechanisms.md`` section 4) on one user's items.

    With ``d_u = Γ − H[u]`` for the items below the cutoff and ``Z = ‖d‖₂``:
    if ``Z ≤ budget`` every such item is set to Γ, else each is raised by
    ``budget·d_u/Z``. The change has ℓ2 norm ``min(budget, Z)``.
    """
    cutoff = _check_cutoff(cutoff)
    h = np.asarray(current, dtype=float)
    out = h.copy()
    below = h < cutoff
    if not below.any():
        return out
    d = cutoff - h[below]
    z = float(np.sqrt(np.sum(d * d)))
    if z <= budget:
        out[below] = cutoff
    else:
        out[below] = np.minimum(h[below] + d * (budget / z), cutoff)
    return out


def greedy_fill(current_in_order, cutoff: float, budget: float = 1.0) -> np.ndarray:
    """Greedy (GW, ``docs/gw.md`` section 1.1) on one user's items, already in walk order.

    Walks the items in the given order, skipping those at or above Γ: an item
    whose gap ``Γ − H[u]`` fits in the remaining budget is set to Γ; the first
    one that does not fit gets the whole remaining budget and the walk stops.
    The order must come from ``greedy_order`` (never from the histogram).
    """
    cutoff = _check_cutoff(cutoff)
    out = np.asarray(current_in_order, dtype=float).copy()
    remaining = float(budget)
    for k in range(out.size):
        if remaining <= 0:
            break
        h = out[k]
        if h >= cutoff:
            continue
        cost = cutoff - h
        if cost <= remaining:
            out[k] = cutoff
            remaining -= cost
        else:
            out[k] = min(h + remaining, cutoff)
            break
    return out


TIE_BREAKS = ("item-hash", "first-occurrence")


def check_tie_break(tie_break) -> str:
    """Validates the greedy policy's tie-break (see ``GreedyPolicy``)."""
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
    return tie_break


def greedy_order(counts: Mapping[Hashable, int], item_hash: Callable[[Hashable], int],
                 public_counts: Optional[Mapping[Hashable, float]] = None,
                 tie_break: str = "item-hash") -> List[Hashable]:
    """The order in which the greedy policy walks one user's items.

    GW: by the user's own frequency ``C_i[u]`` descending, ties by the keyed
    item hash ascending. GW-KT (``public_counts`` given): by the public count
    descending (1 for an item absent from the public data), then ``C_i[u]``
    descending, then the hash. The order depends on the user's data, the
    public data and the key only: never on the histogram or on other users.

    Args:
      counts: ``{item: C_i[u]}`` of the user.
      item_hash: ``item -> int``, a keyed hash (``GreedyPolicy.item_hash``).
      public_counts: ``{item: public count}`` for GW-KT, or None for GW.
      tie_break: ``'item-hash'`` (the default, ``docs/gw.md``) or ``'first-occurrence'``:
        the last tie-break is then the item's position in ``counts`` (its
        iteration order, which must be the order of the user's own records,
        as ``ReadUserItems(keep_order=True)`` builds it) instead of the hash.
    """
    if check_tie_break(tie_break) == "first-occurrence":
        position = {u: i for i, u in enumerate(counts)}.__getitem__
    else:
        position = item_hash
    if public_counts is None:
        return [u for _, _, u in sorted(((-c, position(u), u) for u, c in counts.items()),
                                        key=_first_two)]
    get = public_counts.get
    return [u for _, _, _, u in sorted(
        ((-get(u, 1), -c, position(u), u) for u, c in counts.items()), key=_first_three)]


_first_two = itemgetter(0, 1)
_first_three = itemgetter(0, 1, 2)


# ---------------------------------------------------------------------------
# Fast in-place updates on a {item: weight} dict (the production path).
# ---------------------------------------------------------------------------

_by_gap = itemgetter(0)


def apply_l1(hist: Histogram, items: Sequence[Hashable], cutoff: float,
             budget: float = 1.0) -> None:
    """ℓ1-descent of one user's ``items`` applied to ``hist`` in place (see ``l1_descent``).

    ``budget``: the ℓ1 budget (1 for Policy Laplace; η for step 1 of the
    cascade-free greedy). Every item below the cutoff is raised by a strictly
    positive amount when ``budget > 0``.
    """
    get = hist.get
    below = []
    for u in items:
        h = get(u, 0.0)
        if h < cutoff:
            below.append((cutoff - h, h, u))
    m = len(below)
    if m == 0:
        return
    if m == 1:
        g, h, u = below[0]
        if g <= budget:
            hist[u] = cutoff
        else:
            v = h + budget
            hist[u] = v if v < cutoff else cutoff
        return
    below.sort(key=_by_gap)
    remaining = budget
    prev = 0.0
    for j in range(m):
        g, h, u = below[j]
        cost = (g - prev) * (m - j)
        if cost <= remaining:
            remaining -= cost
            prev = g
            hist[u] = cutoff
            continue
        level = prev + remaining / (m - j)
        for g, h, u in below[j:]:
            v = h + level
            hist[u] = v if v < cutoff else cutoff
        return


def apply_l2(hist: Histogram, items: Sequence[Hashable], cutoff: float) -> None:
    """ℓ2-descent of one user's ``items`` applied to ``hist`` in place (see ``l2_descent``)."""
    get = hist.get
    below = []
    z2 = 0.0
    for u in items:
        h = get(u, 0.0)
        if h < cutoff:
            d = cutoff - h
            z2 += d * d
            below.append((d, h, u))
    if not below:
        return
    if z2 <= 1.0:
        for _, _, u in below:
            hist[u] = cutoff
        return
    inv = 1.0 / math.sqrt(z2)
    for d, h, u in below:
        v = h + d * inv
        hist[u] = v if v < cutoff else cutoff


def apply_greedy(hist: Histogram, ordered_items: Sequence[Hashable], cutoff: float,
                 budget: float = 1.0) -> None:
    """Greedy fill of one user's items (in ``greedy_order``) applied to ``hist`` in place.

    ``budget``: the ℓ1 budget (1 for the published GW; 1 − η for step 2 of the
    cascade-free greedy).
    """
    get = hist.get
    remaining = budget
    for u in ordered_items:
        h = get(u, 0.0)
        if h >= cutoff:
            continue
        cost = cutoff - h
        if cost <= remaining:
            hist[u] = cutoff
            remaining -= cost
            if remaining <= 0.0:
                return
        else:
            v = h + remaining
            hist[u] = v if v < cutoff else cutoff
            return


def cascade_free_fill(current_in_order, cutoff: float, eta: float) -> np.ndarray:
    """Cascade-free greedy (``docs/gw.md`` section 1.2) on one user's kept items K_i, in walk order.

    Step 1: ℓ1-descent with budget ``eta`` over the items below Γ (each of them
    gains a strictly positive amount). Step 2: the greedy walk, in the given
    order, with the remaining budget ``1 − eta``. Total change ≤ 1.
    """
    return greedy_fill(l1_descent(current_in_order, cutoff, eta), cutoff, 1.0 - eta)


def apply_cascade_free(hist: Histogram, ordered_items: Sequence[Hashable], cutoff: float,
                       eta: float, rest: float) -> None:
    """Cascade-free greedy of one user's kept items (walk order) applied to ``hist`` in place.

    ``apply_l1`` with budget ``eta``, then ``apply_greedy`` with budget
    ``rest`` (the policy passes ``rest = 1 − eta``, computed once).
    """
    apply_l1(hist, ordered_items, cutoff, eta)
    apply_greedy(hist, ordered_items, cutoff, rest)


# ---------------------------------------------------------------------------
# User order and policy objects.
# ---------------------------------------------------------------------------


def user_sort_key(order_key: bytes, user: Any) -> Tuple[int, bytes]:
    """The position of ``user`` in the processing order: (keyed hash, encoded id).

    ``order_key`` is ``run_key.subkey('order')``. The order depends only on
    the key and the user id, never on anyone's data; ties of the 64-bit hash
    (probability about n²/2^65) are broken by the canonical bytes of the id.
    """
    encoded = encode_value(user)
    return keyed_hash64(order_key, encoded), encoded


def user_position(order_key: bytes, user: Any) -> float:
    """The user's position ``p_i ∈ [0, 1]`` in the processing order: its order hash / 2^64
    (as a double, so the top 2^10 hash values give exactly 1).

    A function of ``run_key.subkey('order')`` and the user id only (the first
    component of ``user_sort_key``), never of anyone's data.
    """
    return keyed_hash64(order_key, encode_value(user)) / 18446744073709551616.0   # 2^64


#: How the cascade-free GW-KT chooses K_i from a user's public-count walk order.
KT_SELECTIONS = ("front", "prefix")


def check_kt_selection(selection) -> str:
    """Validates GW-KT's K_i selection: ``'front'`` or ``'prefix'``."""
    if selection not in KT_SELECTIONS:
        raise ValueError(f"kt_selection must be one of {KT_SELECTIONS}, got {selection!r}")
    return selection


def check_front_scale(scale) -> float:
    """Validates κ of the ``'front'`` selection: a finite number > 0."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) \
            or not (float(scale) > 0 and math.isfinite(float(scale))):
        raise ValueError(f"front_scale must be a finite number > 0, got {scale!r}")
    return float(scale)


def check_front_margin(margin) -> int:
    """Validates M of the ``'front'`` selection: an integer >= 0."""
    if isinstance(margin, float) and margin.is_integer():
        margin = int(margin)
    if isinstance(margin, bool) or not isinstance(margin, (int, np.integer)) or margin < 0:
        raise ValueError(f"front_margin must be an integer >= 0, got {margin!r}")
    return int(margin)


def front_start(walk_public_counts: Sequence[float], max_items: int, position: float,
                cutoff: float, scale: float, margin: int) -> int:
    """Where the ``'front'`` selection's window of Δ0 walk items starts (``docs/gw.md`` 1.3).

    With ``n = len(walk_public_counts)`` (the public counts of the user's
    items, 1 for an item absent from the public data, in any order) and ``s``
    the number of them that are ``≥ scale·cutoff/position`` (the items
    predicted to be at Γ before the user's turn; none when ``position == 0``;
    the walk order is by public count descending, so these are its first
    ``s`` items), the window starts at
    ``min(n − Δ0, max(0, s − margin))``; 0 when ``n ≤ Δ0``. Every input is the
    user's own data, the public counts, the user's own position and public
    parameters.
    """
    n = len(walk_public_counts)
    if n <= max_items or position <= 0.0:
        return 0
    bar = scale * cutoff / position
    s = sum(1 for c in walk_public_counts if c >= bar)
    return min(n - max_items, max(0, s - margin))


class UserPolicy:
    """A sequential update policy: ``prepare`` (per user, parallel) and ``update`` (in order).

    The histogram the policy updates is keyed by item ids (``ItemIds``), not
    by the items: ``prepare`` maps a user's items to ids, ``update`` works on
    ids only, and the caller maps ids back to items when the histogram is
    finished.

    Attributes:
      name: ``'l1-descent'``, ``'l2-descent'``, ``'greedy'`` or ``'greedy-public'``.
      cutoff: Γ.
      norm: ``'l1'`` or ``'l2'``, the norm in which each user's change is at most 1.
      needs_public_counts: True for GW-KT (``prepare`` takes the public counts).
      item_ids: the ``ItemIds`` mapping items to ids.
    """

    name = ""
    norm = "l1"
    needs_public_counts = False

    def __init__(self, cutoff: float, item_key: bytes):
        self.cutoff = _check_cutoff(cutoff)
        self.item_ids = ItemIds(item_key)

    def prepare(self, user: Any, counts: ItemCounts, public_counts=None
                ) -> Tuple[List[int], Sequence[Hashable]]:
        """``(ids, items)``: the ids ``update`` uses, in the order it uses them, and
        the user's items those ids stand for (empty ids: the user is skipped)."""
        raise NotImplementedError

    def update(self, hist: Histogram, prepared: Sequence[int]) -> None:
        """Applies one prepared user (their ids) to ``hist`` in place."""
        raise NotImplementedError


class _SampledPolicy(UserPolicy):
    """A policy over a uniformly random Δ0-subset of each user's distinct items."""

    #: ``prepare`` returns ``(ids, items)`` with ``ids[k]`` the id of the k-th item.
    ids_follow_items = True

    def __init__(self, cutoff: float, max_items: int, sample_key: bytes, item_key: bytes):
        super().__init__(cutoff, item_key)
        self.max_items = check_max_items(max_items)
        self._sample_key = sample_key

    @property
    def sample_key(self) -> bytes:
        """The Δ0 sampler's key (``run_key.subkey('sample/0')``)."""
        return self._sample_key

    def prepare(self, user, counts, public_counts=None):
        """The ids of the user's sampled items in increasing order (with those items):
        the order the descent update sums them in is then a function of the
        sampled set alone, never of the order of ``counts`` (which a runner's
        merge of partial counts may change), so every path gives the same floats."""
        if not counts:
            return [], ()
        kept = list(sample_items(user, counts, self.max_items, self._sample_key))
        ids = self.item_ids.many(kept)
        order = sorted(range(len(ids)), key=ids.__getitem__)
        return [ids[k] for k in order], [kept[k] for k in order]


def is_sampled(policy: UserPolicy) -> bool:
    """Whether ``policy`` prepares a user as the sampled policies do (Policy Laplace,
    Policy Gaussian: the Δ0 sample of ``contribution.sample_items`` under
    ``policy.sample_key``, then their ids in increasing order), with that exact
    ``prepare`` (not a subclass's own): what the columnar path may compute for
    many users at once."""
    return isinstance(policy, _SampledPolicy) and type(policy).prepare is _SampledPolicy.prepare


class L1DescentPolicy(_SampledPolicy):
    """ℓ1-descent over at most Δ0 sampled items (Policy Laplace).

    Args:
      cutoff: Γ = T + α·λ.
      max_items: Δ0.
      sample_key: ``run_key.subkey('sample/0')``.
      item_key: ``run_key.subkey('item-order')`` (item ids).
    """

    name = "l1-descent"
    norm = "l1"

    def update(self, hist, prepared):
        apply_l1(hist, prepared, self.cutoff)


class L2DescentPolicy(_SampledPolicy):
    """ℓ2-descent over at most Δ0 sampled items (Policy Gaussian). Args as ``L1DescentPolicy``."""

    name = "l2-descent"
    norm = "l2"

    def update(self, hist, prepared):
        apply_l2(hist, prepared, self.cutoff)


class ItemIds:
    """Item → 63-bit integer id: a keyed hash of the item, cached.

    The sequential stage works on these integers instead of the items
    themselves (hashing a Python int is free, hashing a freshly decoded string
    is not), and the greedy policy breaks ties by them: the id is
    ``keyed_hash64(run_key.subkey('item-order'), encode_value(item)) >> 1``,
    a PRF of the item, independent of every user. Two distinct items share an
    id with probability about n²/2^64 for n distinct items; the transforms
    detect that and fail rather than merge them.

    Args:
      item_key: ``run_key.subkey('item-order')``.
      max_cache: entries kept before the cache is cleared (bounds memory).
    """

    def __init__(self, item_key: bytes, max_cache: int = 1 << 21):
        self._key = item_key
        self._hash = KeyedHash64(item_key)  # keyed_hash64(item_key, ·)
        # keyed_hash64(item_key, b"s" + ·): a string's encode_value is b"s" + its UTF-8
        self._str_hash = KeyedHash64(item_key, prefix=b"s")
        self._max_cache = max_cache
        self._cache: Dict[Hashable, int] = {}
        self._recording = False

    def __getstate__(self):
        return {"_key": self._key, "_max_cache": self._max_cache, "_cache": {}}

    def __setstate__(self, state):
        self.__init__(state["_key"], state["_max_cache"])

    def record_into(self, mapping: Optional[Dict[Hashable, int]]) -> None:
        """Uses ``mapping`` as the cache from now on, and never clears it: it then
        holds ``item -> id`` for every item looked up since (plus what it held),
        so a caller that needs the items it looked up gets them without a second
        dict. The caller bounds its size (replace it, or call again). ``None``:
        back to a private cache of at most ``max_cache`` entries."""
        self._recording = mapping is not None
        self._cache = mapping if mapping is not None else {}

    def __call__(self, item: Hashable) -> int:
        i = self._cache.get(item)
        if i is None:
            if len(self._cache) >= self._max_cache and not self._recording:
                self._cache.clear()
            i = self._cache[item] = (
                self._str_hash(item.encode("utf-8", "surrogatepass")) if type(item) is str
                else self._hash(encode_value(item))) >> 1
        return i

    def many(self, items: Iterable[Hashable]) -> List[int]:
        """``[self(item) for item in items]``: the cache lookups done in C, and the
        missing ids hashed in one loop (strings without a call per item: this runs
        once per kept user-item pair of the sampled policies)."""
        items = items if isinstance(items, (list, tuple)) else list(items)
        cache = self._cache
        ids = list(map(cache.get, items))
        if None not in ids:
            return ids
        if len(cache) + ids.count(None) > self._max_cache and not self._recording:
            cache.clear()
        str_state = self._str_hash.fresh
        from_bytes = int.from_bytes
        for k, i in enumerate(ids):
            if i is None:
                item = items[k]
                if type(item) is str:
                    h = str_state()
                    h.update(item.encode("utf-8", "surrogatepass"))
                    i = from_bytes(h.digest(), "big") >> 1
                else:
                    i = self._hash(encode_value(item)) >> 1
                ids[k] = cache[item] = i
        return ids


_ID_MASK = (1 << 63) - 1


class GreedyPolicy(UserPolicy):
    """The published greedy fill (GW) or greedy with public counts (GW-KT); no Δ0.

    NOT PROVEN PRIVATE (it lacks the support condition; see the module
    docstring and ``docs/gw.md``); the default GW and GW-KT use
    ``CascadeFreeGreedyPolicy``.

    Every distinct item of the user takes part, walked in ``greedy_order``
    (frequency descending, ties by the keyed item id; with public counts,
    public count first).

    Args:
      cutoff: Γ = T + α·λ.
      item_key: ``run_key.subkey('item-order')``: the key of the item ids,
        which also break ties in the walk order.
      use_public_counts: True for GW-KT: ``prepare`` then needs the public
        counts (``{item: count}``; items absent count as 1).
      tie_break: how items of equal frequency (and public count) are ordered.
        ``'item-hash'`` (default, ``docs/gw.md``): by the keyed item id.
        ``'first-occurrence'``: by the order of the user's ``counts`` mapping,
        which must be the order in which the items first occur in the user's
        own records (``ReadUserItems(keep_order=True)`` and
        ``dp.data.contribution.per_user_counts`` build it so). This is what the authors'
        reference code does; on data whose records list a user's items in a
        meaningful order (words of a title) it releases fewer items than the
        hash (``docs/gw.md``). Privacy: unchanged. The
        walk order is still a function of the user's own data only, never of
        the histogram or of other users, which is what the proof needs of
        the walk order (condition (a′) of ``docs/gw.md``). It must not be an
        order Beam produced by merging partial counts, which can depend on
        how the input was bundled.
    """

    norm = "l1"

    def __init__(self, cutoff: float, item_key: bytes, use_public_counts: bool = False,
                 tie_break: str = "item-hash"):
        super().__init__(cutoff, item_key)
        self.needs_public_counts = bool(use_public_counts)
        self.tie_break = check_tie_break(tie_break)
        self.name = "greedy-public" if use_public_counts else "greedy"

    def prepare(self, user, counts, public_counts=None):
        if not counts:
            return [], ()
        iid = self.item_ids
        by_position = self.tie_break == "first-occurrence"
        if self.needs_public_counts:
            if public_counts is None:
                raise ValueError("the greedy policy with public counts needs the public counts")
            get = public_counts.get
            if by_position:
                items = list(counts)
                keyed = sorted([(-get(u, 1), -counts[u], i) for i, u in enumerate(items)])
                return [iid(items[k[2]]) for k in keyed], counts
            keyed = sorted([(-get(u, 1), -c, iid(u)) for u, c in counts.items()])
            return [k[2] for k in keyed], counts
        if by_position:
            # -C·2^32 + position (a user has fewer than 2^32 items).
            items = list(counts)
            keyed = sorted([(-c << 32) | i for i, c in enumerate(counts.values())])
            return [iid(items[k & _POSITION_MASK]) for k in keyed], counts
        # One integer per item, -C·2^63 + id (0 <= id < 2^63): sorting it orders
        # by frequency descending, then id ascending, as greedy_order does.
        keyed = sorted([(-c << 63) | iid(u) for u, c in counts.items()])
        return [k & _ID_MASK for k in keyed], counts

    def update(self, hist, prepared):
        apply_greedy(hist, prepared, self.cutoff)


_POSITION_MASK = (1 << 32) - 1


class CascadeFreeGreedyPolicy(GreedyPolicy):
    """Cascade-free greedy (the default GW and GW-KT policy, ``docs/gw.md`` section 1.2).

    ``prepare`` keeps ``K_i``: Δ0 consecutive items of the user's walk order
    (``greedy_order``: the user's frequencies, or public counts first, then
    the tie-break), by default the first Δ0 (``selection='prefix'``), or for
    GW-KT with ``selection='front'`` a window that skips the items predicted
    from the public counts to be at Γ before the user's turn (``front_start``).
    K_i depends on the user's own data, the public counts, the key and (for
    ``'front'``) the user's own position in the keyed order only. ``update``
    then spends the budget of 1 in two steps over ``K_i``: ℓ1-descent with
    budget η (every item of K_i below Γ gains a strictly positive weight),
    then the greedy walk with budget 1 − η.

    Why (``docs/gw.md``): with step 1, after each user the histogram's support
    is exactly the union of the processed users' K_i, in both neighbouring
    datasets, so the only items the added user x can make non-zero are its
    own ≤ Δ0 kept items (the support condition); the published greedy, where
    a later user can be diverted by x onto items it never reached without x,
    does not have this property. Both steps are monotone and ℓ1-non-expansive,
    so the finished histograms still differ by at most 1 in ℓ1.

    Args:
      cutoff: Γ = T + α·λ.
      item_key: ``run_key.subkey('item-order')`` (item ids and hash tie-break).
      max_items: Δ0 ≥ 1, the size of K_i. Privacy: the threshold grows with
        Δ0 (``calibration.gw_cascade_free_threshold``).
      eta: η in (0, 1), the step-1 budget. Privacy: none on the threshold, but
        η > 0 is what makes the support condition hold.
      use_public_counts, tie_break: as for ``GreedyPolicy``.
      selection: ``'prefix'`` (default here; the first Δ0 walk items) or
        ``'front'`` (GW-KT only: needs ``use_public_counts`` and ``order_key``).
        Privacy: none; both satisfy condition (a′) of ``docs/gw.md``.
      order_key: ``run_key.subkey('order')``, the key of the processing order
        (``'front'`` only: the user's position ``user_position``).
      front_scale: κ > 0 of ``'front'`` (default ``DEFAULT_FRONT_SCALE``).
      front_margin: M ≥ 0 of ``'front'`` (default ``DEFAULT_FRONT_MARGIN``).
    """

    def __init__(self, cutoff: float, item_key: bytes, max_items: int, eta: float,
                 use_public_counts: bool = False, tie_break: str = "item-hash",
                 selection: str = "prefix", order_key: Optional[bytes] = None,
                 front_scale: float = DEFAULT_FRONT_SCALE,
                 front_margin: int = DEFAULT_FRONT_MARGIN):
        super().__init__(cutoff, item_key, use_public_counts, tie_break)
        self.max_items = check_max_items(max_items)
        self.eta = check_eta(eta)
        self.rest = 1.0 - self.eta
        self.name = "cascade-free-greedy-public" if use_public_counts else "cascade-free-greedy"
        self.selection = check_kt_selection(selection)
        self.front_scale = check_front_scale(front_scale)
        self.front_margin = check_front_margin(front_margin)
        if self.selection == "front":
            if not self.needs_public_counts:
                raise ValueError("selection='front' needs the public counts "
                                 "(use_public_counts=True, GW-KT)")
            if not isinstance(order_key, bytes) or not order_key:
                raise ValueError("selection='front' needs order_key = "
                                 "run_key.subkey('order')")
        self._order_key = order_key

    def kept_start(self, user, counts, public_counts) -> int:
        """Index in the walk order of K_i's first item (0 for ``'prefix'``)."""
        if self.selection == "prefix" or len(counts) <= self.max_items:
            return 0
        get = public_counts.get
        return front_start([get(u, 1) for u in counts], self.max_items,
                           user_position(self._order_key, user), self.cutoff,
                           self.front_scale, self.front_margin)

    def prepare(self, user, counts, public_counts=None):
        ids, items = super().prepare(user, counts, public_counts)
        if len(ids) <= self.max_items:
            return ids, items
        start = self.kept_start(user, counts, public_counts)
        ids = ids[start:start + self.max_items]
        kept = set(ids)
        iid = self.item_ids
        return ids, [u for u in items if iid(u) in kept]

    def update(self, hist, prepared):
        apply_cascade_free(hist, prepared, self.cutoff, self.eta, self.rest)


# The compiled kernel that mirrors each built-in update, operation for operation.
_KERNEL_OF_UPDATE = {
    L1DescentPolicy.update: "l1-descent",
    L2DescentPolicy.update: "l2-descent",
    GreedyPolicy.update: "greedy",
    CascadeFreeGreedyPolicy.update: "cascade-free-greedy",
}


def run_in_order(prepared_users: Iterable[Sequence[int]], policy: UserPolicy,
                 hist: Optional[Histogram] = None) -> Histogram:
    """Applies already-ordered, prepared users (their id lists) to a histogram; returns it.

    Ids that no user raised are absent (never present with weight 0).
    """
    hist = {} if hist is None else hist
    update = policy.update
    for prepared in prepared_users:
        if prepared:
            update(hist, prepared)
    return hist


def run_packed(batches: Iterable[Tuple[np.ndarray, np.ndarray]], policy: UserPolicy):
    """Applies batches of prepared users, in order, and returns ``(id, weight)`` pairs.

    Each batch is ``(lengths, ids)``: user k of the batch has the next
    ``lengths[k]`` ids of ``ids``. With numba installed, and when the policy's
    ``update`` is exactly one of the built-in updates (not overridden by a
    subclass), this runs the compiled kernel of ``beam_dpsu.dp.data.kernels`` that
    mirrors it (bit-for-bit the same histogram, several times faster);
    otherwise ``policy.update`` on a dict. Ids no user raised
    are absent; every returned weight is > 0 for the descent policies.
    """
    ids, weights = run_packed_arrays(batches, policy)
    return zip(ids.tolist(), weights.tolist())


def run_packed_arrays(batches: Iterable[Tuple[np.ndarray, np.ndarray]], policy: UserPolicy
                      ) -> Tuple[np.ndarray, np.ndarray]:
    """``run_packed`` with the histogram as two arrays: ids (int64) and their weights."""
    from beam_dpsu.dp.data import kernels
    kernel = _KERNEL_OF_UPDATE.get(type(policy).update)
    if kernel is not None and kernels.available():
        runner = kernels.DenseRunner(kernel, policy.cutoff, eta=getattr(policy, "eta", 0.0))
        for lengths, ids in batches:
            runner.add_users(ids, lengths)
        return runner.arrays()
    hist: Histogram = {}
    update = policy.update
    for lengths, ids in batches:
        all_ids = ids.tolist()
        pos = 0
        for n in lengths.tolist():
            end = pos + n
            update(hist, all_ids[pos:end])
            pos = end
    return (np.fromiter(hist.keys(), dtype=np.int64, count=len(hist)),
            np.fromiter(hist.values(), dtype=np.float64, count=len(hist)))


class ItemIdCollision(RuntimeError):
    """Two distinct items got the same 63-bit id (probability ~n²/2^64): rerun with a new key."""


def add_id_mapping(mapping: Dict[int, Hashable], ids: Sequence[int], items: Iterable[Hashable],
                   item_ids: "ItemIds") -> None:
    """Records ``id -> item`` for ``items``; raises ``ItemIdCollision`` on a clash."""
    del ids  # the ids are recomputed from the (cached) item ids, for every item
    for item in items:
        i = item_ids(item)
        old = mapping.setdefault(i, item)
        if old is not item and old != item:
            raise ItemIdCollision(
                "two distinct items share a 63-bit item id; rerun with a fresh run key")


def run_sequential(per_user: Mapping[Any, ItemCounts], policy: UserPolicy, run_key: RunKey,
                   public_counts: Optional[Mapping[Hashable, float]] = None
                   ) -> Dict[Hashable, float]:
    """The finished histogram ``{item: weight > 0}`` of a policy on in-memory data.

    The Beam-free core of ``ordered.OrderedUserPolicy``, with the same
    functions in the same order: each user is prepared with
    ``policy.prepare``, the users are sorted by ``user_sort_key`` under
    ``run_key.subkey('order')``, applied with ``policy.update`` on item ids,
    and the ids are mapped back to items.
    """
    order_key = run_key.subkey("order")
    keyed = []
    mapping: Dict[int, Hashable] = {}
    for user, counts in per_user.items():
        ids, items = policy.prepare(user, counts, public_counts)
        if ids:
            add_id_mapping(mapping, ids, items, policy.item_ids)
            keyed.append((user_sort_key(order_key, user), ids))
    keyed.sort(key=_by_gap)
    lengths = np.fromiter((len(p) for _, p in keyed), dtype=np.int64, count=len(keyed))
    ids = np.fromiter((i for _, p in keyed for i in p), dtype=np.int64, count=int(lengths.sum()))
    return {mapping[i]: w for i, w in run_packed([(lengths, ids)], policy) if w > 0}


def read_public_counts(path: str, opener=None) -> Dict[str, float]:
    """Reads a public-counts file of ``item<TAB>count`` lines into a dict.

    The item is everything before the last tab; the count a number ≥ 0
    (integers are kept as ints). Duplicate items are summed; blank lines are
    skipped. Any other line raises ValueError naming the line number. ``.gz``
    and ``.bz2`` files are decompressed. Public counts cost no privacy budget:
    they must come from data that is not the private input.

    Args:
      path: the file.
      opener: ``path -> binary file object``; default ``open_local_binary`` (a
        local file). The Beam transforms pass one that reads any Beam filesystem.
    """
    out: Dict[str, float] = {}
    with (opener or open_local_binary)(path) as f:
        for lineno, raw in enumerate(f, 1):
            item, count = parse_public_count_line(raw, lineno)
            if item is not None:
                out[item] = out.get(item, 0) + count
    return out


def public_counts_from_pairs(paths: Sequence[str], opener=None) -> Tuple[Dict[str, int], int]:
    """The public counts GW-KT reads, from PUBLIC ``user<TAB>item`` files: for each item,
    the number of distinct users holding it (a user's repeated lines count once).

    Returns ``(counts, malformed)``: ``{item: users}`` and the number of malformed lines
    skipped (no tab, empty user id, invalid UTF-8), as every reader of the library parses
    lines. Holds the distinct (user, item) pairs in memory. The files must be public
    data, not the private input: the counts then cost no privacy budget.

    Args:
      paths: the files (``.gz``/``.bz2`` decompressed).
      opener: ``path -> binary file object`` (default: a local file).
    """
    seen = set()
    counts: Dict[str, int] = {}
    malformed = 0
    for path in paths:
        for chunk in iter_line_counts(path, opener=opener):
            for line, n in chunk.items():
                pair = parse_line(line)
                if pair is None:
                    malformed += n
                elif pair not in seen:
                    seen.add(pair)
                    counts[pair[1]] = counts.get(pair[1], 0) + 1
    return counts, malformed


def format_public_counts(counts: Mapping[str, int]) -> Iterable[str]:
    """``item<TAB>count`` lines (with their newline) of ``counts``, the largest count
    first (ties by item): the file ``read_public_counts`` reads back."""
    for item, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        yield f"{item}\t{n}\n"


def parse_public_count_line(raw, lineno: int = 0):
    """``b'item<TAB>count'`` → ``(item, count)``; ``(None, 0)`` for a blank line."""
    line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    line = line.rstrip("\r\n")
    if not line.strip():
        return None, 0
    item, tab, value = line.rpartition("\t")
    if not tab:
        raise ValueError(f"public counts line {lineno}: expected item<TAB>count, got {line[:80]!r}")
    try:
        count = int(value)
    except ValueError:
        try:
            count = float(value)
        except ValueError:
            count = float("nan")
    if not (count >= 0 and math.isfinite(count)):
        raise ValueError(f"public counts line {lineno}: count must be a number >= 0, "
                         f"got {value[:40]!r}")
    return item, count
