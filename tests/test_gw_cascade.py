"""The support condition and contractivity of every sequential policy.

See docs/mechanisms.md section 4 and docs/gw.md section 3.

For fuzzed neighbouring pairs (D, D ∪ {x}) under pinned user orders (x at
every position), the finished histograms H (of D) and H′ (of D ∪ {x}) must
satisfy, up to a few units in the last place:

* H ≤ H′ coordinate-wise;
* ‖H′ − H‖₁ ≤ 1 (‖H′ − H‖₂ ≤ 1 for ℓ2-descent);
* supp(H′) \\ supp(H) ⊆ K_x, the added user's kept items (for the descents,
  x's Δ0-sampled items; for the cascade-free greedy, the first Δ0 items of
  x's walk order).

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

from beam_dpsu import policies as P
from beam_dpsu.noise import RunKey

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


KINDS = ["l1-descent", "l2-descent", "cascade-free", "cascade-free-public", "published",
         "published-public"]
PUBLIC = {f"i{j}": (j * 7) % 5 for j in range(12)}


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
    pairs = 0
    for cutoff, max_items, users, x, pos in fuzz_pairs(zlib.crc32(kind.encode()), 400):
        policy = make_policy(kind, cutoff, max_items)
        public = PUBLIC if policy.needs_public_counts else None
        monotone, dist, outside = neighbour_check(policy, users, x, pos, public)
        assert monotone, (kind, cutoff, users, x, pos)
        worst = max(worst, dist)
        violations += bool(outside)
        pairs += 1
    assert pairs > 1000
    assert worst <= 1.0 + 1e-9, worst
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
