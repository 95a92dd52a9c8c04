"""Ranked releases on the columnar path (``transforms.columnar.RankFromText``): top-k,
discovery then peeling and the hitting set from text files release what the per-user
path releases under the same key, and the array pieces behind them are exact."""
import random

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu.dp import columnar, synthetic
from beam_dpsu.dp.contribution import per_user_counts
from beam_dpsu.dp.mechanisms.peeling import (DiscoverPeelHittingSet, DiscoverPeelTopK,
                                             pair_rounds, peeling_rounds, _domain_order)
from beam_dpsu.dp.mechanisms.topk import TopKMechanism
from beam_dpsu.dp.noise import RunKey
from beam_dpsu.transforms.columnar import RankFromText

from conftest import local_pipeline

RK = RunKey.from_test_seed(77)

MECHANISMS = [
    TopKMechanism(5, 2.0, 1e-6, k_bar=8),
    TopKMechanism(6, 2.0, 1e-6, max_items=3),
    TopKMechanism(4, 3.0, 1e-6, max_items=2, with_counts=True),
    DiscoverPeelTopK(5, 3.0, 1e-6, max_items=4),
    DiscoverPeelHittingSet(4, 3.0, 1e-6, max_items=4),
]


def _files(tmp_path, pairs):
    lines = [f"{u}\t{i}".encode() for u, i in pairs]
    half = len(lines) // 2  # a user's lines in both files, malformed lines in each
    (tmp_path / "a.tsv").write_bytes(b"".join(x + b"\n" for x in lines[:half] + [b"bad"]))
    (tmp_path / "b.tsv").write_bytes(b"".join(x + b"\r\n" for x in lines[half:] + [b"x"]))
    return str(tmp_path / "*.tsv")


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=repr)
def test_rank_from_text_releases_what_the_per_user_path_releases(tmp_path, mechanism):
    pairs = list(synthetic.occurrences(1500, seed=13))
    expected = mechanism.run_local(per_user_counts(pairs), RK)
    assert len(expected) >= 3  # a release worth comparing
    with local_pipeline() as p:
        rows, malformed, users = p | RankFromText(_files(tmp_path, pairs), mechanism, RK,
                                                  user_groups=3, item_shards=2,
                                                  block_bytes=4000)
        assert_that(rows, equal_to(expected), label="rows")
        assert_that(malformed | beam.CombinePerKey(sum), equal_to([(b"bad", 1), (b"x\r", 1)]),
                    label="malformed")
        assert_that(users | beam.CombineGlobally(sum), equal_to([1500]), label="users")


def test_a_top_k_query_under_another_purpose_is_another_query(tmp_path):
    pairs = list(synthetic.occurrences(800, seed=2))
    m = TopKMechanism(5, 1.0, 1e-6, max_items=2)
    from beam_dpsu.dp.mechanisms.topk import top_k_local
    expected = top_k_local(per_user_counts(pairs), m, RK, "topk/1")
    with local_pipeline() as p:
        rows, _, _ = p | RankFromText(_files(tmp_path, pairs), m, RK, purpose="topk/1")
        assert_that(rows, equal_to(expected))


def test_rank_from_text_refuses_other_mechanisms():
    from beam_dpsu.dp.mechanisms import WeightedGaussian
    with pytest.raises(ValueError, match="RankFromText runs"):
        RankFromText("x", WeightedGaussian(1.0, 1e-6))
    with pytest.raises(ValueError, match="purpose"):
        RankFromText("x", MECHANISMS[0], purpose="")


@pytest.mark.parametrize("seed", range(5))
def test_pair_rounds_are_the_peeling_rounds_whatever_the_users_numbering(seed):
    rng = random.Random(seed)
    domain = [f"d{j}" for j in range(12)]
    user_sets = [rng.sample(domain + ["out1", "out2"], rng.randint(1, 6)) for _ in range(60)]
    expected = [(s.tolist(), x) for s, x in peeling_rounds(user_sets, domain, 8, 0.7, RK)]
    items = _domain_order(domain)
    index = {x: i for i, x in enumerate(items)}
    numbering = list(range(len(user_sets)))
    rng.shuffle(numbering)
    user_of, item_of = [], []
    for user, held in zip(numbering, user_sets):
        for x in set(held) & set(domain):
            user_of.append(user)
            item_of.append(index[x])
    order = list(range(len(user_of)))
    rng.shuffle(order)  # pairs in any order
    got = [(s.tolist(), x) for s, x in pair_rounds(np.array(user_of)[order],
                                                   np.array(item_of)[order], items, 8, 0.7,
                                                   RK)]
    assert got == expected


