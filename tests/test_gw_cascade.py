"""The support condition and contractivity of every sequential policy.

See docs/mechanisms.md section 4 and docs/gw.md section 3.

For fuzzed neighbouring pairs (D, D ∪ {x}) under pinned user orders (x at
every position), the finished histograms H (of D) and H′ (of D ∪ {x}) must
satisfy, up to a few units in the last place:

* H ≤ H′ coordinate-wise;
* ‖H′ − H‖₁ ≤ 1 (‖H′ − H‖₂ ≤ 1 for ℓ2-descent);
* supp(H′) \\ supp(H) ⊆ K_x, the added user's kept items (for the descents,
  x's Δ0-sampled items; for the cascade-free greedy, the first Δ0 items of
  x's walk order, or with GW-KT's ``selection='front'`` the Δ0 walk items past
  x's predicted front, which depend on x's position in the keyed order).

The published greedy (GW as Carvalho et al.) satisfies the first two but not
the third (the "cascade", ``docs/gw.md``): the support check must catch it on
the constructed pair below and on some fuzzed pairs (a positive control: if
the check were broken, these tests would fail).

Everything here is deterministic (seeded test data, seeded test keys): no
statistical test, so no false-failure probability.
"""
import zlib

import numpy as np
import pytest

from beam_dpsu.dp.data import sequential as P
from beam_dpsu.dp.randomness.noise import RunKey

RK = RunKey.from_test_seed(14)
ITEM_KEY = RK.subkey("item-order")
SAMPLE_KEY = RK.subkey("sample/0")
ULPS = 1e-12        # relative slack for float rounding (a few ulps of values ≤ 12)


def make_policy(kind, cutoff, max_items, eta=0.05):
    if kind == "l1-descent":
        return P.L1DescentPolicy(cutoff, max_items, SAMPLE_KEY, ITEM_KEY)
    if kind == "l2-descent":
        return P.L2DescentPolicy(cutoff, max_items, SAMPLE_KEY, ITEM_KEY)
    if kind == "cascade-free":
        return P.CascadeFreeGreedyPolicy(cutoff, ITEM_KEY, max_items, eta)
    if kind == "cascade-free-public":
        return P.CascadeFreeGreedyPolicy(cutoff, ITEM_KEY, max_items, eta,
                                         use_public_counts=True)
    if kind == "published":
        return P.GreedyPolicy(cutoff, ITEM_KEY)
    if kind == "published-public":
        return P.GreedyPolicy(cutoff, ITEM_KEY, use_public_counts=True)
    raise AssertionError(kind)


def run_pinned(policy, users, public=None):
    """Applies ``users`` (a list of (user id, counts)) in exactly this order."""
    hist = {}
    for user, counts in users:
        ids, _ = policy.prepare(user, counts, public)
        if ids:
            policy.update(hist, ids)
    return hist


def neighbour_check(policy, users, x, pos, public=None):
    """(H ≤ H′ holds, distance in the policy's norm, new items outside K_x)."""
    h = run_pinned(policy, users, public)
    hp = run_pinned(policy, users[:pos] + [x] + users[pos:], public)
    kx = set(policy.prepare(x[0], x[1], public)[0])
    keys = set(h) | set(hp)
    diff = np.array([hp.get(k, 0.0) - h.get(k, 0.0) for k in keys])
    slack = ULPS * max(1.0, policy.cutoff)
    monotone = bool((diff >= -slack).all())
    dist = float(np.linalg.norm(diff, ord=2 if policy.norm == "l2" else 1))
    new = {k for k, w in hp.items() if w > 0} - {k for k, w in h.items() if w > 0}
    return monotone, dist, new - kx


KINDS = ["l1-descent", "l2-descent", "cascade-free", "cascade-free-public",
         "cascade-free-public-front", "published", "published-public"]
