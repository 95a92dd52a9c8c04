"""Sequential update policies: exact values, budgets, cutoff, order, and the counterexample.

Random inputs here come from numpy generators with fixed seeds: they are test
data, not randomness of a release. No test is statistical (each checks an
exact or deterministic property), so none can fail by chance.
"""
import gzip
import math

import numpy as np
import pytest

from beam_dpsu.dp.data import sequential as P
from beam_dpsu.dp.randomness.noise import RunKey

KEY = RunKey.from_test_seed(5)
ITEM_KEY = KEY.subkey("item-order")
TOL = 1e-12


# ---------------------------------------------------------------------------
# Exact values of the reference functions (hand-computed from docs/mechanisms.md section 4).
# ---------------------------------------------------------------------------

def test_l1_descent_water_fills_exactly():
    # gaps 0.5, 0.2, 5: step 0 costs 0.2·3 = 0.6 (applied, 0.4 left); step 1
    # costs 0.3·2 = 0.6 > 0.4, so the remaining two rise by 0.2 + 0.4/2 = 0.4.
    out = P.l1_descent([4.5, 4.8, 0.0], 5.0)
    assert out == pytest.approx([4.9, 5.0, 0.4], abs=1e-15)
    # Everything closes within the budget: total change Σ gaps = 0.3.
    assert P.l1_descent([0.9, 0.8], 1.0) == pytest.approx([1.0, 1.0], abs=0)
    # Items at or above the cutoff are untouched; a lone item gets the whole budget.
    assert P.l1_descent([5.0, 6.0, 0.0], 5.0).tolist() == [5.0, 6.0, 1.0]
    # Budget exactly spent at a closing step.
    assert P.l1_descent([4.5, 4.5], 5.0).tolist() == [5.0, 5.0]


def test_l2_descent_exact():
    assert P.l2_descent([4.6, 4.7], 5.0).tolist() == [5.0, 5.0]          # Z = 0.5 ≤ 1
    z = math.sqrt(34.0)
    out = P.l2_descent([0.0, 5.0, 2.0], 5.0)                              # d = (5, ·, 3)
    assert out == pytest.approx([5.0 / z, 5.0, 2.0 + 3.0 / z], abs=1e-15)
    assert P.l2_descent([7.0], 5.0).tolist() == [7.0]


def test_greedy_fill_exact():
    # costs 0.5 and 0.2 fit; the third gets the remaining 0.3 and the walk stops.
    assert P.greedy_fill([4.5, 4.8, 3.0, 0.0], 5.0) == pytest.approx([5.0, 5.0, 3.3, 0.0],
                                                                      abs=1e-15)
    # Saturated items are skipped; the first unaffordable item takes the whole budget.
    assert P.greedy_fill([5.0, 0.0, 4.0], 5.0).tolist() == [5.0, 1.0, 4.0]


def test_greedy_order_frequency_then_hash_and_public_counts():
    counts = {"a": 3, "b": 1, "c": 3, "d": 2, "e": 1}
    h = {"a": 9, "b": 2, "c": 4, "d": 1, "e": 1_000}.__getitem__
    assert P.greedy_order(counts, h) == ["c", "a", "d", "b", "e"]
    public = {"e": 50, "b": 7, "a": 0}
    # public desc (absent = 1: c, d), then C_i desc, then hash; a has public 0 < 1.
    assert P.greedy_order(counts, h, public) == ["e", "b", "c", "d", "a"]


def test_greedy_order_first_occurrence_breaks_ties_by_the_users_record_order():
    counts = {"b": 1, "a": 3, "e": 1, "c": 3, "d": 2}      # record order b, a, e, c, d
    h = {"a": 9, "b": 2, "c": 4, "d": 1, "e": 1_000}.__getitem__
    assert P.greedy_order(counts, h, tie_break="first-occurrence") == ["a", "c", "d", "b", "e"]
    assert P.greedy_order(counts, h) == ["c", "a", "d", "b", "e"]   # the hash: c before a
    public = {"e": 50, "b": 7, "a": 0}
    # public desc (absent = 1: c, d), then C_i desc, then record order.
    assert P.greedy_order(counts, h, public, "first-occurrence") == ["e", "b", "c", "d", "a"]
    assert P.greedy_order({"x": 1, "y": 1}, h, public, "first-occurrence") == ["x", "y"]
    with pytest.raises(ValueError, match="tie_break"):
        P.greedy_order(counts, h, tie_break="histogram")
    with pytest.raises(ValueError, match="tie_break"):
        P.GreedyPolicy(5.0, ITEM_KEY, tie_break=None)


# ---------------------------------------------------------------------------
# The fast in-place updates equal the reference functions.
# ---------------------------------------------------------------------------

