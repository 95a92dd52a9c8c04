"""Ranked releases on the columnar path (``transforms.columnar_rank.RankFromText``): top-k,
discovery then peeling and the hitting set from text files release what the per-user
path releases under the same key, and the array pieces behind them are exact."""
import random

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu.dp.data import columnar, columnar_text
from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.dp.data.contribution import per_user_counts
from beam_dpsu.dp.mechanisms.peeling import (DiscoverPeelHittingSet, DiscoverPeelTopK,
                                             pair_rounds, peeling_rounds, _domain_order)
from beam_dpsu.dp.mechanisms.topk import TopKMechanism
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms.columnar_rank import RankFromText

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


def test_a_blocks_pairs_within_the_domain_are_exact():
    per_user = {"u1": {"a": 1, "b": 1, "A": 1}, "u2": {"a": 1}, "u3": {"é": 1, "e\u0301": 1}}
    text = b"".join(f"{u}\t{x}\n".encode() for u, c in per_user.items() for x in c)

    def within(domain):
        blocks = columnar.pair_blocks(columnar_text.parse_block(text), 2,
                                      within=pa.array(domain, pa.string())).values()
        return columnar.group_pairs(blocks)
    inside = within(["a", "e\u0301", "zz"])
    held = {(inside.users[u].as_py(), inside.items[i].as_py())
            for u, i in zip(inside.u, inside.i)}
    assert held == {("u1", "a"), ("u2", "a"), ("u3", "e\u0301")}
    assert dict(zip(*columnar.item_users_of_pairs(inside))) == {"a": 2, "e\u0301": 1}
    items, user_of, item_of = columnar.read_held_pairs(columnar.held_pairs(inside))
    assert user_of.dtype == np.int32 and sorted(set(user_of.tolist())) == [0, 1, 2]
    assert sorted(items[j] for j in item_of.tolist()) == ["a", "a", "e\u0301"]
    assert len(within([])) == 0


@pytest.mark.parametrize("mechanism", [MECHANISMS[1], MECHANISMS[4]], ids=repr)
def test_rank_from_text_reads_files_in_byte_ranges_to_the_same_release(tmp_path, mechanism):
    # ranges of 900 bytes: top-k's read, and discovery's read and the second read of
    # the domain's pairs (ranges that meet the domain), give the whole files' release
    pairs = list(synthetic.occurrences(1500, seed=13))
    expected = mechanism.run_local(per_user_counts(pairs), RK)
    with local_pipeline() as p:
        rows, malformed, users = p | RankFromText(_files(tmp_path, pairs), mechanism, RK,
                                                  user_groups=3, item_shards=2,
                                                  block_bytes=300, range_bytes=900)
        assert_that(rows, equal_to(expected), label="rows")
        assert_that(malformed | beam.CombinePerKey(sum), equal_to([(b"bad", 1), (b"x\r", 1)]),
                    label="malformed")
        assert_that(users | beam.CombineGlobally(sum), equal_to([1500]), label="users")


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


# -- SelectPartitions on pairs: blocks of arrays ------------------------------------

from beam_dpsu.dp.mechanisms import CountLaplace, WeightedGaussian, WeightedLaplace  # noqa: E402
from beam_dpsu.dp.mechanisms.sips import Sips  # noqa: E402
from beam_dpsu.transforms.columnar import SelectFromPairs  # noqa: E402
from beam_dpsu.transforms.select import SelectPartitions  # noqa: E402

from beam_dpsu.dp.mechanisms.policy import GW, PolicyGaussian  # noqa: E402

PAIR_MECHANISMS = [WeightedGaussian(2.0, 1e-6, 5), CountLaplace(2.0, 1e-6, 3),
                   Sips(1.0, 1e-6, rounds=3), PolicyGaussian(2.0, 1e-6, 5),
                   GW(2.0, 1e-6)]  # (GW's constructor: the item-hash tie-break)


