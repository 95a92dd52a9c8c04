"""An empirical privacy auditor: a lower bound on ε measured the way an attacker would.

Usage::

    python -m beam_dpsu.audit --mechanism NAME [--epsilon E] [--delta D] [--rho R]
        [--max-items-per-user N] [--alpha A] [--rounds I] [--ratio r]
        [--public-counts PATH] [--tie-break T] [--eta H]
        [--variant cascade-free|published --allow-unproven] [--trials N] [--confidence C]
        [--scenarios unique,near-cutoff,pile,cascade] [--positions first,middle,last]

(``python benchmarks/audit_variants.py ... --broken VARIANT`` audits a
deliberately broken variant.)

prints one JSON object with ``mechanism``, ``claimed_epsilon``,
``claimed_delta``, ``epsilon_lower_bound``, ``trials``, ``event`` and the
details. Bad parameters exit with status 2 and a one-line message.

How it works
------------
For a neighbouring pair ``D`` and ``D' = D + one canary user``
(``docs/mechanisms.md`` section 1: add/remove one user), the mechanism is run ``trials``
times on each dataset with ``run_local``: the same sampling, histogram,
sequential-policy and release functions the Beam transforms call, not a copy.
Every run gets fresh OS randomness (``RunKey.fresh`` material). For each
distinguishing event ``E`` fixed before any run ("a canary-only item is
released", "item u is released", "at least k canary items are released") the
auditor counts how often ``E`` happened on each side, and for the four
candidates (``D'`` against ``D`` and ``D`` against ``D'``, for ``E`` and for
its complement) computes ::

    ε ≥ log((p_lo(A, E) − δ) / p_hi(B, E))

with one-sided Clopper–Pearson bounds. (ε, δ)-DP says ``P[M(A) ∈ E] ≤
e^ε·P[M(B) ∈ E] + δ`` for every event and both orders, so if every interval
holds the reported bound is at most the true ε. All intervals of one audit
hold together with probability ≥ ``confidence``: the auditor splits
``1 − confidence`` evenly (Bonferroni) over the 4 one-sided bounds of every
event of every scenario it runs. It reports the largest bound (floored at 0)
and the event that gave it.

Scenarios (each a neighbouring pair built from the mechanism's calibration)
--------------------------------------------------------------------------
* ``unique``: the canary holds many items nobody else has (Δ0 of them, or 64
  without Δ0). On ``D`` those items have weight 0 and must never be released;
  on ``D'`` "any of them is released" may happen with probability ≤ δ. Tests
  the threshold, the per-item δ split and the zero-weight rule.
* ``near-cutoff``: background users push two items to just below the cutoff
  Γ (sequential policies) or to the threshold T (histogram mechanisms); the
  canary holds them plus two items of its own. Tests the policies'
  contraction and the ε part of the calibration.
* ``pile``: an adversarial background histogram: N users each hold the two
  items ``pile-a`` and ``pile-b`` (N just below Γ − 1), and the canary holds
  ``pile-b`` only. A policy that ranks items by the current histogram
  (Gopi et al.'s closest-to-cutoff greedy) lets the canary, placed first,
  steer every later user to ``pile-b``; a private policy does not.

For the sequential policies the canary is placed ``first``, in the
``middle`` and ``last`` in the user order. The order is a keyed hash of the
user ids (``sequential.user_sort_key``); to place the canary the auditor pins
the ``'order'`` subkey of the run key for one scenario (``PinnedOrderKey``)
and picks user ids that put the canary where it wants. Every other subkey
(sampling, noise, item order) is fresh OS randomness in every run. This is a
valid test, and a stronger one than a random order: the privacy proofs of the
sequential policies (ℓ1/ℓ2-descent, the cascade-free greedy) hold for every
order that does not depend on the data — because these policies are also
contractive and satisfy the support condition (only the added user's own kept
items can become non-zero; ``docs/gw.md``), not because of the order alone —
so the mechanism must be (ε, δ)-DP conditionally on each order; the histogram
mechanisms do not use the order at all. The published GW (``variant=
'published'``) lacks the support condition, and the ``cascade`` scenario shows
it is not private:

* ``cascade`` (sequential policies; not in the default plan): setup users,
  then the canary, then "converter" users under a pinned order; with the
  canary present the published greedy diverts the converters onto about 30
  items the canary does not hold (``cascade_scenario``). ``cascade_configs``
  gives the published and the cascade-free GW (and, with
  ``write_cascade_public_counts``, GW-KT) the same cutoff so all are audited
  on the same pair: the published variants fail, the cascade-free ones pass.

* ``indirect`` (adaptive weighting; in its default plan): the canary pushes items over
  the estimate's heavy level, and other users would move their weight onto one item j
  were the heavy items read from the exact weights (``indirect_scenario``,
  ``docs/mechanisms.md`` section 11.1); the ``exact-weight-buckets`` variant fails it.

Deliberately broken variants (``benchmarks/audit_variants.py``, for the tests
of the auditor's power; never use them for anything else) each differ from a
real mechanism in one bug only; ``main(argv, broken=...)`` accepts
``--broken VARIANT`` only when given them.

Modes: the CI tests use a fast mode (``FAST_TRIALS`` runs per dataset and
scenario for the real mechanisms, the counts of
``audit_variants.BROKEN_CONFIGS`` for the broken ones, confidence ``1 − 1e-8``
per audit); ``benchmarks/audit_all.py``
runs the thorough mode (``THOROUGH_TRIALS``) and writes ``docs/audit.md``.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
import secrets
import time
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from scipy.stats import beta as _beta

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.data.contribution import canonical_counts, canonical_id, canonical_per_user
from beam_dpsu.dp.mechanisms.base import released_items, run_local
from beam_dpsu.dp.mechanisms import Mechanism
from beam_dpsu.dp.mechanisms.adaptive import HEAVY_BUCKET
from beam_dpsu.dp.randomness.noise import RunKey, encode_value, keyed_hash64

__all__ = ["DEFAULT_CONFIDENCE", "CI_CONFIDENCE", "FAST_TRIALS", "THOROUGH_TRIALS", "SCENARIOS",
           "ALL_SCENARIOS", "POSITIONS", "MAX_BACKGROUND_PER_ITEM", "UNIQUE_ITEMS_WITHOUT_MAX",
           "clopper_pearson", "epsilon_from_bounds", "Event", "best_bound", "PinnedOrderKey",
           "PlacementError", "PLACEMENT_TRIES_PER_USER", "PLACEMENT_KEYS", "place_canary",
           "Scenario", "Profile", "profile", "build_scenario", "MAX_CASCADE_CONVERTERS",
           "cascade_scenario", "indirect_scenario", "CASCADE_CUTOFF", "CASCADE_TRIALS", "cascade_configs",
           "cascade_public_counts", "write_cascade_public_counts", "default_plan", "count_events",
           "audit"]


DEFAULT_CONFIDENCE = 0.95
CI_CONFIDENCE = 1.0 - 1e-8
FAST_TRIALS = 1000
THOROUGH_TRIALS = 100_000
SCENARIOS = ("unique", "near-cutoff", "pile")
#: Every scenario ``build_scenario`` knows; ``cascade`` (sequential policies only)
#: is not in the default plan: it needs a cutoff with a suitable fractional part,
#: which ``cascade_configs`` arranges.
ALL_SCENARIOS = SCENARIOS + ("cascade", "indirect")
POSITIONS = ("first", "middle", "last")
MAX_BACKGROUND_PER_ITEM = 200  # caps the users a scenario builds (tiny ε, huge Δ0)
UNIQUE_ITEMS_WITHOUT_MAX = 64  # canary-only items for mechanisms without Δ0


# ---------------------------------------------------------------------------
# Statistics.
# ---------------------------------------------------------------------------

def clopper_pearson(k: int, n: int, alpha: float) -> Tuple[float, float]:
    """One-sided Clopper–Pearson bounds ``(lo, hi)`` for a binomial proportion.

    ``P[p < lo] ≤ alpha`` and ``P[p > hi] ≤ alpha`` separately (each bound is
    exact one-sided at level ``alpha``).

    Args:
      k: successes, 0 ≤ k ≤ n. n: trials ≥ 1. alpha: in (0, 1).
    """
    if not (0 <= k <= n and n >= 1 and 0 < alpha < 1):
        raise ValueError(f"need 0 <= k <= n, n >= 1, 0 < alpha < 1; got {k}, {n}, {alpha}")
    lo = 0.0 if k == 0 else float(_beta.ppf(alpha, k, n - k + 1))
    hi = 1.0 if k == n else float(_beta.isf(alpha, k + 1, n - k))
    return lo, hi


def epsilon_from_bounds(p_lo: float, q_hi: float, delta: float) -> float:
    """``log((p_lo − δ)/q_hi)``, the ε that ``p ≤ e^ε·q + δ`` needs; 0 when ≤ 0."""
    num = p_lo - delta
    if num <= 0 or q_hi <= 0:
        return 0.0
    return max(0.0, math.log(num / q_hi))


@dataclasses.dataclass(frozen=True)
class Event:
    """"At least ``k`` of ``items`` are released", fixed before any run."""
    name: str
    items: FrozenSet[Any]
    k: int = 1

    def occurs(self, released) -> bool:
        if self.k == 1:
            return not self.items.isdisjoint(released)
        return len(self.items.intersection(released)) >= self.k


def best_bound(hits_d: Sequence[int], hits_dp: Sequence[int], trials: int,
               events: Sequence[Event], delta: float, alpha: float) -> Dict[str, Any]:
    """The largest ε lower bound over the events, their complements and both orders.

    Args:
      hits_d, hits_dp: per event, the runs (of ``trials``) in which it occurred
        on ``D`` and on ``D'``.
      alpha: the level of each one-sided Clopper–Pearson bound.
    Returns:
      ``{"epsilon_lower_bound", "event", "direction", "p_d", "p_d_prime"}``.
    """
    best = {"epsilon_lower_bound": 0.0, "event": None, "direction": None,
            "p_d": None, "p_d_prime": None}
    for ev, k0, k1 in zip(events, hits_d, hits_dp):
        lo0, hi0 = clopper_pearson(int(k0), trials, alpha)
        lo1, hi1 = clopper_pearson(int(k1), trials, alpha)
        candidates = [
            (epsilon_from_bounds(lo1, hi0, delta), ev.name, "D' vs D"),
            (epsilon_from_bounds(lo0, hi1, delta), ev.name, "D vs D'"),
            (epsilon_from_bounds(1 - hi1, 1 - lo0, delta), "not: " + ev.name, "D' vs D"),
            (epsilon_from_bounds(1 - hi0, 1 - lo1, delta), "not: " + ev.name, "D vs D'"),
        ]
        for eps, name, direction in candidates:
            if eps > best["epsilon_lower_bound"] or best["event"] is None:
                best = {"epsilon_lower_bound": eps, "event": name, "direction": direction,
                        "p_d": k0 / trials, "p_d_prime": k1 / trials}
    return best


# ---------------------------------------------------------------------------
# Pinned user order.
# ---------------------------------------------------------------------------

class PinnedOrderKey(RunKey):
    """A fresh OS-random run key whose ``'order'`` subkey is fixed.

    Every other purpose (sampling, noise, item order) derives from 32 fresh
    bytes of ``secrets``; only the user order is pinned, so the auditor knows
    where the canary is in it. See the module docstring for why this is a
    valid (conditional) test.
    """

    __slots__ = ("_order",)

    def __init__(self, order_subkey: bytes):
        super().__init__(secrets.token_bytes(32), seeded=False)
        self._order = bytes(order_subkey)

    def subkey(self, purpose: str) -> bytes:
        if purpose == "order":
            return self._order
        return super().subkey(purpose)


def _sort_key(order_key: bytes, user: Any):
    try:
        from beam_dpsu.dp.data.sequential import user_sort_key
    except ImportError:  # pragma: no cover - the sequential policies are optional
        encoded = encode_value(user)
        return keyed_hash64(order_key, encoded), encoded
    return user_sort_key(order_key, user)


class PlacementError(RuntimeError):
    """No canary id landed at the wanted place in the user order within the tries allowed."""


#: Canary ids tried per order key, per background user (plus one). The wanted
#: slot of the order is a gap G ~ Beta(1, n) of the unit interval, so one key
#: fails with probability E[(1 - G)^(c(n+1))] = n / (n + c(n+1)) < 1/(c+1).
PLACEMENT_TRIES_PER_USER = 64
#: Fresh order keys tried before giving up: with the bound above, all of them
#: fail with probability below 65^-64 (about 1e-116).
PLACEMENT_KEYS = 64


def place_canary(order_key: bytes, background_users: Sequence[Any], position: str,
                 prefix: str = "canary", max_tries: Optional[int] = None) -> str:
    """A canary user id whose place among ``background_users`` under ``order_key``
    is ``position`` (``'first'``, ``'middle'`` or ``'last'``).

    Tries ``prefix-0``, ``prefix-1``, ... up to ``max_tries`` ids (default
    ``PLACEMENT_TRIES_PER_USER · (n + 1)``) and raises :class:`PlacementError`
    when none lands there. That happens when the key leaves the wanted slot
    very narrow (one background user with a tiny hash leaves almost no room
    before it): it is a property of the key, so the caller should draw another
    key rather than try longer (:func:`build_scenario` does).
    """
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    keys = sorted(_sort_key(order_key, u) for u in background_users)
    n = len(keys)
    want = {"first": 0, "middle": n // 2, "last": n}[position]
    if max_tries is None:
        max_tries = PLACEMENT_TRIES_PER_USER * (n + 1)
    taken = set(background_users)
    for j in range(max_tries):
        cid = f"{prefix}-{j}"
        if cid in taken:
            continue
        if bisect.bisect_left(keys, _sort_key(order_key, cid)) == want:
            return cid
    raise PlacementError(
        f"no canary id among {max_tries} tries lands {position} of {n} users under this "
        "order key; use another key")


# ---------------------------------------------------------------------------
# Scenarios.
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Scenario:
    """A neighbouring pair: ``background`` (D) and ``background + canary`` (D')."""
    name: str
    position: str
    background: Dict[Any, Dict[Any, int]]
    canary_id: Any
    canary: Dict[Any, int]
    events: List[Event]
    order_key: bytes

    def datasets(self):
        """``(D, D')``, with canonical user ids and items (``contribution.canonical_id``:
        a refused type raises ``IdTypeError``). Raises ValueError when the canary id is
        a user of ``background`` (D' would not be D plus one user)."""
        background = canonical_per_user(self.background)
        canary_id = canonical_id(self.canary_id, "user id")
        if canary_id in background:
            raise ValueError("the canary's user id is a user of the background dataset: "
                             "D' would not be D plus one user")
        d_prime = dict(background)
        d_prime[canary_id] = dict(canonical_counts(self.canary))
        return background, d_prime

    @property
    def label(self) -> str:
        return f"{self.name}/{self.position}"


@dataclasses.dataclass(frozen=True)
class Profile:
    """What the scenarios need to know about a mechanism's calibration."""
    level: float          # weight at which an item is released with probability ≈ 1/2 (T)
    cutoff: Optional[float]  # Γ of a sequential policy, else None
    max_items: Optional[int]
    sequential: bool
    heavy_level: Optional[float] = None  # adaptive weighting: the estimate's heavy level
    estimate_share: Optional[float] = None


def profile(mechanism: Mechanism) -> Profile:
    """Reads T (or the truncated geometric's 50% count), Γ and Δ0 of a mechanism."""
    r = mechanism.rounds[-1]
    level = r.threshold
    if level is None:  # truncated geometric: the smallest count kept w.p. >= 1/2
        rule = mechanism.release_rule(RunKey.fresh())
        n = 1
        while n < 10_000 and rule.probability(n) < 0.5:
            n += 1
        level = float(n)
    cutoff = getattr(mechanism, "cutoff", None)
    sequential = hasattr(mechanism, "policy")
    levels = getattr(mechanism, "levels", None)
    heavy = None if levels is None else float(levels[HEAVY_BUCKET - 1])
    return Profile(float(level), None if cutoff is None or not sequential else float(cutoff),
                   mechanism.max_items, sequential, heavy,
                   getattr(mechanism, "estimate_share", None))


def _count(x: float) -> int:
    return int(min(MAX_BACKGROUND_PER_ITEM, max(1, x)))


def build_scenario(mechanism: Mechanism, name: str, position: str = "first",
                   order_key: Optional[bytes] = None) -> Scenario:
    """The neighbouring pair ``name`` for this mechanism, canary at ``position``."""
    if name not in ALL_SCENARIOS:
        raise ValueError(f"scenario must be one of {ALL_SCENARIOS}, got {name!r}")
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    prof = profile(mechanism)
    if name == "cascade":
        return cascade_scenario(prof, order_key)
    if name == "indirect":
        background, canary, events = indirect_scenario(prof)
        if order_key is None:
            order_key = secrets.token_bytes(32)
        return Scenario(name, position, background, "indirect-canary", canary, events,
                        order_key)
    background: Dict[Any, Dict[Any, int]] = {}
    if name == "unique":
        k = prof.max_items if prof.max_items else UNIQUE_ITEMS_WITHOUT_MAX
        for i in range(8):
            background[f"bg-{i}"] = {"bg-a": 1, "bg-b": 1}
        canary = {f"canary-item-{j}": 1 for j in range(k)}
        own = frozenset(canary)
        events = [Event("a canary-only item is released", own),
                  Event("at least 2 canary-only items are released", own, 2),
                  Event("at least 3 canary-only items are released", own, 3),
                  Event("canary-item-0 is released", frozenset({"canary-item-0"})),
                  Event("bg-a is released", frozenset({"bg-a"}))]
    elif name == "near-cutoff":
        # Just below Γ for the policies (within 1 of it); at T otherwise.
        level = math.floor(prof.cutoff) if prof.sequential else round(prof.level)
        n = _count(level)
        shared = ["near-0", "near-1"]
        for s in shared:
            for i in range(n):
                background[f"{s}-u{i}"] = {s: 1}
        canary = {"near-0": 1, "near-1": 1, "canary-item-0": 1, "canary-item-1": 1}
        events = [Event("near-0 is released", frozenset({"near-0"})),
                  Event("near-1 is released", frozenset({"near-1"})),
                  Event("near-0 and near-1 are released", frozenset(shared), 2),
                  Event("a canary-only item is released",
                        frozenset({"canary-item-0", "canary-item-1"}))]
    else:  # pile
        n = _count(math.floor(prof.cutoff) - 1 if prof.sequential else math.ceil(prof.level))
        for i in range(max(2, n)):
            background[f"pile-u{i}"] = {"pile-a": 1, "pile-b": 1}
        canary = {"pile-b": 1}
        events = [Event("pile-a is released", frozenset({"pile-a"})),
                  Event("pile-b is released", frozenset({"pile-b"})),
                  Event("pile-a and pile-b are released", frozenset({"pile-a", "pile-b"}), 2)]
    users = list(background)
    if order_key is not None:
        canary_id = place_canary(order_key, users, position)
    else:
        for attempt in range(PLACEMENT_KEYS):
            order_key = secrets.token_bytes(32)
            try:
                canary_id = place_canary(order_key, users, position)
                break
            except PlacementError:
                if attempt == PLACEMENT_KEYS - 1:  # pragma: no cover (prob. < 1e-116)
                    raise
    return Scenario(name, position, background, canary_id, canary, events, order_key)


def indirect_scenario(prof: Profile):
    """Section 11.1 of ``docs/mechanisms.md`` as a neighbouring pair for adaptive weighting:
    ``(background, canary, events)``.

    The canary holds k = Δ0 − 1 items x-i. Each x-i's basic weight sits half the canary's
    weight 1/√k below the estimate's heavy level (``makers`` users hold x-i alone, a
    ``tuner`` user with fillers adds the fraction), so the canary pushes every x-i over it.
    ``sharers`` users hold all the x-i and one item j, their only other item: were the
    buckets read from the *exact* weights, the canary would make every x-i heavy and the
    sharers would move their weight onto j, whose statistic would cross T only with the
    canary (the ``exact-weight-buckets`` variant of ``benchmarks/audit_variants.py``).
    With the DP estimate the x-i's buckets are about as likely heavy without the canary.

    Events: "j is released", "x-0 is released", "every x-i is released".
    """
    if prof.heavy_level is None or not prof.max_items or prof.max_items < 2:
        raise ValueError("the indirect scenario applies to adaptive weighting with Δ0 >= 2")
    k = prof.max_items - 1
    b_sharer, b_canary = 1.0 / math.sqrt(k + 1), 1.0 / math.sqrt(k)
    s = prof.estimate_share
    ell = math.sqrt(1.0 - k * (b_sharer / 2) ** 2)   # a sharer's weight on j, x-i heavy
    sharers = _count(prof.level / ((b_sharer + s * b_sharer + (1 - s) * ell) / 2))
    target = prof.heavy_level - b_canary / 2 - sharers * b_sharer
    if target < 0:
        raise ValueError("the indirect scenario needs the heavy level above the sharers' weight")
    makers = int(math.floor(target))
    rest = target - makers
    fillers = int(round(1.0 / rest ** 2 - 1)) if rest > 0.05 else 0
    background: Dict[Any, Dict[Any, int]] = {}
    for h in range(sharers):
        background[f"sharer-{h}"] = dict({f"x-{i}": 1 for i in range(k)}, j=1)
    for i in range(k):
        for h in range(_count(makers) if makers else 0):
            background[f"maker-{i}-{h}"] = {f"x-{i}": 1}
        if 0 < fillers < prof.max_items:
            background[f"tuner-{i}"] = dict({f"filler-{i}-{f}": 1 for f in range(fillers)},
                                            **{f"x-{i}": 1})
    canary = {f"x-{i}": 1 for i in range(k)}
    xs = frozenset(canary)
    events = [Event("j is released", frozenset({"j"})),
              Event("x-0 is released", frozenset({"x-0"})),
              Event("every x-i is released", xs, len(xs))]
    return background, canary, events


#: The cascade scenario builds at most this many converter users.
MAX_CASCADE_CONVERTERS = 200


def cascade_scenario(prof: Profile, order_key: Optional[bytes] = None) -> Scenario:
    """The cascade of the published GW as a neighbouring pair (``docs/gw.md`` section 2).

    With Γ = M − s (M = ⌈Γ⌉, 0 < s < 1), integer "setup" users (each holds one
    item and adds exactly 1 to it) raise a private item ``f-j`` of every
    converter j to M − 1 (gap 1 − s) and the shared item ``e`` to M − 2 (gap
    1 + (1 − s)). Then the canary x (holding ``e`` only) and then N converters,
    converter j holding ``{f-j: 3, e: 2, c-j: 1}`` (walk order f-j, e, c-j
    under any tie-break; for GW-KT with ``cascade_public_counts``, whose
    public counts rank them in the same order). The user order is pinned:
    setup users, then x, then the converters (user ids are assigned to roles
    by their rank under the order key, so every key works).

    Without x each converter closes f-j's gap (1 − s) and puts its remaining s
    on ``e``, whose gap stays above s for all N converters: no ``c-j`` is ever
    touched, so with the published greedy no ``c-j`` can be released. With x,
    ``e`` has 1 less gap; after about 1/s converters it is full, and every later
    converter skips it and puts s on its own ``c-j``: about (N − 1/s) items
    that x does not hold become non-zero (total weight < 1, the ℓ1 bound holds).
    The published threshold accounts for one such item, so the published GW
    fails the audit when s is small (``cascade_configs``: s = 1/32, about 30
    items). The cascade-free GW gives every ``c-j`` a positive weight in both
    datasets (step 1, Δ0 ≥ 3) and must pass. The same holds for GW-KT (the
    walk order is the same; every user holds at most 3 < Δ0 items, so any
    ``kt_selection`` keeps them all).

    Events: "a cascade item c-j is released", "at least 2 are".
    """
    if not prof.sequential or prof.cutoff is None:
        raise ValueError("the cascade scenario applies to the sequential policies only")
    cutoff = prof.cutoff
    m = math.ceil(cutoff)
    s = m - cutoff                      # the spill per converter
    if not (m >= 3 and 1.0 / MAX_CASCADE_CONVERTERS * 2 <= s < 0.5):
        raise ValueError(f"the cascade scenario needs a cutoff >= 2 whose fractional part is "
                         f"in (0.5, {1 - 2 / MAX_CASCADE_CONVERTERS:g}], got {cutoff!r}")
    # Without x converter j sees e's gap (2 − s) − (j − 1)·s; it must stay above
    # s (with a margin of s) for every j ≤ N: N = ⌊2/s − 1.5⌋.
    n_conv = int(math.floor(2.0 / s - 1.5))
    roles: List[Tuple[str, Dict[Any, int]]] = []
    for j in range(n_conv):
        roles += [("setup", {f"f-{j}": 1})] * (m - 1)
    roles += [("setup", {"e": 1})] * (m - 2)
    n_setup = len(roles)
    roles.append(("canary", {"e": 1}))
    roles += [("converter", {f"f-{j}": 3, "e": 2, f"c-{j}": 1}) for j in range(n_conv)]
    if order_key is None:
        order_key = secrets.token_bytes(32)
    ids = sorted((f"cascade-u{i}" for i in range(len(roles))),
                 key=lambda u: _sort_key(order_key, u))
    background: Dict[Any, Dict[Any, int]] = {}
    canary_id, canary = None, None
    for uid, (role, counts) in zip(ids, roles):
        if role == "canary":
            canary_id, canary = uid, counts
        else:
            background[uid] = dict(counts)
    assert ids.index(canary_id) == n_setup
    cascade_items = frozenset(f"c-{j}" for j in range(n_conv))
    events = [Event("a cascade item is released", cascade_items),
              Event("at least 2 cascade items are released", cascade_items, 2)]
    return Scenario("cascade", "middle", background, canary_id, canary, events, order_key)


# The cascade audit (CI and benchmarks/audit_all.py): ε = 1, δ = 0.1, Γ = 4 − 1/32
# for both GW variants (α chosen per variant), Δ0 = 4 for the cascade-free one.
CASCADE_EPSILON, CASCADE_DELTA, CASCADE_MAX_ITEMS = 1.0, 0.1, 4
CASCADE_CUTOFF = 4.0 - 1.0 / 32
CASCADE_TRIALS = 400


def cascade_configs(public_counts: Optional[str] = None) -> List[Tuple[str, Dict[str, Any]]]:
    """``(name, params)`` of the published and the cascade-free GW with the same Γ.

    All get Γ = ``CASCADE_CUTOFF`` through their α (α = ε·(Γ − T)), so that
    ``cascade_scenario`` builds the same neighbouring pair for all.

    Args:
      public_counts: None (GW only), or the path of a file written by
        ``write_cascade_public_counts``: then the published and the
        cascade-free GW-KT follow (same Γ, same pair).
    """
    e, d = CASCADE_EPSILON, CASCADE_DELTA
    t_pub = cal.gw_threshold(e, d)
    t_cf = cal.gw_cascade_free_threshold(e, d, CASCADE_MAX_ITEMS)
    published = {"epsilon": e, "delta": d, "alpha": e * (CASCADE_CUTOFF - t_pub),
                 "variant": "published", "allow_unproven": True}
    free = {"epsilon": e, "delta": d, "alpha": e * (CASCADE_CUTOFF - t_cf),
            "max_items": CASCADE_MAX_ITEMS}
    out = [("gw", published), ("gw", free)]
    if public_counts is not None:
        # κ fixed (no calibration share): the scenario is built for this Γ, which the
        # share's smaller ε would move; the calibrated default is audited elsewhere
        out += [("gw-kt", dict(published, public_counts=public_counts)),
                ("gw-kt", dict(free, public_counts=public_counts, calibration_share=0.0))]
    return out


def cascade_public_counts() -> Dict[str, int]:
    """Public counts for GW-KT in the cascade scenario: f-j 3, e 2, c-j 1 (as the converters'
    own counts), so that GW-KT walks a converter's items in GW's order f-j, e, c-j."""
    out = {"e": 2}
    for j in range(MAX_CASCADE_CONVERTERS):
        out[f"f-{j}"] = 3
        out[f"c-{j}"] = 1
    return out


def write_cascade_public_counts(path: str) -> str:
    """Writes ``cascade_public_counts`` as ``item<TAB>count`` lines to ``path``; returns it."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{item}\t{count}\n" for item, count in cascade_public_counts().items())
    return path


def default_plan(mechanism: Mechanism, scenarios: Sequence[str] = SCENARIOS,
                 positions: Optional[Sequence[str]] = None) -> List[Tuple[str, str]]:
    """(scenario, position) pairs: all positions for sequential policies, 'first' otherwise."""
    prof = profile(mechanism)
    if positions is None:
        positions = POSITIONS if prof.sequential else ("first",)
    if prof.heavy_level is not None and tuple(scenarios) == SCENARIOS:
        scenarios = tuple(scenarios) + ("indirect",)  # adaptive weighting's adversary
    return [(s, p) for s in scenarios
            for p in (("middle",) if s == "cascade" else positions)]  # cascade: order built in


# ---------------------------------------------------------------------------
# Running.
# ---------------------------------------------------------------------------

def count_events(mechanism: Mechanism, per_user: Mapping[Any, Mapping[Any, int]],
                 events: Sequence[Event], trials: int, order_key: bytes) -> List[int]:
    """Runs ``run_local`` ``trials`` times (fresh keys); counts each event."""
    hits = [0] * len(events)
    for _ in range(trials):
        released = released_items(mechanism,
                                  run_local(per_user, mechanism, PinnedOrderKey(order_key)))
        for j, ev in enumerate(events):
            if ev.occurs(released):
                hits[j] += 1
    return hits


def audit(mechanism: Mechanism, trials: int = FAST_TRIALS,
          confidence: float = DEFAULT_CONFIDENCE,
          plan: Optional[Sequence[Tuple[str, str]]] = None,
          scenarios: Optional[Sequence[Scenario]] = None,
          name: Optional[str] = None) -> Dict[str, Any]:
    """Audits one mechanism; returns the JSON-ready report.

    Args:
      mechanism: any calibrated ``Mechanism`` that ``run_local`` can run.
      trials: runs per dataset (``D`` and ``D'``) and scenario.
      confidence: all Clopper–Pearson bounds of this audit hold together with
        this probability (Bonferroni over 4 bounds per event).
      plan: ``(scenario, position)`` pairs (default ``default_plan``);
        ignored when ``scenarios`` is given.
      scenarios: ready-built ``Scenario`` objects.
      name: the mechanism name to report (default ``mechanism.name``).
    Returns:
      A dict with ``mechanism``, ``claimed_epsilon``, ``claimed_delta``,
      ``epsilon_lower_bound``, ``trials``, ``event`` (and its scenario,
      position, direction, empirical probabilities), ``passed`` and the result
      of every scenario.
    """
    cal.check_positive_int(trials, "trials")
    if not (0 < confidence < 1):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if scenarios is None:
        plan = default_plan(mechanism) if plan is None else plan
        scenarios = [build_scenario(mechanism, s, p) for s, p in plan]
    g = mechanism.guarantee
    delta = float(g.delta)
    bounds = 4 * sum(len(s.events) for s in scenarios)
    alpha = (1.0 - confidence) / bounds
    start = time.perf_counter()
    results = []
    best: Dict[str, Any] = {"epsilon_lower_bound": -1.0}
    for sc in scenarios:
        d, d_prime = sc.datasets()
        hits_d = count_events(mechanism, d, sc.events, trials, sc.order_key)
        hits_dp = count_events(mechanism, d_prime, sc.events, trials, sc.order_key)
        b = best_bound(hits_d, hits_dp, trials, sc.events, delta, alpha)
        b.update({"scenario": sc.name, "position": sc.position,
                  "users_d": len(d), "hits_d": hits_d, "hits_d_prime": hits_dp})
        results.append(b)
        if b["epsilon_lower_bound"] > best["epsilon_lower_bound"]:
            best = b
    seconds = time.perf_counter() - start
    runs = 2 * trials * len(scenarios)
    lb = best["epsilon_lower_bound"]
    return {
        "mechanism": name or mechanism.name,
        "claimed_epsilon": float(g.epsilon),
        "claimed_delta": delta,
        "epsilon_lower_bound": lb,
        "trials": trials,
        "event": best["event"],
        "scenario": best["scenario"],
        "position": best["position"],
        "direction": best["direction"],
        "p_d": best["p_d"],
        "p_d_prime": best["p_d_prime"],
        "passed": lb <= float(g.epsilon),
        "confidence": confidence,
        "one_sided_bounds": bounds,
        "runs": runs,
        "seconds": round(seconds, 3),
        "runs_per_second": round(runs / seconds, 1) if seconds > 0 else None,
        "per_scenario": [{k: r[k] for k in ("scenario", "position", "epsilon_lower_bound",
                                            "event", "direction", "p_d", "p_d_prime",
                                            "users_d")} for r in results],
    }
