"""Contribution bounding: per-user counts and uniform keyed sampling."""
import itertools

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from scipy import stats

from beam_dpsu.transforms.bounding import PerUserItemCounts, SampleItems
from beam_dpsu.dp.data.contribution import merge_item_counts, sample_items
from beam_dpsu.dp.randomness.noise import RunKey

from conftest import local_pipeline


def key(i=0):
    return RunKey.from_test_seed(i).subkey("sample/0")


def test_small_users_keep_everything():
    counts = {"a": 2, "b": 1}
    assert sample_items("u", counts, 2, key()) == counts
    assert sample_items("u", counts, 5, key()) == counts


def test_large_users_keep_exactly_max_items_with_their_counts():
    counts = {f"i{j}": j + 1 for j in range(100)}
    kept = sample_items("u", counts, 10, key())
    assert len(kept) == 10
    assert all(counts[i] == c for i, c in kept.items())


def test_sample_is_independent_of_dict_order_and_deterministic():
    counts = {f"i{j}": 1 for j in range(50)}
    reordered = dict(reversed(list(counts.items())))
    assert sample_items("u", counts, 7, key()) == sample_items("u", reordered, 7, key())
    # Another key or another user draws another subset (equal with prob. 1/C(50,7) < 1e-8).
    assert set(sample_items("u", counts, 7, key(1))) != set(sample_items("u", counts, 7, key()))
    assert set(sample_items("v", counts, 7, key())) != set(sample_items("u", counts, 7, key()))


def test_mixed_type_items_are_sampled():
    counts = {1: 1, "1": 1, b"1": 1, (1, 2): 1, 2.5: 1}
    kept = sample_items("u", counts, 2, key())
    assert len(kept) == 2 and set(kept) <= set(counts)


def test_sampling_is_uniform_over_subsets():
    # 5 items, Δ0 = 2: 10 possible subsets, each with probability 1/10. Chi-square
    # over 20,000 independent keys; false-failure probability 1e-7.
    counts = {c: 1 for c in "abcde"}
    subsets = list(itertools.combinations("abcde", 2))
    tally = {s: 0 for s in subsets}
    trials = 20000
    for i in range(trials):
        kept = tuple(sorted(sample_items("u", counts, 2, RunKey.fresh().subkey("s"))))
        tally[kept] += 1
    assert stats.chisquare(list(tally.values())).pvalue > 1e-7


def test_merge_item_counts():
    assert merge_item_counts([{"a": 1}, {"a": 2, "b": 1}, {}]) == {"a": 3, "b": 1}
    assert merge_item_counts([]) == {}


def test_per_user_item_counts_in_beam():
    occ = [("u1", "a"), ("u1", "a"), ("u1", "b"), ("u2", "a"), ("u2", "é"), ("u2", "é")]
    for flush in (1, 2, 1000):
        with local_pipeline() as p:
            out = p | beam.Create(occ) | PerUserItemCounts(flush_pairs=flush)
            assert_that(out, equal_to([("u1", {"a": 2, "b": 1}), ("u2", {"a": 1, "é": 2})]))


def test_sample_items_in_beam_matches_pure_function():
    rk = RunKey.from_test_seed(9)
    data = [(f"u{i}", {f"i{j}": 1 for j in range(i)}) for i in range(0, 30)]
    expected = [(u, sample_items(u, c, 5, rk.subkey("sample/0"))) for u, c in data if c]
    with local_pipeline() as p:
        out = p | beam.Create(data) | SampleItems(5, rk)
        assert_that(out, equal_to(expected))


def test_bad_parameters_fail_at_construction():
    with pytest.raises(ValueError, match="max_items_per_user"):
        SampleItems(0)
    with pytest.raises(ValueError, match="flush_pairs"):
        PerUserItemCounts(flush_pairs=0)


def test_windowed_input_is_rejected_at_construction():
    p = local_pipeline()
    windowed = (p | beam.Create([("u", "a")])
                | beam.WindowInto(beam.window.FixedWindows(10)))
    with pytest.raises(ValueError, match="global window"):
        _ = windowed | PerUserItemCounts()


def test_per_user_item_counts_designs_agree():
    # None user ids and items are refused (tests/test_identity.py), no longer dropped.
    occ = [("u1", "a"), ("u1", "a"), ("u1", "b"), ("u2", "a"), ("u2", "é"), ("u2", "é"),
           (7, 8), (b"7", (8, "x"))]
    for design in ("combine", "bundle-dofn"):
        with local_pipeline() as p:
            out = p | beam.Create(occ) | PerUserItemCounts(design=design)
            assert_that(out, equal_to([("u1", {"a": 2, "b": 1}), ("u2", {"a": 1, "é": 2}),
                                       (7, {8: 1}), (b"7", {(8, "x"): 1})]))
    with pytest.raises(ValueError, match="design"):
        PerUserItemCounts(design="other")


@pytest.mark.parametrize("owners_sorted", [False, True])
def test_smallest_scores_against_a_sort_per_owner(owners_sorted):
    import numpy as np
    from beam_dpsu.dp.data.contribution import smallest_scores
    rng = np.random.default_rng(3)
    owner = rng.integers(0, 40, 3000)
    if owners_sorted:  # as the samplers pass them: the one-key sort
        owner = np.sort(owner)
    scores = rng.integers(0, 500, 3000).astype(np.uint64)  # many ties on purpose
    keep, tied = smallest_scores(owner, scores, 4)
    for o in range(40):
        mine = np.flatnonzero(owner == o)
        ranked = sorted(scores[mine].tolist())
        is_tied = len(ranked) > 4 and ranked[3] == ranked[4]
        assert (o in tied.tolist()) == is_tied
        if not is_tied:
            assert sorted(scores[mine[keep[mine]]].tolist()) == ranked[:4]


def test_the_one_key_order_is_lexsort_even_when_scores_differ_only_in_low_bits():
    # Sorted owners are ordered by one 64-bit key (owner rank, then the score's high
    # bits); keys that tie there are re-sorted by the full score: exactly lexsort's order.
    import numpy as np
    from beam_dpsu.dp.data.contribution import owner_score_order
    rng = np.random.default_rng(5)
    for trial in range(200):
        n, m = int(rng.integers(0, 400)), int(rng.integers(1, 60))
        owner = np.sort(rng.integers(0, m, n))
        scores = rng.integers(0, [3, 2**20, 2**64 - 1][trial % 3], n, dtype=np.uint64,
                              endpoint=True)
        if trial % 2:  # equal high bits, different low bits
            scores = (scores << np.uint64(8)) | rng.integers(0, 4, n, dtype=np.uint64)
        assert np.array_equal(owner_score_order(owner, scores),
                              np.lexsort((scores, owner))), trial


def test_ranks_in_runs_against_a_loop():
    import numpy as np
    from beam_dpsu.dp.data.contribution import ranks_in_runs
    rng = np.random.default_rng(3)
    owner = np.sort(rng.integers(0, 30, 400))
    steps = rng.random(400) < 0.6
    for given in (None, steps):
        expected, rank, prev = [], -1, None
        for k, o in enumerate(owner.tolist()):
            if o != prev:
                rank = 0
            elif given is None or given[k]:
                rank += 1
            expected.append(rank)
            prev = o
        assert ranks_in_runs(owner, given).tolist() == expected
    assert ranks_in_runs(np.zeros(0, np.int64)).tolist() == []
