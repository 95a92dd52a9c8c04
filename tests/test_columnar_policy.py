"""The sequential policies on the columnar path (dp.data.columnar_policy,
transforms.columnar): each user's prepared ids are ``policy.prepare``'s, and
``SelectFromText`` releases what the Beam-free core releases."""
import random

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu.dp.data import columnar, columnar_policy, columnar_text
from beam_dpsu.dp.mechanisms import on_blocks
from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.dp.data.contribution import per_user_counts
from beam_dpsu.dp.mechanisms.base import run_local
from beam_dpsu.dp.mechanisms.policy import GW, GWKT, PolicyGaussian, PolicyLaplace
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms.columnar import SelectFromText

from conftest import local_pipeline

RK = RunKey.from_test_seed(31)
PUBLIC = {"i1": 500, "i2": 40, "i7": 40, "i30": 3}

MECHANISMS = [
    PolicyLaplace(1.0, 1e-5, 4), PolicyGaussian(1.0, 1e-5, 4), GW(1.0, 1e-5, max_items=3),
    GW(1.0, 1e-5, max_items=3, tie_break="first-occurrence"),
    GW(1.0, 1e-5, variant="published"),
    GW(1.0, 1e-5, variant="published", tie_break="first-occurrence"),
    GWKT(1.0, 1e-5, PUBLIC, max_items=3), GWKT(1.0, 1e-5, PUBLIC, max_items=3,
                                               tie_break="first-occurrence"),
    GWKT(1.0, 1e-5, PUBLIC, max_items=3, kt_selection="front")]


def _label(m):
    return "-".join(str(x) for x in (m.name, getattr(m, "variant", ""),
                                     getattr(m, "tie_break", ""),
                                     getattr(m, "kt_selection", "")))


def _shuffled_pairs(users: int, seed: int):
    """Synthetic pairs, a user's lines spread over the input (so record order matters)."""
    pairs = list(synthetic.occurrences(users, seed=seed))
    random.Random(seed).shuffle(pairs)
    return pairs


def _group_pairs(pairs, groups: int, parts: int):
    """The counted pairs of each user group, from ``parts`` blocks read in turn."""
    blocks, base = {}, 0
    cut = np.linspace(0, len(pairs), parts + 1).astype(int)
    for a, b in zip(cut[:-1], cut[1:]):
        text = "\n".join(f"{u}\t{i}" for u, i in pairs[a:b]).encode()
        for g, block in columnar.counted_pair_blocks(columnar_text.parse_block(text), groups,
                                                     base).items():
            blocks.setdefault(g, []).append(columnar.PairBlock.from_bytes(block.to_bytes()))
        base += len(text) + 1
    return {g: columnar.group_pairs(b) for g, b in blocks.items()}


def test_counted_pairs_are_the_per_user_counts_in_record_order():
    pairs = _shuffled_pairs(300, 4)
    expected = per_user_counts(pairs)
    got = {}
    for gp in _group_pairs(pairs, 5, 4).values():
        for k in np.argsort(gp.first, kind="stable"):
            user, item = gp.users[gp.u[k]].as_py(), gp.items[gp.i[k]].as_py()
            got.setdefault(user, {})[item] = int(gp.counts[k])
    assert got == expected
    # the same items in the same order: record order, not just the same counts
    assert all(list(got[u]) == list(expected[u]) for u in expected)


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=_label)
def test_each_user_is_prepared_as_policy_prepare_prepares(mechanism):
    pairs = _shuffled_pairs(400, 7)
    policy = mechanism.policy(RK)
    public = PUBLIC if isinstance(mechanism, GWKT) else None
    got, item_ids = {}, {}
    for gp in _group_pairs(pairs, 4, 3).values():
        prepared = columnar_policy.prepare_pairs(gp, policy, public)
        ends = np.cumsum(prepared.lengths)
        for user, end, n in zip(prepared.users, ends, prepared.lengths):
            got[user] = prepared.ids[end - n:end].tolist()
        item_ids.update(prepared.item_ids)
    expected = {}
    for user, counts in per_user_counts(pairs).items():
        ids, _ = policy.prepare(user, counts, public)
        if ids:
            expected[user] = ids
    assert got == expected  # the same ids in the same order
    assert any(len(v) > 2 for v in got.values())
    assert item_ids == {it: policy.item_ids(it) for it in item_ids}
    used = {i for ids in got.values() for i in ids}
    assert set(item_ids.values()) == used