def _labels(pipeline):
    found = []

    class Visit(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            found.append(node.full_label)

        def visit_transform(self, node):
            found.append(node.full_label)
    pipeline.visit(Visit())
    return found


@pytest.mark.parametrize("mechanism", PAIR_MECHANISMS, ids=repr)
def test_select_partitions_on_pairs_runs_on_blocks_and_releases_the_per_user_release(
        mechanism):
    pairs = list(synthetic.occurrences(1200, seed=8))
    expected = mechanism.run_local(per_user_counts(pairs), RK)
    assert len(expected) >= 5
    p = local_pipeline()
    released = (p | beam.Create(pairs, reshuffle=False)
                | SelectPartitions(mechanism, RK) | beam.combiners.ToList())
    assert_that(released | beam.Map(sorted), equal_to([sorted(expected)]))
    assert any("SelectFromPairs/ToBlocks" in label for label in _labels(p))
    assert not any("PerUserItemCounts" in label for label in _labels(p))
    p.run().wait_until_finish()


def test_ids_of_every_accepted_type_keep_their_identity_on_blocks():
    # 60 users hold the int 1, one user the str "1", one the bytes b"1": merged ids would
    # give "1" and b"1" the int's users; released items come back as the objects given
    # (a str with a lone surrogate is an accepted id too, but Beam's coders cannot carry
    # it between steps: id_strings' own test covers it)
    odd = ["1", b"1", ("1",), "\x00x", ("a", 2, b"b"), "é"]
    pairs = [(u, 1) for u in range(60)] + [(1, x) for x in odd]
    pairs += [(("t", k), x) for k in range(60) for x in odd]  # tuple users
    m = WeightedLaplace(8.0, 1e-6, 10)
    released = m.run_local(per_user_counts(pairs), RK)
    assert 1 in released and len(released) == 7  # the int and every odd item, from 60+
    with local_pipeline() as p:
        got = p | beam.Create(pairs) | SelectPartitions(m, RK)
        assert_that(got, equal_to(sorted(released, key=repr)))
    lone = [(u, "x") for u in range(60)] + [(1, 1), ("1", "1"), (b"1", b"1")]
    with local_pipeline() as p:  # one user each: under the threshold, whatever merging
        got = p | beam.Create(lone) | SelectPartitions(m, RK)
        assert_that(got, equal_to(["x"]))


def test_pairs_of_refused_types_or_shapes_fail_the_run_with_the_reason():
    from beam_dpsu.dp.data.contribution import IdTypeError
    m = WeightedGaussian(1.0, 1e-6)
    for bad, error in (([("u", 1.5)], "float"), ([("u", "a", "b")], "unpack")):
        with pytest.raises(Exception, match=error):
            with local_pipeline() as p:
                _ = p | beam.Create(bad) | SelectPartitions(m, RK)
    assert issubclass(IdTypeError, ValueError)


def test_select_from_pairs_refuses_what_it_does_not_run():
    with pytest.raises(ValueError, match="SelectFromPairs runs"):
        SelectFromPairs(GW(1.0, 1e-6, tie_break="first-occurrence"))
    with pytest.raises(ValueError, match="SelectFromPairs runs"):
        SelectFromPairs(Sips(1.0, 1e-6, removal="join"))
    with pytest.raises(ValueError, match="batch_size"):
        SelectFromPairs(WeightedGaussian(1.0, 1e-6), batch_size=0)


@pytest.mark.parametrize("values", [
    ["a", "", "é", "tab\there", "new\nline"],
    [b"", b"\xff", 0, -(10 ** 20), ("x",), (), ("a", (1, b"z")), "\x00", "\x00s", "\udcff"],
])
def test_id_strings_read_back_and_tell_ids_apart(values):
    strings = columnar_text.id_strings(values, "item").to_pylist()
    assert [columnar_text.from_id_string(s) for s in strings] == values
    assert len(set(strings)) == len(set(map(repr, values)))
    plain = [v for v, s in zip(values, strings) if s == v]
    assert all(type(v) is str for v in plain)


def test_ids_too_large_for_arrow_integers_take_the_escaped_path():
    ids = [2 ** 64 + 1, 1, -(2 ** 70)]
    assert [columnar_text.from_id_string(t) for t in columnar_text.id_strings(ids).to_pylist()] == ids
    pairs = [(2 ** 64 + u, "x") for u in range(60)]
    m = WeightedLaplace(8.0, 1e-6, 10)
    assert m.run_local(per_user_counts(pairs), RK) == {"x"}
    import typing
    with local_pipeline() as p:  # (Beam's own int coder stops at 2**63: made in a step)
        got = (p | beam.Create(range(60))
               | beam.Map(lambda u: (2 ** 64 + u, "x")).with_output_types(typing.Any)
               | SelectPartitions(m, RK))
        assert_that(got, equal_to(["x"]))


def test_select_from_pairs_refuses_input_outside_the_global_window():
    from apache_beam.transforms import window
    with pytest.raises(ValueError, match="global window"):
        p = local_pipeline()
        (p | beam.Create([("u", "a")]) | beam.WindowInto(window.FixedWindows(10))
         | SelectFromPairs(WeightedGaussian(1.0, 1e-6)))


def test_a_shard_sends_at_most_its_true_top_whatever_the_ties(tmp_path):
    # 3000 items held by one user each and a few held by many: a shard's candidates
    # tied at the cut are cut to the query's true top k̄ + 1 before they leave it
    pairs = [(f"u{u}", f"rare{u}") for u in range(3000)]
    pairs += [(f"u{u}", f"top{j}") for j in range(4) for u in range(50 + 10 * j)]
    m = TopKMechanism(3, 4.0, 1e-6, k_bar=5)
    expected = m.run_local(per_user_counts(pairs), RK)
    sent = []
    from beam_dpsu.transforms import columnar_rank
    original = columnar_rank._ShardTopDoFn.process

    def counting(self, element, key_bytes):
        for out in original(self, element, key_bytes):
            sent.append(len(out[1]))
            yield out
    import unittest.mock
    with unittest.mock.patch.object(columnar_rank._ShardTopDoFn, "process", counting):
        with local_pipeline() as p:
            rows, _, _ = p | RankFromText(_files(tmp_path, pairs), m, RK, item_shards=2)
            assert_that(rows, equal_to(expected))
    assert sent and max(sent) <= m.k_bar + 1


def test_the_peeled_top_k_keeps_every_discovered_item_a_candidate():
    # (the files are read twice: an item the second read does not find stays in the
    # exponential mechanism's domain, with 0 users, as item_users gives it)
    from beam_dpsu.dp.randomness.noise import test_seed_material
    from beam_dpsu.transforms.columnar_rank import _PeelDoFn
    m = DiscoverPeelTopK(4, 2.0, 1e-6)
    domain = ["a", "b", "c", "held-by-none"]
    parts = [("counts", (["a", "b"], [5, 2])), ("counts", (["c", "a"], [1, 1]))]
    element = (None, [("domain", x) for x in domain] + parts)
    rows = list(_PeelDoFn(m).process(element, test_seed_material(77)))
    assert rows == m.peel({"a": 6, "b": 2, "c": 1, "held-by-none": 0}, RK)
    assert len(rows) == 4