def _random_case(rng, cutoff):
    n = int(rng.integers(1, 30))
    items = list(range(n))
    hist = {}
    for u in items:
        r = rng.random()
        if r < 0.2:
            continue                      # absent (weight 0)
        hist[u] = cutoff if r < 0.35 else float(rng.uniform(0, cutoff * 1.01))
    return items, hist


@pytest.mark.parametrize("fast,ref", [(P.apply_l1, P.l1_descent), (P.apply_l2, P.l2_descent),
                                      (P.apply_greedy, P.greedy_fill)])
def test_fast_updates_match_reference(fast, ref):
    rng = np.random.default_rng(1)
    for _ in range(1000):
        cutoff = float(rng.choice([0.3, 1.0, 2.5, 7.0]))
        items, hist = _random_case(rng, cutoff)
        before = [hist.get(u, 0.0) for u in items]
        expected = ref(before, cutoff)
        fast(hist, items, cutoff)
        got = [hist.get(u, 0.0) for u in items]
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------
# Property tests: budget, cutoff, and order independence.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("fast,norm", [(P.apply_l1, 1), (P.apply_l2, 2), (P.apply_greedy, 1)])
def test_each_user_stays_within_budget_and_below_cutoff(fast, norm):
    rng = np.random.default_rng(2)
    for _ in range(1500):
        cutoff = float(rng.choice([0.2, 1.0, 3.3, 12.0]))
        items, hist = _random_case(rng, cutoff)
        before = np.array([hist.get(u, 0.0) for u in items])
        fast(hist, items, cutoff)
        after = np.array([hist.get(u, 0.0) for u in items])
        change = after - before
        assert (change >= 0).all()
        assert np.linalg.norm(change, ord=norm) <= 1.0 + TOL
        assert (after[before < cutoff] <= cutoff).all()          # never past Γ
        assert (change[before >= cutoff] == 0).all()               # saturated items untouched
        gaps = np.clip(cutoff - before, 0, None)
        # The budget is used fully unless every item reaches Γ.
        full = min(1.0, float(np.linalg.norm(gaps, ord=norm)))
        if fast is not P.apply_greedy:
            assert np.linalg.norm(change, ord=norm) == pytest.approx(full, abs=1e-9)


@pytest.mark.parametrize("fast", [P.apply_l1, P.apply_l2])
def test_descent_is_a_symmetric_function_of_the_items(fast):
    """ℓ1/ℓ2-descent results do not depend on any order of the user's items."""
    rng = np.random.default_rng(3)
    for _ in range(1000):
        cutoff = float(rng.choice([1.0, 3.3]))
        items, hist = _random_case(rng, cutoff)
        h1, h2 = dict(hist), dict(hist)
        fast(h1, items, cutoff)
        fast(h2, list(rng.permutation(items)), cutoff)
        for u in items:
            assert h1.get(u, 0.0) == pytest.approx(h2.get(u, 0.0), abs=1e-12)


class _RecordingHist(dict):
    def __init__(self, *a):
        super().__init__(*a)
        self.reads = []

    def get(self, key, default=None):
        self.reads.append(key)
        return super().get(key, default)


def test_greedy_walk_order_never_depends_on_the_histogram():
    policy = P.GreedyPolicy(5.0, ITEM_KEY)
    public_policy = P.GreedyPolicy(5.0, ITEM_KEY, use_public_counts=True)
    by_record = P.GreedyPolicy(5.0, ITEM_KEY, tie_break="first-occurrence")
    public_by_record = P.GreedyPolicy(5.0, ITEM_KEY, use_public_counts=True,
                                      tie_break="first-occurrence")
    rng = np.random.default_rng(4)
    for _ in range(300):
        counts = {f"i{k}": int(rng.integers(1, 4)) for k in rng.choice(40, 12, replace=False)}
        public = {f"i{k}": int(rng.integers(0, 3)) for k in range(0, 40, 3)}
        for pol, pub in ((policy, None), (public_policy, public), (by_record, None),
                         (public_by_record, public)):
            ids, _ = pol.prepare("u", counts, pub)
            # prepare sees no histogram; the same user always gets the same walk
            # (with the hash tie-break, whatever order their dict is in).
            if pol.tie_break == "item-hash":
                shuffled = dict(sorted(counts.items(), key=lambda kv: rng.random()))
                assert pol.prepare("u", shuffled, pub)[0] == ids
            assert pol.prepare("u", dict(counts), pub)[0] == ids
            expected = [pol.item_ids(u) for u in
                        P.greedy_order(counts, pol.item_ids, pub, pol.tie_break)]
            assert ids == expected
            for _ in range(3):
                hist = _RecordingHist({i: float(rng.uniform(0, 5.5)) for i in ids
                                       if rng.random() < 0.7})
                pol.update(hist, ids)
                assert hist.reads == ids[:len(hist.reads)]     # walked in the fixed order