PUBLIC = {f"i{j}": (j * 7) % 5 for j in range(12)}
# GW-KT's 'front' selection: the order keys (the users' positions p_i) and (κ, M)
# cycle over the fuzzed pairs. With public counts <= 4 and Γ <= 4.5, κ must be
# small for the front (public count >= κ·Γ/p_i) to skip anything.
ORDER_KEYS = [RunKey.from_test_seed(s).subkey("order") for s in range(8)]
FRONT_SETTINGS = [(0.02, 0), (0.1, 1), (0.3, 0), (1.0, 2), (0.05, 3)]


def front_policy(cutoff, max_items, index, eta=0.05):
    scale, margin = FRONT_SETTINGS[index % len(FRONT_SETTINGS)]
    return P.CascadeFreeGreedyPolicy(cutoff, ITEM_KEY, max_items, eta, use_public_counts=True,
                                     selection="front",
                                     order_key=ORDER_KEYS[index % len(ORDER_KEYS)],
                                     front_scale=scale, front_margin=margin)


def fuzz_pairs(seed, n):
    rng = np.random.default_rng(seed)   # test data only
    for _ in range(n):
        n_items = int(rng.integers(2, 10))
        cutoff = float(rng.choice([0.7, 1.0, 1.5, 2.0, 3.0, 4.5]))
        max_items = int(rng.integers(1, 6))

        def user():
            k = int(rng.integers(1, n_items + 1))
            items = rng.choice(n_items, k, replace=False).tolist()
            return {f"i{i}": int(rng.integers(1, 4)) for i in items}

        users = [(f"u{j}", user()) for j in range(int(rng.integers(1, 14)))]
        x = ("x", user())
        for pos in sorted({0, len(users) // 2, len(users), int(rng.integers(0, len(users) + 1))}):
            yield cutoff, max_items, users, x, pos


@pytest.mark.parametrize("kind", KINDS)
def test_fuzzed_neighbours_contract_and_keep_the_support_condition(kind):
    violations = worst = 0
    pairs = shifted = 0
    for cutoff, max_items, users, x, pos in fuzz_pairs(zlib.crc32(kind.encode()), 400):
        if kind.endswith("-front"):
            policy = front_policy(cutoff, max_items, pairs)
            shifted += any(policy.kept_start(u, c, PUBLIC) > 0 for u, c in users + [x])
        else:
            policy = make_policy(kind, cutoff, max_items)
        public = PUBLIC if policy.needs_public_counts else None
        monotone, dist, outside = neighbour_check(policy, users, x, pos, public)
        assert monotone, (kind, cutoff, users, x, pos)
        worst = max(worst, dist)
        violations += bool(outside)
        pairs += 1
    assert pairs > 1000
    assert worst <= 1.0 + 1e-9, worst
    if kind.endswith("-front"):
        # Not vacuous: on many pairs some user's K_i is not its first Δ0 walk items.
        assert shifted > pairs // 5, (shifted, pairs)
    if kind.startswith("published"):
        # Positive control: the published greedy's cascade makes items x does not
        # hold non-zero on some of these pairs (measured: several percent of them).
        assert violations > 0
    else:
        assert violations == 0


def cascade_pair():
    """The smallest cascade: Γ = 2; s raises a to 1; x fills a; c then spills onto b.

    Without x, c's walk (a first: C_c[a] = 2) spends its whole budget closing
    a's gap of exactly 1 and never reaches b; with x, a is at Γ, c skips it
    and puts its budget on b, an item x does not hold.
    """
    users = [("s", {"a": 1}), ("c", {"a": 2, "b": 1})]
    return 2.0, users, ("x", {"a": 1}), 1


@pytest.mark.parametrize("kind,caught", [("published", True), ("cascade-free", False),
                                         ("l1-descent", False), ("l2-descent", False)])
def test_constructed_cascade_is_caught_for_the_published_greedy_only(kind, caught):
    cutoff, users, x, pos = cascade_pair()
    policy = make_policy(kind, cutoff, max_items=2)
    monotone, dist, outside = neighbour_check(policy, users, x, pos)
    assert monotone and dist <= 1.0 + 1e-12
    b = policy.item_ids("b")
    assert (outside == {b}) if caught else not outside
    # The cascade's size: with x, c puts its whole budget on b.
    if caught:
        assert run_pinned(policy, users[:pos] + [x] + users[pos:])[b] == 1.0
        assert b not in run_pinned(policy, users)


# ---------------------------------------------------------------------------
# The two steps of the cascade-free update.
# ---------------------------------------------------------------------------

def _random_hist(rng, n, cutoff):
    hist = {}
    for u in range(n):
        r = rng.random()
        if r < 0.3:
            continue                                   # absent (weight 0)
        hist[u] = cutoff if r < 0.45 else float(rng.uniform(0, cutoff))
    return hist


@pytest.mark.parametrize("eta", [1e-9, 1e-3, 0.05, 0.5])
def test_step_one_gives_every_kept_item_below_the_cutoff_a_positive_weight(eta):
    rng = np.random.default_rng(int(eta * 1e9) % 1000)  # test data only
    for _ in range(500):
        cutoff = float(rng.choice([0.5, 1.0, 5.1, 30.0]))
        n = int(rng.integers(1, 1000 if eta < 0.01 else 60))
        hist = _random_hist(rng, n, cutoff)
        before = {u: hist.get(u, 0.0) for u in range(n)}
        P.apply_l1(hist, list(range(n)), cutoff, eta)
        for u in range(n):
            if before[u] < cutoff:
                assert hist[u] > before[u] and hist[u] > 0, (u, before[u], hist.get(u))
            else:
                assert hist[u] == before[u]
        # ... and it spends at most η (up to the rounding of h + level: ≤ 1 ulp of Γ each).
        assert sum(hist[u] - before[u] for u in range(n)) <= eta + n * 2.3e-16 * cutoff


def test_two_step_update_spends_at_most_one_and_matches_the_reference():
    rng = np.random.default_rng(7)  # test data only
    for _ in range(3000):
        cutoff = float(rng.choice([0.3, 1.0, 2.5, 7.0]))
        eta = float(rng.choice([1e-6, 0.01, 0.05, 0.2, 0.9]))
        n = int(rng.integers(1, 30))
        hist = _random_hist(rng, n + 5, cutoff)
        kept = list(rng.permutation(n + 5)[:n])
        before = np.array([hist.get(u, 0.0) for u in range(n + 5)])
        expected = P.cascade_free_fill(before[kept], cutoff, eta)
        P.apply_cascade_free(hist, kept, cutoff, eta, 1.0 - eta)
        after = np.array([hist.get(u, 0.0) for u in range(n + 5)])
        change = after - before
        assert (change >= 0).all() and change.sum() <= 1.0 + 1e-12
        assert (after <= np.maximum(before, cutoff)).all()              # never past Γ
        outside = np.setdiff1d(np.arange(n + 5), kept)
        assert (change[outside] == 0).all()                             # only K_i moves
        assert (after[kept][before[kept] < cutoff] > 0).all()           # support = K_i
        np.testing.assert_allclose(after[kept], expected, rtol=0, atol=1e-12)
        # The budget is used fully unless every kept item reaches Γ.
        full = min(1.0, float(np.clip(cutoff - before[kept], 0, None).sum()))
        assert change.sum() == pytest.approx(full, abs=1e-9)


@pytest.mark.parametrize("public", [None, PUBLIC])
@pytest.mark.parametrize("tie_break", ["item-hash", "first-occurrence"])
def test_cascade_free_keeps_the_first_max_items_of_the_walk_order(public, tie_break):
    rng = np.random.default_rng(9)  # test data only
    policy = P.CascadeFreeGreedyPolicy(3.0, ITEM_KEY, 4, 0.05,
                                       use_public_counts=public is not None,
                                       tie_break=tie_break)
    for _ in range(200):
        k = int(rng.integers(1, 12))
        counts = {f"i{i}": int(rng.integers(1, 4))
                  for i in rng.choice(12, k, replace=False).tolist()}
        ids, items = policy.prepare("u", counts, public)
        walk = P.greedy_order(counts, policy.item_ids, public, tie_break)
        assert ids == [policy.item_ids(u) for u in walk[:4]]
        assert sorted(map(policy.item_ids, items)) == sorted(ids)


def test_cascade_free_policy_validates():
    with pytest.raises(ValueError, match="eta"):
        P.CascadeFreeGreedyPolicy(3.0, ITEM_KEY, 4, 0.0)
    with pytest.raises(ValueError, match="eta"):
        P.CascadeFreeGreedyPolicy(3.0, ITEM_KEY, 4, 1.0)
    with pytest.raises(ValueError, match="max_items"):
        P.CascadeFreeGreedyPolicy(3.0, ITEM_KEY, 0, 0.05)


# ---------------------------------------------------------------------------
# GW-KT's 'front' selection of K_i (docs/gw.md section 1.3).
# ---------------------------------------------------------------------------

def _front_reference(counts, public, position, max_items, cutoff, scale, margin, walk):
    """K_i by the definition: skip the walk items whose public count is >= κΓ/p (keep M)."""
    n = len(walk)
    if n <= max_items:
        return walk
    s = 0 if position == 0 else sum(1 for u in walk if public.get(u, 1) >= scale * cutoff / position)
    start = min(n - max_items, max(0, s - margin))
    return walk[start:start + max_items]


def test_front_start_edges():
    # n <= Δ0: everything is kept (start 0), whatever the position.
    assert P.front_start([9, 9, 9], 3, 0.99, 1.0, 0.1, 0) == 0
    # Position 0 (the first user of the order): nothing is predicted full.
    assert P.front_start([9] * 10, 3, 0.0, 1.0, 0.1, 0) == 0
    # The window never runs past the end: start <= n − Δ0.
    assert P.front_start([9] * 10, 3, 0.99, 1.0, 0.1, 0) == 7
    # s − M, floored at 0.
    assert P.front_start([9, 9, 9, 1, 1, 1, 1, 1], 3, 0.5, 1.0, 1.0, 0) == 3   # bar 2
    assert P.front_start([9, 9, 9, 1, 1, 1, 1, 1], 3, 0.5, 1.0, 1.0, 2) == 1
    assert P.front_start([9, 9, 9, 1, 1, 1, 1, 1], 3, 0.5, 1.0, 1.0, 5) == 0
    # The last position of the order (p just below 1): bar = κΓ, inclusive.
    last = (2 ** 64 - 1) / 2.0 ** 64
    assert P.front_start([4, 4, 3, 1, 1], 2, last, 2.0, 2.0, 0) == 2
    # Public counts in any order give the same start (only the number >= bar counts).
    assert P.front_start([1, 9, 1, 9, 1], 2, 0.5, 1.0, 1.0, 0) == 2


def test_user_position_is_the_order_hash():
    for user in ["u0", "x", 17, ("a", 2)]:
        assert P.user_position(ORDER_KEYS[0], user) == \
            P.user_sort_key(ORDER_KEYS[0], user)[0] / 2.0 ** 64
        assert 0.0 <= P.user_position(ORDER_KEYS[0], user) < 1.0


@pytest.mark.parametrize("tie_break", ["item-hash", "first-occurrence"])
def test_front_keeps_the_window_past_the_predicted_front(tie_break):
    rng = np.random.default_rng(21)  # test data only
    public = {f"i{j}": int(c) for j, c in enumerate(rng.integers(0, 40, 30))}
    starts = set()
    for t in range(300):
        scale, margin = [(0.5, 0), (2.0, 1), (5.0, 3)][t % 3]
        max_items = int(rng.integers(1, 8))
        policy = P.CascadeFreeGreedyPolicy(3.0, ITEM_KEY, max_items, 0.05, use_public_counts=True,
                                           tie_break=tie_break, selection="front",
                                           order_key=ORDER_KEYS[t % 8], front_scale=scale,
                                           front_margin=margin)
        k = int(rng.integers(1, 30))
        counts = {f"i{i}": int(rng.integers(1, 4))
                  for i in rng.choice(32, k, replace=False).tolist()}   # i30, i31: not public
        user = f"u{t}"
        walk = P.greedy_order(counts, policy.item_ids, public, tie_break)
        expected = _front_reference(counts, public, P.user_position(ORDER_KEYS[t % 8], user),
                                    max_items, 3.0, scale, margin, walk)
        ids, items = policy.prepare(user, counts, public)
        assert ids == [policy.item_ids(u) for u in expected]
        assert sorted(map(policy.item_ids, items)) == sorted(ids)
        starts.add(walk.index(expected[0]))
    assert len(starts) > 5     # the window really moves


def test_front_kept_items_depend_on_nothing_but_the_user_public_counts_and_key():
    """K_i is a function of (user id, own counts, public counts, key): preparing other
    users first (any data, any number) and running them changes nothing, and the finished
    histogram's support is exactly the union of the K_i (Lemma 3 with this rule)."""
    rng = np.random.default_rng(33)  # test data only
    public = {f"i{j}": int(c) for j, c in enumerate(rng.integers(0, 12, 40))}

    def users(seed, n):
        r = np.random.default_rng(seed)  # test data only
        return {f"u{j}": {f"i{i}": int(r.integers(1, 4))
                          for i in r.choice(40, int(r.integers(1, 25)), replace=False).tolist()}
                for j in range(n)}

    def policy(order_key):
        return P.CascadeFreeGreedyPolicy(3.0, ITEM_KEY, 6, 0.01, use_public_counts=True,
                                         selection="front", order_key=order_key,
                                         front_scale=0.5, front_margin=1)

    run_key = RunKey.from_test_seed(77)
    order_key = run_key.subkey("order")
    target = ("t", {f"i{i}": 1 + i % 3 for i in range(20)})
    alone = policy(order_key).prepare(*target, public)
    for seed in range(5):
        others = users(seed, int(rng.integers(1, 60)))
        pol = policy(order_key)
        for u, c in others.items():
            pol.prepare(u, c, public)
        assert pol.prepare(*target, public) == alone
        # Support = ∪ K_i over the users, through the production path (run_sequential).
        data = dict(others, t=target[1])
        pol = policy(order_key)
        hist = P.run_sequential(data, pol, run_key, public)
        kept = set()
        for u, c in data.items():
            kept |= set(pol.prepare(u, c, public)[1])
        assert set(hist) == kept
    # Another order key moves the user and (here) its window: the key is an input.
    starts = {policy(RunKey.from_test_seed(s).subkey("order")).kept_start(*target, public)
              for s in range(20)}
    assert len(starts) > 1


def test_front_selection_validates():
    with pytest.raises(ValueError, match="kt_selection"):
        P.CascadeFreeGreedyPolicy(3.0, ITEM_KEY, 4, 0.05, use_public_counts=True,
                                  selection="window", order_key=ORDER_KEYS[0])
    with pytest.raises(ValueError, match="public counts"):
        P.CascadeFreeGreedyPolicy(3.0, ITEM_KEY, 4, 0.05, selection="front",
                                  order_key=ORDER_KEYS[0])
    with pytest.raises(ValueError, match="order_key"):
        P.CascadeFreeGreedyPolicy(3.0, ITEM_KEY, 4, 0.05, use_public_counts=True,
                                  selection="front")
    for bad in [0, -1.0, float("nan"), float("inf"), True, "20"]:
        with pytest.raises(ValueError, match="front_scale"):
            P.check_front_scale(bad)
    for bad in [-1, 1.5, True, "4", None]:
        with pytest.raises(ValueError, match="front_margin"):
            P.check_front_margin(bad)
    assert P.check_front_margin(3.0) == 3 and P.check_front_scale(np.float32(2)) == 2.0