def test_a_sampled_policy_orders_its_ids_whatever_the_order_of_the_counts():
    # The descent updates sum over a user's items in the order of its ids: the same
    # floats whichever order a runner merged the user's counts in.
    policy = PolicyGaussian(1.0, 1e-5, 6).policy(RK)
    counts = {f"i{k}": 1 + k % 3 for k in range(20)}
    ids, items = policy.prepare("u", counts)
    assert ids == sorted(ids) and len(ids) == 6
    assert ids == [policy.item_ids(item) for item in items]
    assert policy.prepare("u", dict(reversed(list(counts.items())))) == (ids, items)


def test_only_the_sampled_mechanisms_are_presampled():
    # A presample cut is exact only for the Δ0 sample of one round: GW's K_i follows a
    # user's counts over the whole input, DP-SIPS's later rounds sample again.
    from beam_dpsu.dp.mechanisms import WeightedGaussian
    from beam_dpsu.dp.mechanisms.sips import Sips
    for m in (PolicyLaplace(1.0, 1e-5, 4), PolicyGaussian(1.0, 1e-5, 7)):
        assert on_blocks.presample_plan(m, RK) == (m.max_items, RK.subkey("sample/0"))
    assert on_blocks.presample_plan(WeightedGaussian(1.0, 1e-5, 9), RK) == (
        9, RK.subkey("sample/0"))
    for m in (GW(1.0, 1e-5), GW(1.0, 1e-5, variant="published"), GWKT(1.0, 1e-5, PUBLIC),
              Sips(0.3, 1e-5, 5, 3, 1 / 3)):
        assert on_blocks.presample_plan(m, RK) is None


def test_line_positions_order_files_then_offsets_and_refuse_what_does_not_fit():
    positions = [columnar_text.line_position(f, o) for f in (0, 1, 7) for o in (0, 5, 1 << 40)]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    last = columnar_text.MAX_FILES - 1
    assert columnar_text.line_position(last, (1 << columnar_text.FILE_SHIFT) - 2, 1) < 1 << 63
    with pytest.raises(ValueError, match="input files"):
        columnar_text.line_position(columnar_text.MAX_FILES, 0)
    with pytest.raises(ValueError, match="bytes of text"):
        columnar_text.line_position(0, (1 << columnar_text.FILE_SHIFT) - 10, 10)
    with pytest.raises(ValueError, match="bytes of text"):
        columnar_text.line_position(0, -1)


def test_prepare_refuses_pairs_without_counts_or_positions():
    empty = columnar_policy.prepare_pairs(columnar.group_pairs([]), GW(1.0, 1e-5).policy(RK))
    assert empty.users == [] and len(empty.ids) == 0 and empty.item_ids == {}
    pairs = columnar.GroupPairs(pa.array(["u"]), pa.array(["a"]), np.zeros(1, np.int64),
                                np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="counted pairs"):
        columnar_policy.prepare_pairs(pairs, GW(1.0, 1e-5).policy(RK))
    pairs.counts = np.ones(1, np.int64)
    with pytest.raises(ValueError, match="first positions"):
        columnar_policy.prepare_pairs(pairs, GW(1.0, 1e-5, tie_break="first-occurrence")
                                      .policy(RK))


def _write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


@pytest.mark.parametrize("mechanism", [MECHANISMS[k] for k in (0, 1, 2, 3, 6, 8)], ids=_label)
def test_select_from_text_releases_what_the_core_releases(tmp_path, mechanism):
    # Three files in record order, a user's lines in several of them, a BOM, CRLF
    # lines and malformed lines; blocks small enough that a file has several.
    pairs = _shuffled_pairs(1500, 11)
    lines = [f"{u}\t{i}".encode() for u, i in pairs]
    third = len(lines) // 3
    _write(tmp_path, "a.tsv", [b"\xef\xbb\xbf" + lines[0]] + lines[1:third] + [b"bad"])
    _write(tmp_path, "b.tsv", [x + b"\r" for x in lines[third:2 * third]] + [b""])
    _write(tmp_path, "c.tsv", lines[2 * third:])
    expected = run_local(per_user_counts(pairs), mechanism, RK)
    assert len(expected) > 3
    if getattr(mechanism, "tie_break", None) == "first-occurrence":  # the data can tell
        files_swapped = pairs[third:2 * third] + pairs[:third] + pairs[2 * third:]
        assert run_local(per_user_counts(files_swapped), mechanism, RK) != expected
    with local_pipeline() as p:
        released, malformed, users = p | SelectFromText(str(tmp_path / "*.tsv"), mechanism, RK,
                                                        user_groups=3, block_bytes=3000)
        assert_that(released, equal_to(sorted(expected)), label="released")
        assert_that(malformed | beam.CombinePerKey(sum), equal_to([(b"bad", 1), (b"", 1)]),
                    label="malformed")
        assert_that(users | beam.CombineGlobally(sum), equal_to([1500]), label="users")