def test_run_sequential_does_not_depend_on_input_order():
    rng = np.random.default_rng(5)
    per_user = {f"user{u}": {f"i{k}": int(rng.integers(1, 3))
                             for k in rng.zipf(1.5, int(rng.integers(1, 15)))}
                for u in range(300)}
    reversed_users = dict(reversed(list(per_user.items())))
    policy = P.L2DescentPolicy(3.0, 5, KEY.subkey("sample/0"), ITEM_KEY)
    a = P.run_sequential(per_user, policy, KEY)
    b = P.run_sequential(reversed_users, policy, KEY)
    assert a == b and a and all(w > 0 for w in a.values())
    assert max(a.values()) <= 3.0


def test_item_id_collisions_are_detected():
    class Constant:
        def __call__(self, item):
            return 7
    mapping = {}
    P.add_id_mapping(mapping, [7], ["a"], Constant())
    P.add_id_mapping(mapping, [7], ["a"], Constant())
    with pytest.raises(P.ItemIdCollision):
        P.add_id_mapping(mapping, [7], ["b"], Constant())


# ---------------------------------------------------------------------------
# The "closest to the cutoff first" greedy is not private (Gopi et al.).
# ---------------------------------------------------------------------------

def closest_first(hist, items, cutoff, norm):
    """NON-PRIVATE test helper: fills the items closest to Γ first (ℓ1 or ℓ2 budget 1)."""
    below = sorted((cutoff - hist.get(u, 0.0), u) for u in items if hist.get(u, 0.0) < cutoff)
    remaining = 1.0
    for gap, u in below:
        cost = gap if norm == 1 else gap * gap
        if cost <= remaining:
            hist[u] = cutoff
            remaining -= cost
        else:
            hist[u] = hist.get(u, 0.0) + (remaining if norm == 1 else math.sqrt(remaining))
            return


def _run(users, update):
    hist = {}
    for items in users:
        update(hist, items)
    return hist


def _distance(a, b, norm):
    keys = set(a) | set(b)
    return float(np.linalg.norm([a.get(k, 0.0) - b.get(k, 0.0) for k in keys], ord=norm))


@pytest.mark.parametrize("norm", [1, 2])
def test_closest_first_greedy_exceeds_the_sensitivity_bound(norm):
    # Γ = 1.5. D: one user with items {0, 1}. D' = D plus a user with item {1},
    # processed first. In D the tie goes to item 0, which gets the whole budget
    # (H = {0: 1}). In D' the new user lifts item 1 to 1, so the old user now
    # fills item 1 (gap 0.5) first and puts what is left on item 0:
    # ℓ1: {0: 0.5, 1: 1.5}, distance 2; ℓ2: {0: √0.75, 1: 1.5}, distance ≈ 1.506.
    d = [(0, 1)]
    d_prime = [(1,)] + d
    update = lambda h, items: closest_first(h, items, 1.5, norm)  # noqa: E731
    assert _distance(_run(d, update), _run(d_prime, update), norm) > 1.4
    # Ours on the same pair stay within the bound.
    ours = P.apply_l1 if norm == 1 else P.apply_l2
    mine = lambda h, items: ours(h, items, 1.5)  # noqa: E731
    assert _distance(_run(d, mine), _run(d_prime, mine), norm) <= 1.0 + TOL


@pytest.mark.parametrize("name", ["l1", "l2", "greedy"])
def test_our_policies_stay_within_the_bound_on_random_neighbours(name):
    """2,000 random neighbouring pairs (D, D + one user at a random position).

    Sensitivity of the finished histogram: ℓ1 ≤ 1 for ℓ1-descent and greedy,
    ℓ2 ≤ 1 for ℓ2-descent (Gopi et al.; Carvalho et al.). The closest-first
    greedy fails the same check on many of these pairs.
    """
    fast, norm = {"l1": (P.apply_l1, 1), "l2": (P.apply_l2, 2),
                  "greedy": (P.apply_greedy, 1)}[name]
    rng = np.random.default_rng(6)
    closest_violations = 0
    worst = 0.0
    for _ in range(2000):
        n_items = int(rng.integers(2, 6))
        cutoff = float(rng.choice([0.7, 1.5, 2.0, 3.0]))
        users = [tuple(rng.choice(n_items, int(rng.integers(1, n_items + 1)), replace=False)
                       .tolist()) for _ in range(int(rng.integers(1, 8)))]
        extra = tuple(rng.choice(n_items, int(rng.integers(1, n_items + 1)),
                                 replace=False).tolist())
        pos = int(rng.integers(0, len(users) + 1))
        neighbour = users[:pos] + [extra] + users[pos:]
        mine = lambda h, items: fast(h, items, cutoff)  # noqa: E731
        worst = max(worst, _distance(_run(users, mine), _run(neighbour, mine), norm))
        theirs = lambda h, items: closest_first(h, items, cutoff, norm)  # noqa: E731
        closest_violations += _distance(_run(users, theirs), _run(neighbour, theirs),
                                        norm) > 1.0 + 1e-9
    assert worst <= 1.0 + 1e-9
    if name != "greedy":
        assert closest_violations > 0