def test_peel_pairs_takes_users_in_parts_as_peel_takes_their_sets():
    rng = random.Random(4)
    domain = [f"d{j}" for j in range(9)]
    user_sets = [rng.sample(domain, rng.randint(1, 4)) for _ in range(40)]
    m = DiscoverPeelHittingSet(5, 2.0, 1e-6)
    parts = []
    for lo in (0, 15, 32):
        chunk = user_sets[lo:lo + {0: 15, 15: 17, 32: 8}[lo]]
        present = sorted({x for held in chunk for x in held}, reverse=True)
        pos = {x: j for j, x in enumerate(present)}
        parts.append((present, np.array([u for u, held in enumerate(chunk) for _ in held],
                                        np.int32),
                      np.array([pos[x] for held in chunk for x in held], np.int32)))
    expected = m.peel(user_sets, domain, RK)
    assert m.peel_pairs(parts, domain, RK) == expected
    total = sum(len(p[1]) for p in parts)
    assert m.peel_pairs(iter(parts), domain, RK, total_pairs=total) == expected
    with pytest.raises(ValueError, match="total_pairs"):
        m.peel_pairs(iter(parts), domain, RK, total_pairs=total - 1)
    with pytest.raises(ValueError, match="total_pairs"):
        m.peel_pairs(iter(parts), domain, RK, total_pairs=total + 1)
    assert m.peel_pairs([], domain, RK) == m.peel([], domain, RK)


def test_top_candidates_hold_every_item_tied_at_the_cut():
    items = pa.array([f"i{j}" for j in range(8)])
    weights = np.array([5.0, 1.0, 3.0, 3.0, 3.0, 7.0, 0.5, 3.0])
    got = dict(columnar.top_candidates(items, weights, 3))
    assert got == {"i0": 5.0, "i5": 7.0, "i2": 3.0, "i3": 3.0, "i4": 3.0, "i7": 3.0}
    assert dict(columnar.top_candidates(items, weights, 20)) == dict(
        zip(items.to_pylist(), weights.tolist()))
    assert columnar.top_candidates(pa.array([], pa.string()), np.zeros(0), 3) == []


def test_a_groups_pairs_within_the_domain_are_exact():
    per_user = {"u1": {"a": 1, "b": 1, "A": 1}, "u2": {"a": 1}, "u3": {"é": 1, "e\u0301": 1}}
    block = columnar.parse_block(b"".join(f"{u}\t{x}\n".encode() for u, c in per_user.items()
                                          for x in c))
    pairs = columnar.group_pairs(columnar.pair_blocks(block, 1).values())
    inside = columnar.only_items(pairs, pa.array(["a", "e\u0301", "zz"]))
    held = {(inside.users[u].as_py(), inside.items[i].as_py())
            for u, i in zip(inside.u, inside.i)}
    assert held == {("u1", "a"), ("u2", "a"), ("u3", "e\u0301")}
    assert dict(zip(*columnar.users_per_item(inside))) == {"a": 2, "e\u0301": 1}
    items, user_of, item_of = columnar.read_held_pairs(columnar.held_pairs(inside))
    assert user_of.dtype == np.int32 and sorted(set(user_of.tolist())) == [0, 1, 2]
    assert sorted(items[j] for j in item_of.tolist()) == ["a", "a", "e\u0301"]
    assert len(columnar.only_items(pairs, pa.array([], pa.string()))) == 0


@pytest.mark.parametrize("mechanism", [MECHANISMS[1], MECHANISMS[4]], ids=repr)
def test_rank_from_text_stages_its_shuffles_to_the_same_release(tmp_path, mechanism):
    from beam_dpsu.transforms import staging
    pairs = list(synthetic.occurrences(900, seed=5))
    expected = mechanism.run_local(per_user_counts(pairs), RK)
    stage = staging.make_directory(str(tmp_path / "stage"))
    data = tmp_path / "data"
    data.mkdir()
    with local_pipeline() as p:
        rows, _, _ = p | RankFromText(_files(data, pairs), mechanism, RK, user_groups=4,
                                      item_shards=3, staging_dir=stage)
        assert_that(rows, equal_to(expected))
    assert any((tmp_path / "stage").iterdir())  # the shuffles went through files