# ---------------------------------------------------------------------------
# Public counts files.
# ---------------------------------------------------------------------------

def test_read_public_counts(tmp_path):
    path = tmp_path / "pub.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("the\t12\nword with\ttab\t3\n\nthe\t1\nrare\t0.5\n")
    assert P.read_public_counts(str(path)) == {"the": 13, "word with\ttab": 3, "rare": 0.5}
    bad = tmp_path / "bad.tsv"
    bad.write_text("ok\t1\nnocount\n")
    with pytest.raises(ValueError, match="line 2"):
        P.read_public_counts(str(bad))
    bad.write_text("neg\t-1\n")
    with pytest.raises(ValueError, match="count must be a number >= 0"):
        P.read_public_counts(str(bad))


def test_policies_validate():
    with pytest.raises(ValueError, match="cutoff"):
        P.L1DescentPolicy(0.0, 3, b"k" * 32, ITEM_KEY)
    with pytest.raises(ValueError, match="max_items_per_user"):
        P.L2DescentPolicy(1.0, 0, b"k" * 32, ITEM_KEY)
    with pytest.raises(ValueError, match="public counts"):
        P.GreedyPolicy(1.0, ITEM_KEY, use_public_counts=True).prepare("u", {"a": 1})


def test_item_ids_many_equals_one_by_one():
    from beam_dpsu.dp.data.sequential import ItemIds
    ids = ItemIds(b"k" * 32, max_cache=5)
    items = [f"i{k % 9}" for k in range(40)] + [3, b"x"]
    assert ids.many(items) == [ItemIds(b"k" * 32)(u) for u in items]
    assert ids.many({"a": 1, "b": 2}) == [ids("a"), ids("b")]


def test_item_ids_are_the_keyed_hash_of_the_encoded_item():
    """The id is keyed_hash64(key, encode_value(item)) >> 1, computed here without ItemIds,
    for strings (hashed through the prefixed state), a lone surrogate, bytes, ints and tuples,
    one by one and in batches, from an empty and from a warm cache."""
    from beam_dpsu.dp.randomness.noise import encode_value, keyed_hash64
    from beam_dpsu.dp.data.sequential import ItemIds
    key = b"k" * 32
    items = ["", "a", "\u00e9t\u00e9", "\ud800x", b"a", 7, ("a", 1), "a"]
    expected = [keyed_hash64(key, encode_value(u)) >> 1 for u in items]
    assert all(0 <= i < 2 ** 63 for i in expected)
    assert len(set(expected)) == len(items) - 1  # "a" twice; b"a" and 7 differ from "a"
    cold = ItemIds(key)
    assert [cold(u) for u in items] == expected
    assert ItemIds(key).many(items) == expected
    warm = ItemIds(key)
    warm.many(items[:3])
    assert warm.many(items) == expected
    assert ItemIds(key, max_cache=2).many(items) == expected


def test_item_ids_cache_is_cleared_only_when_the_new_ids_would_overflow_it():
    from beam_dpsu.dp.data.sequential import ItemIds
    ids = ItemIds(b"k" * 32, max_cache=4)
    ids.many(["a", "b", "c"])
    ids.many(["a", "b", "c", "d"])          # one new id: 3 + 1 fits
    assert sorted(ids._cache) == ["a", "b", "c", "d"]
    ids.many(["a", "e"])                     # 4 + 1 does not: cleared, then the new id
    assert sorted(ids._cache) == ["e"]


def test_gwkt_checks_its_public_counts_where_it_is_built(tmp_path):
    from beam_dpsu.dp.mechanisms.policy import GWKT
    for bad, match in (("", "non-empty"), (str(tmp_path / "missing.tsv"), "not found"),
                       ({"a": "x"}, "finite counts"), ({"a": -5}, "finite counts"),
                       ({"a": float("nan")}, "finite counts"), ({"a": True}, "finite counts"),
                       (["a"], "path or a mapping")):
        with pytest.raises(ValueError, match=match):
            GWKT(1.0, 1e-6, bad)
    path = tmp_path / "public.tsv"
    path.write_text("a\t3\n", encoding="utf-8")
    GWKT(1.0, 1e-6, str(path))
    GWKT(1.0, 1e-6, "gs://bucket/public.tsv")  # remote: read when the job runs
    GWKT(1.0, 1e-6, {"a": 3, "b": 0.5})
