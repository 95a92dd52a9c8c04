"""The columnar path (dp.data.columnar, transforms.columnar): the same per-user data, samples,
histogram and release as the dict path, on blocks of arrays."""
import io
import itertools
import random

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to
from scipy import stats

from beam_dpsu.dp.randomness import buffers
from beam_dpsu.dp.data import columnar, columnar_sampling, columnar_text
from beam_dpsu.dp.mechanisms import on_blocks
from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.dp.data.contribution import (item_scores, per_user_counts, sample_items,
                                       sampling_keys, user_keys)
from beam_dpsu.dp.data.lines import iter_raw_blocks, parse_line
from beam_dpsu.dp.mechanisms import (CountGaussian, CountLaplace, TruncatedGeometric,
                                     WeightedGaussian, WeightedGaussianZcdp, WeightedLaplace)
from beam_dpsu.dp.mechanisms.sips import Sips
from beam_dpsu.dp.randomness.noise import STR_TAG, RunKey
from beam_dpsu.dp.data.weights import add_user_to_histogram
from beam_dpsu.transforms.columnar import SelectFromText

from conftest import local_pipeline

RK = RunKey.from_test_seed(2024)


@pytest.fixture(params=[False, True], ids=["numpy", "compiled"])
def compiled_kernels(request, monkeypatch):
    """Runs a test with the numpy forms of the kernels, then with the compiled kernels
    from the first call (skipped without numba); the value says which."""
    from beam_dpsu.dp.randomness import compiled
    if request.param:
        pytest.importorskip("numba")
        monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
        assert compiled.kernel("smallest_distinct", 1) is not None
    else:
        monkeypatch.setattr(compiled, "kernel", lambda name, work: None)
    return request.param


# -- parsing -----------------------------------------------------------------------


def _expected_parse(lines):
    pairs, bad = [], {}
    for line in lines:
        parsed = parse_line(line)
        if parsed is None:
            bad[line] = bad.get(line, 0) + 1
        else:
            pairs.append(parsed)
    return pairs, bad


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_parse_block_is_parse_line_on_every_line(seed):
    # Random lines over an alphabet of tabs, carriage returns, valid and invalid UTF-8
    # (a lone continuation byte, a truncated sequence, an encoded surrogate).
    rnd = random.Random(seed)
    alphabet = [b"a", b"b", b"\t", b"\r", "é".encode(), "€".encode(), b"\xff", b"\xe2\x82",
                b"\xed\xa0\x80", b"x", b" ", b"\x00"]
    weights = [8, 8, 3, 2, 2, 2, 1, 1, 1, 8, 2, 1]
    lines = [b"".join(rnd.choices(alphabet, weights, k=rnd.randint(0, 9)))
             for _ in range(5000)]
    parsed = columnar_text.parse_block(b"\n".join(lines))
    pairs, bad = _expected_parse(lines)
    assert list(zip(parsed.users.to_pylist(), parsed.items.to_pylist())) == pairs
    assert parsed.malformed == bad
    assert len(pairs) > 500 and len(bad) > 100  # both kinds were exercised


def test_parse_block_edge_lines():
    lines = [b"u\titem\twith\ttabs", b"u\t", b"\tno-user", b"no-tab", b"", b"u\titem\r",
             b"u\titem\r\r", b"u\r\titem", "ü\t✓".encode(), b"u\t\xff"]
    parsed = columnar_text.parse_block(b"\n".join(lines))
    pairs, bad = _expected_parse(lines)
    assert list(zip(parsed.users.to_pylist(), parsed.items.to_pylist())) == pairs
    assert parsed.malformed == bad
    empty = columnar_text.parse_block(b"")
    assert len(empty.users) == 0 and empty.malformed == {b"": 1}


# -- the sampler -------------------------------------------------------------------


def _columnar_histogram(per_user, max_items, weighting, key, groups=5, block_bytes=4000):
    text = "".join(f"{u}\t{i}\n" for u, counts in per_user.items() for i in counts).encode()
    by_group = {}
    for block in iter_raw_blocks(io.BytesIO(text), block_bytes):
        for g, pb in columnar.pair_blocks(columnar_text.parse_block(block), groups).items():
            by_group.setdefault(g, []).append(columnar.PairBlock.from_bytes(pb.to_bytes()))
    hist, users = {}, 0
    for blocks in by_group.values():
        h = columnar.bounded_histogram(blocks, max_items, weighting, key)
        users += h.num_users
        for item, w in zip(h.items.to_pylist(), h.weights.tolist()):
            hist[item] = hist.get(item, 0.0) + w
    return hist, users


def test_messages_round_trip_compressed_or_not_and_each_thread_keeps_its_codecs():
    import threading
    users = pa.DictionaryArray.from_arrays(pa.array([0, 1, 1, 0], pa.int32()),
                                           pa.array(["u\tä", ""]))
    batch = pa.RecordBatch.from_arrays(
        [users, pa.array(["a", "b\r", "", "a" * 10000]), pa.array([1, 2, 3, 4], pa.int64())],
        names=["user", "item", "counts"])
    packed, plain = columnar._to_ipc(batch), columnar._to_ipc(batch, compression=None)
    assert packed[:4] == b"\x28\xb5\x2f\xfd" and plain[:4] == b"\xff\xff\xff\xff"
    assert len(packed) < len(plain)   # the 10,000 a's
    for blob in (packed, plain):
        assert columnar._from_ipc(blob).equals(batch)
    with pytest.raises(ValueError, match="compression"):
        columnar._to_ipc(batch, compression="lz4")
    # zstandard's (de)compressors are not thread-safe: every thread has its own.
    seen = []
    t = threading.Thread(target=lambda: seen.append(columnar._codecs()))
    t.start()
    t.join()
    assert seen[0][0] is not columnar._codecs()[0] and seen[0][1] is not columnar._codecs()[1]
    assert columnar._codecs()[0] is columnar._codecs()[0]


@pytest.mark.parametrize("weighting", ["count", "l1", "l2"])
def test_columnar_histogram_is_the_dict_histogram(weighting):
    per_user = per_user_counts(synthetic.occurrences(600, seed=3))
    key = RK.subkey("sample/0")
    expected = {}
    for user, counts in per_user.items():
        add_user_to_histogram(expected, sample_items(user, counts, 6, key), weighting)
    got, users = _columnar_histogram(per_user, 6, weighting, key)
    assert users == len(per_user)
    assert set(got) == set(expected)
    assert max(abs(got[i] - expected[i]) for i in got) < 1e-9


def test_each_user_keeps_the_subset_sample_items_keeps():
    # Users with many items, spread over blocks and repeated lines: the kept pairs are
    # exactly sample_items' (weights 'count' of one user per group reveal them).
    rnd = random.Random(7)
    per_user = {f"user{u}": {f"it{rnd.randrange(300)}": 1 for _ in range(rnd.randrange(1, 60))}
                for u in range(40)}
    key = RK.subkey("sample/3")
    for user, counts in per_user.items():
        got, _ = _columnar_histogram({user: counts}, 9, "count", key, groups=1, block_bytes=64)
        assert set(got) == set(sample_items(user, counts, 9, key))


def _blocks_of(lines, groups, block_bytes, counted=False):
    text = "".join(f"{u}\t{i}\n" for u, i in lines).encode()
    by_group, base = {}, 0
    for block in iter_raw_blocks(io.BytesIO(text), block_bytes):
        parsed = columnar_text.parse_block(block)
        made = (columnar.counted_pair_blocks(parsed, groups, base) if counted
                else columnar.pair_blocks(parsed, groups))
        for g, pb in made.items():
            by_group.setdefault(g, []).append(pb)
        base += len(block) + 1
    return by_group


@pytest.mark.parametrize("coarse", [False, True])
@pytest.mark.parametrize("counted", [False, True])
def test_presampled_blocks_give_the_same_sample_and_weights(monkeypatch, coarse, counted):
    # Users spread over many small blocks, with repeated lines, most above Δ0: the
    # read stage drops the pairs that cannot be sampled, and every user keeps the same
    # Δ0 items with the same weights (exact equality). ``coarse`` keeps 1 bit of each
    # score: a block holds more items tied at the user's cut than Δ0, all of which must
    # stay (the cut is then settled by canonical bytes).
    from beam_dpsu.dp.data import contribution
    if coarse:
        scores = contribution.item_scores
        for module in (contribution, columnar_sampling):
            monkeypatch.setattr(module, "item_scores",
                                lambda *a, **k: scores(*a, **k) >> np.uint64(63))
    rnd = random.Random(5)
    lines = [(f"user{rnd.randrange(30)}", f"it{rnd.randrange(80)}") for _ in range(12000)]
    key = RK.subkey("sample/0")
    dropped = 0
    for weighting in ("count", "l2"):
        for blocks in _blocks_of(lines, 3, 20000, counted).values():
            pre = [columnar.presample(b, 7, key) for b in blocks]
            dropped += sum(len(b.items) - len(p.items) for b, p in zip(blocks, pre))
            want = columnar.bounded_histogram(blocks, 7, weighting, key)
            got = columnar.bounded_histogram(pre, 7, weighting, key)
            assert dict(zip(got.items.to_pylist(), got.weights.tolist())) == dict(
                zip(want.items.to_pylist(), want.weights.tolist()))
            assert got.num_users == want.num_users
    assert coarse or dropped > 1000  # the test data exercise the cut


@pytest.mark.parametrize("counted", [False, True])
def test_blocks_presampled_whole_are_the_groups_presampled(counted):
    rnd = random.Random(8)
    text = "\n".join(f"user{rnd.randrange(40)}\tit{rnd.randrange(90)}"
                     for _ in range(5000)).encode()
    parsed, key = columnar_text.parse_block(text), RK.subkey("sample/0")

    def make(sample):
        return (columnar.counted_pair_blocks(parsed, 4, 0, sample) if counted
                else columnar.pair_blocks(parsed, 4, sample))

    whole, each = make((6, key)), make(None)
    assert set(whole) == set(each)
    for g, block in whole.items():
        alone = columnar.presample(each[g], 6, key)
        assert block.users.equals(alone.users) and block.items.equals(alone.items)
        assert block.user_index.tolist() == alone.user_index.tolist()
        if counted:
            assert block.counts.tolist() == alone.counts.tolist()
            assert block.first.tolist() == alone.first.tolist()
        assert len(alone.items) < len(each[g].items)


def test_presample_keeps_at_most_delta0_distinct_scores_per_user_and_block():
    per_user = {"a": [f"x{k}" for k in range(50)], "b": ["y1", "y2"]}
    lines = [(u, i) for u, items in per_user.items() for i in items] + [("a", "x3")] * 4
    (blocks,) = _blocks_of(lines, 1, 1 << 20).values()
    key = RK.subkey("sample/0")
    (pre,) = [columnar.presample(b, 5, key) for b in blocks]
    kept = {}
    for u, i in zip(pre.user_index, pre.items.to_pylist()):
        kept.setdefault(pre.users[int(u)].as_py(), set()).add(i)
    assert kept["b"] == {"y1", "y2"}
    assert kept["a"] == set(sample_items("a", dict.fromkeys(per_user["a"], 1), 5, key))


def test_sampler_scores_are_the_user_keyed_siphash_of_the_item():
    key = RK.subkey("sample/0")
    from beam_dpsu.dp.randomness.siphash import siphash24
    a, b = sampling_keys(key)
    user, items = "alice", ["x", "y", "z", "w"]
    k0 = siphash24(a, b"salice")
    k1 = siphash24(b, b"salice")
    data = "".join(items).encode()
    got = item_scores(np.full(4, k0, np.uint64), np.full(4, k1, np.uint64), data,
                      np.arange(4), np.ones(4, np.int64), prefix=STR_TAG)
    user_key = k0.to_bytes(8, "little") + k1.to_bytes(8, "little")
    assert got.tolist() == [siphash24(user_key, b"s" + x.encode()) for x in items]
    kept = sample_items(user, dict.fromkeys(items, 1), 2, key)
    assert set(kept) == {items[j] for j in np.argsort(got)[:2]}


def test_sampled_subsets_are_uniform_and_independent_across_users():
    # 6 items, Δ0 = 2: 15 subsets of probability 1/15. 60,000 users under one key:
    # chi-square of the subsets (uniformity), and of the joint subsets of 30,000 pairs
    # of users (independence: 225 cells of probability 1/225). Each test's
    # false-failure probability is 1e-7 (both together < 1e-6).
    n_users, items, d = 60000, ["a", "b", "c", "d", "e", "f"], 2
    keys = sampling_keys(RunKey.fresh().subkey("sample/0"))
    names = [f"user{u}".encode() for u in range(n_users)]
    ulen = np.array([len(x) for x in names])
    k0, k1 = user_keys(keys, b"".join(names), np.r_[0, np.cumsum(ulen)[:-1]], ulen,
                       prefix=STR_TAG)
    data = "".join(items).encode()
    scores = item_scores(np.repeat(k0, 6), np.repeat(k1, 6), data,
                         np.tile(np.arange(6), n_users), np.ones(6 * n_users, np.int64),
                         prefix=STR_TAG).reshape(n_users, 6)
    kept = np.sort(np.argsort(scores, axis=1)[:, :d], axis=1)
    subsets = {s: k for k, s in enumerate(itertools.combinations(range(6), d))}
    cell = np.array([subsets[tuple(row)] for row in kept.tolist()])
    assert stats.chisquare(np.bincount(cell, minlength=15)).pvalue > 1e-7
    joint = cell[0::2] * 15 + cell[1::2]
    assert stats.chisquare(np.bincount(joint, minlength=225)).pvalue > 1e-7


# -- neighbouring datasets -----------------------------------------------------------


@pytest.mark.parametrize("weighting,norm", [("count", 1), ("l1", 1), ("l2", 2)])
def test_an_added_user_changes_the_columnar_histogram_by_their_own_contribution(
        weighting, norm):
    # Conditions (a)-(c) of docs/mechanisms.md section 3 on the columnar path: H' - H is
    # supported on x's kept items (at most Δ0), each with x's per-item weight, and
    # every other user keeps the same sample.
    per_user = per_user_counts(synthetic.occurrences(300, seed=9))
    key, d = RK.subkey("sample/0"), 5
    base, _ = _columnar_histogram(per_user, d, weighting, key)
    for x_items in (["i1", "i2"], [f"new{k}" for k in range(12)], ["i1"] * 3 + ["i9999"]):
        added = dict(per_user, added_user={i: 1 for i in x_items})
        after, _ = _columnar_histogram(added, d, weighting, key)
        diff = {i: after.get(i, 0.0) - base.get(i, 0.0) for i in set(after) | set(base)}
        moved = {i: v for i, v in diff.items() if abs(v) > 1e-12}
        kept = sample_items("added_user", {i: 1 for i in x_items}, d, key)
        assert set(moved) == set(kept) and len(moved) <= d
        k = len(kept)
        weight = {"count": 1.0, "l1": 1.0 / k, "l2": k ** -0.5}[weighting]
        assert all(abs(v - weight) < 1e-9 for v in moved.values())
        size = sum(abs(v) ** norm for v in moved.values()) ** (1 / norm)
        assert size <= {"count": d, "l1": 1.0, "l2": 1.0}[weighting] + 1e-9


# -- releases ----------------------------------------------------------------------


MECHANISMS = [TruncatedGeometric(1.0, 1e-5, 5), CountLaplace(1.0, 1e-5, 5),
              CountGaussian(1.0, 1e-5, 5), WeightedLaplace(0.5, 1e-5, 3),
              WeightedGaussian(1.0, 1e-5, 5), WeightedGaussianZcdp(0.1, 1e-5, 5)]


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
def test_columnar_release_is_run_local(mechanism):
    per_user = per_user_counts(synthetic.occurrences(2000, seed=5))
    r = mechanism.calibration
    text = "".join(f"{u}\t{i}\n" for u, counts in per_user.items() for i in counts).encode()
    groups = {}
    for block in iter_raw_blocks(io.BytesIO(text), 30000):
        for g, pb in columnar.pair_blocks(columnar_text.parse_block(block), 7).items():
            groups.setdefault(g, []).append(columnar.PairBlock.from_bytes(pb.to_bytes()))
    shards = {}
    for blocks in groups.values():
        h = columnar.bounded_histogram(blocks, r.max_items, r.weighting, RK.subkey("sample/0"))
        for s, blob in columnar.split_by_shard(h, 5).items():
            shards.setdefault(s, []).append(blob)
    rule = mechanism.release_rule(RK)
    released = set()
    for blobs in shards.values():
        released |= set(columnar.release_shard(rule, *columnar.sum_histograms(blobs)))
    expected = mechanism.run_local(per_user, RK)
    assert released == expected and len(expected) > 3


def _write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


@pytest.mark.parametrize("mechanism", MECHANISMS[::2], ids=lambda m: m.name)
def test_select_from_text_releases_what_select_partitions_releases(tmp_path, mechanism):
    pairs = list(synthetic.occurrences(1500, seed=11))
    # two files (a user's lines in both), a BOM, CRLF lines and malformed lines
    lines = [f"{u}\t{i}".encode() for u, i in pairs]
    half = len(lines) // 2
    _write(tmp_path, "a.tsv", [b"\xef\xbb\xbf" + lines[0]] + lines[1:half] + [b"bad", b""])
    _write(tmp_path, "b.tsv", [x + b"\r" for x in lines[half:]] + [b"\tno-user", b"bad"])
    expected = mechanism.run_local(per_user_counts(pairs), RK)
    with local_pipeline() as p:
        released, malformed, users = p | SelectFromText(str(tmp_path / "*.tsv"), mechanism, RK,
                                                        user_groups=3, item_shards=2,
                                                        block_bytes=5000)
        assert_that(released, equal_to(sorted(expected)), label="released")
        assert_that(malformed | beam.CombinePerKey(sum), equal_to(
            [(b"bad", 2), (b"", 1), (b"\tno-user", 1)]), label="malformed")
        assert_that(users | beam.CombineGlobally(sum), equal_to([1500]), label="users")


@pytest.mark.parametrize("dask", [False, True], ids=["reshuffled", "dask-dealt"])
def test_select_from_text_reads_one_file_in_byte_ranges_to_the_same_release(
        tmp_path, monkeypatch, dask):
    # One file cut into ranges of 700 bytes (a BOM, CRLF lines, malformed lines) beside a
    # gz file read whole: the release, malformed lines and users of the whole files'
    # read; every file counted once in input_files. Spread by a Reshuffle, or (Dask's
    # capabilities patched in) matched and dealt when the graph is built.
    import gzip
    from apache_beam.metrics.metric import MetricsFilter
    from beam_dpsu.transforms import runners, textio
    if dask:
        caps = runners.capabilities("DaskRunner")
        monkeypatch.setattr(runners, "capabilities", lambda _: caps)
    pairs = list(synthetic.occurrences(1500, seed=11))
    lines = [f"{u}\t{i}".encode() for u, i in pairs]
    half = len(lines) // 2
    crlf = [x + b"\r" if k % 3 == 0 else x for k, x in enumerate(lines[1:half])]
    _write(tmp_path, "a.tsv", [b"\xef\xbb\xbf" + lines[0]] + crlf[:300] + [b"bad", b""]
           + crlf[300:] + [b"\tno-user", b"bad"])
    (tmp_path / "b.tsv.gz").write_bytes(gzip.compress(b"".join(x + b"\n" for x in lines[half:])))
    pattern = str(tmp_path / "*.tsv*")
    sized = textio.match_sized(pattern)
    # (on the Dask path each range is a Create of its own: fewer, larger ranges there)
    range_bytes = 4000 if dask else 700
    ranged, _ = textio.file_ranges(sized, [path for path, _ in sized], range_bytes)
    assert sum(path.endswith(".gz") for path, _ in ranged) == 1 and len(ranged) > 5
    mechanism = MECHANISMS[4]
    expected = mechanism.run_local(per_user_counts(pairs), RK)
    p = local_pipeline()
    released, malformed, users = p | SelectFromText(pattern, mechanism, RK, user_groups=3,
                                                    item_shards=2, block_bytes=256,
                                                    range_bytes=range_bytes)
    assert_that(released, equal_to(sorted(expected)), label="released")
    assert_that(malformed | beam.CombinePerKey(sum), equal_to(
        [(b"bad", 2), (b"", 1), (b"\tno-user", 1)]), label="malformed")
    assert_that(users | beam.CombineGlobally(sum), equal_to([1500]), label="users")
    result = p.run()
    result.wait_until_finish()
    files = result.metrics().query(MetricsFilter().with_name("input_files"))["counters"]
    assert sum(c.committed for c in files) == 2


def test_only_uncompressed_files_larger_than_a_range_are_cut():
    from beam_dpsu.transforms import textio
    sized = [("a.tsv", 25), ("b.tsv", 10), ("c.tsv.gz", 99), ("d.bz2", 99), ("e.tsv", None)]
    got_sized, got = textio.file_ranges(sized, list(enumerate(p for p, _ in sized)), 10)
    assert got == [(0, ("a.tsv", 0, 10)), (0, ("a.tsv", 10, 20)), (0, ("a.tsv", 20, None)),
                   (1, "b.tsv"), (2, "c.tsv.gz"), (3, "d.bz2"), (4, "e.tsv")]
    assert [size for _, size in got_sized] == [10, 10, 5, 10, 99, 99, None]
    assert textio.file_ranges(sized, [p for p, _ in sized], None) == (sized,
                                                                        [p for p, _ in sized])
    assert textio.file_of("a.tsv") == ("a.tsv", 0, None)
    assert textio.file_of(("a.tsv", 10, 20)) == ("a.tsv", 10, 20)


#: The command line's mechanisms whose release from byte ranges is compared with the
#: whole file's (the policies' record order, GW's first-occurrence tie-break, included).
RANGED_CLI = {"weighted-gaussian": [], "adaptive-2r": [],
              "policy-gaussian": ["--alpha", "5"],
              "gw": ["--alpha", "5", "--tie-break", "first-occurrence"]}


@pytest.mark.parametrize("name", list(RANGED_CLI))
def test_the_command_line_releases_the_same_from_byte_ranges_of_one_file(
        tmp_path, monkeypatch, capsys, name):
    import json
    import os
    from beam_dpsu.pipelines import outputs, runs, select_partitions
    from beam_dpsu.transforms import textio
    pairs = list(synthetic.occurrences(2000, seed=3))
    lines = [f"{u}\t{i}".encode() + (b"\r" if k % 5 == 0 else b"")
             for k, (u, i) in enumerate(pairs)]
    for k in range(len(lines) - 1, 0, -450):
        lines.insert(k, b"bad line")  # malformed lines, spread over the ranges
    bad = lines.count(b"bad line")
    data = _write(tmp_path, "in.tsv", [b"\xef\xbb\xbf" + lines[0]] + lines[1:])
    range_bytes = os.path.getsize(data) // 9 + 1
    assert len(textio.file_ranges([(data, os.path.getsize(data))], [data], range_bytes)[1]) == 9
    layout, used = runs.columnar_layout, []

    def ranged_layout(p, pattern):
        used.append(pattern)
        return dict(layout(p, pattern), range_bytes=range_bytes)

    got = {}
    for split in (False, True):
        if split:
            monkeypatch.setattr(runs, "columnar_layout", ranged_layout)
        prefix, dead = str(tmp_path / f"out-{split}"), str(tmp_path / f"dead-{split}")
        assert select_partitions.main([
            "--input", data, "--output", prefix, "--mechanism", name, "--epsilon", "1",
            "--delta", "1e-5", "--max-items-per-user", "4", "--insecure-test-seed", "5",
            "--dead-letter", dead, *RANGED_CLI[name]]) == 0
        capsys.readouterr()
        with open(prefix + outputs.PRIVATE_SUFFIX) as f:
            details = json.load(f)
        with open(prefix + "-items-00000-of-00001", "rb") as f:
            items = f.read()
        with open(outputs.dead_letter_file(dead), "rb") as f:
            dead_lines = sorted(f.read().split(b"\n"))
        got[split] = (items, details["num_users"], details["malformed_lines"], dead_lines)
    assert used  # the second run read the file in ranges
    assert got[True] == got[False]
    items, users, malformed, _ = got[True]
    assert users == 2000 and malformed == bad > 3 and items.count(b"\n") >= 3


# -- DP-SIPS -------------------------------------------------------------------------


def test_without_items_drops_exactly_the_pairs_of_removed_items():
    per_user = {"u1": {"a": 1, "b": 1, "A": 1}, "u2": {"a": 1}, "u3": {"é": 1, "e\u0301": 1}}
    blocks = [columnar.PairBlock(pa.array(list(per_user)), pa.array(
        [i for counts in per_user.values() for i in counts]), np.array(
        [k for k, counts in enumerate(per_user.values()) for _ in counts], np.int32))]
    pairs = columnar.group_pairs(blocks)
    left = columnar.without_items(pairs, pa.array(["a", "é", "zz"]))

    def as_set(p):
        return {(p.users[u].as_py(), p.items[i].as_py()) for u, i in zip(p.u, p.i)}
    assert as_set(left) == {("u1", "b"), ("u1", "A"), ("u3", "e\u0301")}
    assert columnar.without_items(pairs, pa.array([], pa.string())) is pairs
    back = columnar.GroupPairs.from_bytes(left.to_bytes())
    assert as_set(back) == as_set(left)
    # u2 keeps no pair: it adds nothing to a later round's histogram
    hist = columnar.pairs_histogram(left, None, "count", None)
    assert dict(zip(hist.items.to_pylist(), hist.weights)) == {"b": 1, "A": 1, "e\u0301": 1}


SIPS = [Sips(0.3, 1e-5, 5, 3, 1 / 3), Sips(0.3, 1e-5, 5, 2, 1.0)]


@pytest.mark.parametrize("sips", SIPS, ids=lambda m: f"{len(m.rounds)}-rounds")
def test_columnar_sips_is_run_local_round_by_round(tmp_path, sips):
    # Every round's sample, weights and rule on the items earlier rounds left: the
    # pure columnar run releases run_local's set, and every round releases something
    # (so a wrong removal would show).
    pairs = list(synthetic.occurrences(3000, seed=5))
    path = _write(tmp_path, "a.tsv", [f"{u}\t{i}".encode() for u, i in pairs])
    expected = sips.run_local_with_rounds(per_user_counts(pairs), RK)
    assert set(expected.values()) == set(range(len(sips.rounds)))
    got, users, bad = on_blocks.release_from_files([path], sips, RK, user_groups=7,
                                                  item_shards=3, block_bytes=20000)
    assert got == set(expected) and users == 3000 and not bad


@pytest.mark.parametrize("side_inputs_once", [True, False])
def test_select_from_text_runs_sips_with_either_removal(tmp_path, monkeypatch,
                                                        side_inputs_once):
    # The released items reach the groups as a side input, or (as on Dask, whose
    # capabilities are patched in here) through one GroupByKey: the same release.
    from beam_dpsu.transforms import runners
    if not side_inputs_once:
        dask = runners.capabilities("DaskRunner")
        monkeypatch.setattr(runners, "capabilities", lambda _: dask)
    pairs = list(synthetic.occurrences(2000, seed=11))
    _write(tmp_path, "a.tsv", [f"{u}\t{i}".encode() for u, i in pairs] + [b"bad"])
    sips = SIPS[0]
    expected = sips.run_local(per_user_counts(pairs), RK)
    with local_pipeline() as p:
        released, malformed, users = p | SelectFromText(str(tmp_path / "a.tsv"), sips, RK,
                                                        user_groups=5, item_shards=3,
                                                        block_bytes=4000)
        assert_that(released, equal_to(sorted(expected)), label="released")
        assert_that(malformed, equal_to([(b"bad", 1)]), label="malformed")
        assert_that(users | beam.CombineGlobally(sum), equal_to([2000]), label="users")


def test_select_from_text_refuses_other_mechanisms_and_bad_counts():
    with pytest.raises(ValueError, match="histogram mechanisms"):
        SelectFromText("x", object())
    with pytest.raises(ValueError, match="removal='side-input'"):
        SelectFromText("x", Sips(0.3, 1e-5, removal="join"))
    with pytest.raises(ValueError, match="user_groups"):
        SelectFromText("x", WeightedGaussian(1.0, 1e-5), user_groups=0)
    with pytest.raises(ValueError, match="item_shards"):
        SelectFromText("x", WeightedGaussian(1.0, 1e-5), item_shards=True)
    with pytest.raises(ValueError, match="file_pattern"):
        SelectFromText("", WeightedGaussian(1.0, 1e-5))


def test_identity_is_exact_even_when_groups_collide():
    # One group and one shard for everyone: every user and item meets every other; ids
    # that differ by a byte (or by case, or normalisation) stay distinct.
    names = ["a", "A", "a ", "é", "e\u0301", "0", "00"]
    per_user = {u: {i: 1 for i in names} for u in names}
    hist, users = _columnar_histogram(per_user, None, "count", RK.subkey("s"), groups=1)
    assert users == len(names)
    assert hist == {i: float(len(names)) for i in names}
    assert columnar_text.string_groups(pa.array(names), 1).tolist() == [0] * len(names)


def test_the_numpy_fallbacks_equal_the_compiled_kernels(monkeypatch):
    # Without numba (or before a process has enough work for it) the columnar functions
    # use numpy forms of the kernels: the same results.
    pytest.importorskip("numba")
    from beam_dpsu.dp.randomness import compiled
    monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
    rnd = random.Random(4)
    lines = [f"u{rnd.randrange(50)}\t{'x' * rnd.randrange(4)}{rnd.randrange(30)}".encode()
             for _ in range(3000)]
    block = b"\n".join(lines)
    with_kernels = columnar.pair_blocks(columnar_text.parse_block(block), 3)
    data = np.frombuffer(block, np.uint8)
    a = np.array([0, 5, 9, 100]); b = np.array([5, 0, 9, 101]); n = np.array([3, 3, 0, 2])
    expected = [block[x:x + k] == block[y:y + k] for x, y, k in zip(a, b, n)]
    assert columnar._spans_equal(data, a, b, n).tolist() == expected
    assert compiled.kernel("compare_spans", 1) is not None
    monkeypatch.setattr(compiled, "kernel", lambda name, work: None)
    assert columnar._spans_equal(data, a, b, n).tolist() == expected
    fallback = columnar.pair_blocks(columnar_text.parse_block(block), 3)
    assert set(fallback) == set(with_kernels)
    # the line scan: every kind of line, CR, tabs in the item, no tab, non-ASCII, empty
    odd = b"\n".join([b"a\tb", b"", b"\r", b"u\t\tx\r", b"nolinetab", b"\tx", b"\xc3\xa9\t1",
                      b"\xff\tbad", b"u\t", b"v\tw\r\r", b"end"])
    for text in (block, odd, b"", b"\n\n", b"x\ty"):
        buf = np.frombuffer(text, np.uint8)
        monkeypatch.undo()
        monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
        count = text.count(b"\n") + 1
        compiled_spans = columnar_text._line_spans(buf, count)
        compiled_parse = columnar_text.parse_block(text)
        monkeypatch.setattr(compiled, "kernel", lambda name, work: None)
        numpy_spans = columnar_text._line_spans(buf, count)
        for x, y in zip(compiled_spans[:3], numpy_spans[:3]):
            assert x.tolist() == y.tolist()
        assert bool(compiled_spans[3]) == numpy_spans[3]
        numpy_parse = columnar_text.parse_block(text)
        assert compiled_parse.users.equals(numpy_parse.users)
        assert compiled_parse.items.equals(numpy_parse.items)
        assert compiled_parse.malformed == numpy_parse.malformed
        assert compiled_parse.offsets.tolist() == numpy_parse.offsets.tolist()
    monkeypatch.setattr(compiled, "kernel", lambda name, work: None)

    def pairs_of(blocks):
        return [(x.users[int(k)].as_py(), item) for x in blocks.values()
                for k, item in zip(x.user_index, x.items.to_pylist())]

    # the same pairs; with the kernels a user's repeats in the block are dropped
    distinct = {tuple(line.decode().split("\t", 1)) for line in lines}
    assert set(pairs_of(fallback)) == distinct and len(pairs_of(fallback)) == len(lines)
    assert sorted(pairs_of(with_kernels)) == sorted(distinct)
    for g in with_kernels:
        assert with_kernels[g].users.equals(fallback[g].users)
    # odd lines (CR, tabs and non-ASCII in items, empty items, malformed lines) repeated
    odd_lines = [b"a\tb", b"", b"u\t\tx\r", b"\tx", b"\xc3\xa9\t1", b"\xff\tbad", b"u\t",
                 b"v\tw\r\r", b"a\tb\r", b"u\t\xc3\xa9", b"nolinetab"]
    text = b"\n".join(rnd.choice(odd_lines) for _ in range(400))
    fallback = columnar.pair_blocks(columnar_text.parse_block(text), 2)
    monkeypatch.undo()
    monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
    with_kernels = columnar.pair_blocks(columnar_text.parse_block(text), 2)
    assert set(pairs_of(with_kernels)) == set(pairs_of(fallback))
    assert len(pairs_of(with_kernels)) == len(set(pairs_of(fallback))) == 6


def test_user_groups_grow_with_the_input():
    assert columnar.user_groups_for(None) == columnar.COLUMNAR_USER_GROUPS
    assert columnar.user_groups_for(0) == columnar.MIN_USER_GROUPS
    assert columnar.user_groups_for(5 << 20) == columnar.MIN_USER_GROUPS
    assert columnar.user_groups_for(300 << 20) == 300 // 8
    assert columnar.user_groups_for(10 ** 13) == columnar.MAX_USER_GROUPS


def test_item_shards_follow_the_user_groups():
    # a shard sums one partial histogram per group: at most 4 groups per shard beyond
    # the 16 shards every input gets
    assert [columnar.item_shards_for(g) for g in (8, 64, 67, 68, 346, 512)] == [
        16, 16, 16, 17, 86, 128]


def _odd_strings(rnd, n):
    """Byte strings with repeats, empty ones, shared prefixes and non-ASCII bytes."""
    pool = [b"", b"a", b"ab", b"ba", b"abc", "é".encode(), b"x" * 20, b"x" * 21, b"\t"]
    pool += [f"s{k}".encode() for k in range(40)]
    return [rnd.choice(pool) for _ in range(n)]


def _spans_of(strings, rnd):
    """The strings laid out in one buffer with gaps, and their (starts, lengths)."""
    buf, starts = bytearray(), []
    for s in strings:
        buf += b"#" * rnd.randrange(3)
        starts.append(len(buf))
        buf += s
    return (np.frombuffer(bytes(buf), np.uint8), np.array(starts, np.int64),
            np.array([len(s) for s in strings], np.int64))


def test_encode_and_gather_spans_are_exact(monkeypatch, compiled_kernels):
    # encode_spans: one code per distinct byte string, numbered in order of first
    # appearance (a Python dict's numbering); gather_spans: the strings in the order asked.
    rnd = random.Random(11)
    many = [f"d{k}".encode() for k in range(20000)]  # distinct: the table's probes collide
    rnd.shuffle(many)
    for n in (0, 1, 2, 7, 500, 20000):
        strings = _odd_strings(rnd, n) if n < 20000 else many[:15000] + many[:5000]
        buf, starts, lengths = _spans_of(strings, rnd)
        numbering = {}
        expected = [numbering.setdefault(s, len(numbering)) for s in strings]
        # the compiled table's hash start (drawn per process) only places strings
        for basis in ((columnar_text._TABLE_BASIS, 1, 2**64 - 1) if compiled_kernels else (None,)):
            if basis is not None:
                monkeypatch.setattr(columnar_text, "_TABLE_BASIS", np.uint64(basis))
            codes, firsts = columnar_text.encode_spans(buf, starts, lengths)
            assert codes.tolist() == expected
            assert [strings[k] for k in firsts.tolist()] == list(numbering)
        order = np.random.default_rng(n).permutation(n).astype(np.int64)
        got = columnar_text.gather_spans(buf, starts[order], lengths[order])
        assert got.to_pylist() == [strings[k].decode() for k in order.tolist()]


def test_compiled_hash_keys_and_repeats_equal_their_numpy_forms(monkeypatch):
    pytest.importorskip("numba")
    from beam_dpsu.dp.randomness import array_kernels
    rnd = random.Random(12)
    strings = _odd_strings(rnd, 3000)
    buf, starts, lengths = _spans_of(strings, rnd)
    # mixed_fnv against a loop over the bytes
    mask = (1 << 64) - 1

    def fnv(s):
        h = 0xCBF29CE484222325
        for byte in s:
            h = ((h ^ byte) * 0x100000001B3) & mask
        h ^= h >> 29
        h = (h * 0xBF58476D1CE4E5B9) & mask
        return h ^ (h >> 32)

    assert columnar.mixed_fnv(buf, starts, lengths).tolist() == [fnv(s) for s in strings]
    line_code = np.array([rnd.randrange(9) for _ in strings], np.int64)
    index_bits = (len(strings) - 1).bit_length()
    for bits in (4, 10):
        keys = array_kernels.item_keys(buf, starts, lengths, line_code, bits, 0,
                                       np.empty(len(starts), np.uint64))
        # independent: the user code above the high bits of the hash
        assert keys.tolist() == [(c << (64 - bits)) | (fnv(x) >> bits)
                                 for c, x in zip(line_code.tolist(), strings)]
        indexed = array_kernels.item_keys(buf, starts, lengths, line_code, bits, index_bits,
                                          np.empty(len(starts), np.uint64))
        assert indexed.tolist() == [(key >> index_bits << index_bits) | k
                                    for k, key in enumerate(keys.tolist())]
        monkeypatch.setattr(columnar.compiled, "kernel", lambda name, work: None)
        assert keys.tolist() == columnar._item_keys(buf, starts, lengths, line_code,
                                                    bits).tolist()
        assert indexed.tolist() == columnar._item_keys(buf, starts, lengths, line_code,
                                                       bits, index_bits).tolist()
        monkeypatch.undo()
    order = np.argsort(keys)
    s, n, k = starts[order], lengths[order], keys[order]
    repeats = array_kernels.sorted_repeats(buf, s, n, k)
    monkeypatch.setattr(columnar.compiled, "kernel", lambda name, work: None)
    assert repeats.tolist() == columnar._sorted_repeats(buf, s, n, k).tolist()
    ordered = [strings[j] for j in order.tolist()]
    assert repeats.tolist() == [j > 0 and k[j] == k[j - 1] and ordered[j] == ordered[j - 1]
                                for j in range(len(ordered))]
    assert repeats.any()


def test_the_smallest_distinct_scores_kernel_equals_its_numpy_form(monkeypatch):
    # The presample's cut per user: the compiled kernel (owners sorted) and the numpy
    # form (one sort by owner and score) keep the same pairs, ties at the cut included.
    pytest.importorskip("numba")
    from beam_dpsu.dp.randomness import compiled
    rng = np.random.default_rng(11)
    cases = [(np.zeros(0, np.int64), np.zeros(0, np.uint64))]
    for n, owners, values in ((1, 1, 5), (40, 3, 4), (2000, 60, 50), (2000, 5, 2**64)):
        owner = np.sort(rng.integers(0, owners, n))
        scores = rng.integers(0, values, n, dtype=np.uint64) if values < 2**64 else \
            rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2)
        cases.append((owner, scores))
    cases.append((rng.integers(0, 9, 300), rng.integers(0, 30, 300, dtype=np.uint64)))  # unsorted
    monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
    assert compiled.kernel("smallest_distinct", 1) is not None
    monkeypatch.undo()
    for owner, scores in cases:
        for max_items in (1, 2, 3, 10, 5000):
            monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
            fast = columnar_sampling._smallest_distinct(owner, scores, max_items)
            monkeypatch.setattr(compiled, "kernel", lambda name, work: None)
            slow = columnar_sampling._smallest_distinct(owner, scores, max_items)
            monkeypatch.undo()
            # independent: per owner, the max_items-th smallest distinct score is the cut
            expected = np.ones(len(owner), bool)
            for o in np.unique(owner):
                mine = owner == o
                distinct = np.unique(scores[mine])
                if len(distinct) > max_items:
                    expected[mine] = scores[mine] <= distinct[max_items - 1]
            assert fast.tolist() == slow.tolist() == expected.tolist()


def test_dropping_repeats_in_one_pass_equals_the_sorted_repeats(monkeypatch):
    # without_repeats (one pass over the sort order) against sorted_repeats on the
    # reordered arrays, also where distinct strings share a key (a hash collision:
    # both stay) and repeats are not neighbours in the input.
    pytest.importorskip("numba")
    from beam_dpsu.dp.randomness import compiled
    monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
    kernel = compiled.kernel("without_repeats", 1)
    assert kernel is not None
    rnd = random.Random(8)
    items = [rnd.choice(["a", "b", "ab", "ba", "", "x\ty", "é"]) for _ in range(500)]
    text = "\n".join(items).encode()
    data = np.frombuffer(text, np.uint8)
    lengths = np.array([len(i.encode()) for i in items], np.int64)
    starts = np.r_[0, np.cumsum(lengths + 1)[:-1]].astype(np.int64)
    line_code = np.array([rnd.randrange(4) for _ in items], np.int64)
    index_bits = (len(items) - 1).bit_length()
    index = np.arange(len(items), dtype=np.uint64)
    for hashed, keys in (
            (False, (line_code.astype(np.uint64) << np.uint64(index_bits)) | index),  # a
            # user's items on one key
            (True, columnar._item_keys(data, starts, lengths, line_code, 2, index_bits))):
        keys = np.sort(keys)
        order = (keys % np.uint64(1 << index_bits)).astype(np.int64)  # the index bits
        assert sorted(order.tolist()) == list(range(len(items)))
        # independently: in key order, a line is dropped when its bytes equal one of the
        # last RUN_CHECKS lines kept in its run of equal keys above the index
        from beam_dpsu.dp.randomness.array_kernels import RUN_CHECKS
        kept, run, previous = [], [], None
        for j, k in enumerate(order.tolist()):
            upper = int(keys[j]) >> index_bits
            if upper != previous:
                run, previous = [], upper
            elif text[starts[k]:starts[k] + lengths[k]] in run[-RUN_CHECKS:]:
                continue
            run.append(text[starts[k]:starts[k] + lengths[k]])
            kept.append(k)
        expected = (line_code[kept], starts[kept], lengths[kept])
        out = (np.empty(len(order), np.int64), np.empty(len(order), np.int64),
               np.empty(len(order), np.int64))
        m = kernel(data, starts, lengths, keys, index_bits, line_code, *out)
        got = tuple(a[:m] for a in out)
        for x, y in zip(got, expected):
            assert x.tolist() == y.tolist()
        pairs = {(int(c), text[a:a + b]) for c, a, b in zip(*got)}
        # each pair once: with the item's hash in the key, and with a user's 7 distinct
        # items on one key (within RUN_CHECKS of the run)
        assert len(pairs) == len(got[0])
    # the whole step, with and without the one-pass kernel
    full = columnar._drop_repeats(data, starts, lengths, line_code, 4)
    real = compiled.kernel
    monkeypatch.setattr(compiled, "kernel",
                        lambda name, work: None if name == "without_repeats" else real(name, work))
    split = columnar._drop_repeats(data, starts, lengths, line_code, 4)
    for x, y in zip(full, split):
        assert x.tolist() == y.tolist()
    assert sorted({(int(c), text[a:a + b]) for c, a, b in zip(*full)}) == sorted(
        {(int(c), i.encode()) for c, i in zip(line_code, items)})


@pytest.mark.parametrize("big_users, small_users", [(3, 200), (20, 10)])
def test_presample_keeps_sample_items_subset_whoever_holds_most_pairs(
        monkeypatch, compiled_kernels, big_users, small_users):
    # The presample scores every pair in place when the users above Δ0 hold at least half
    # of the block's pairs (20 big users), else only those users' pairs (3 big users
    # among 200 small ones): both keep each big user's sample_items subset, every
    # pair of a user at or below Δ0, with the compiled cut or its numpy form.
    gathered = []
    big_user_scores = columnar_sampling._big_user_scores
    monkeypatch.setattr(columnar_sampling, "_big_user_scores",
                        lambda *a: gathered.append(1) or big_user_scores(*a))
    per_user = {f"big{u}": [f"x{u}.{k}" for k in range(50)] for u in range(big_users)}
    per_user.update({f"small{u}": [f"y{k}" for k in range(2)] for u in range(small_users)})
    lines = [(u, i) for u, items in per_user.items() for i in items]
    (blocks,) = _blocks_of(lines, 1, 1 << 20).values()
    key = RK.subkey("sample/1")
    pre = columnar.presample(blocks[0], 5, key)
    assert bool(gathered) == (big_users == 3)  # only the big users' pairs gathered
    kept = {}
    for u, i in zip(pre.user_index, pre.items.to_pylist()):
        kept.setdefault(pre.users[int(u)].as_py(), set()).add(i)
    assert kept == {u: (set(sample_items(u, dict.fromkeys(items, 1), 5, key))
                        if len(items) > 5 else set(items)) for u, items in per_user.items()}


def test_a_reader_reusing_its_arrays_gets_what_fresh_arrays_give(monkeypatch):
    """``Scratch``: parsing and pairing a file's blocks in arrays reused from block to
    block (larger, smaller, with malformed lines, with and without presampling)
    gives the blocks fresh arrays give, and what ``pair_blocks`` returns holds none
    of the reused arrays (they are overwritten by the next block)."""
    pytest.importorskip("numba")
    from beam_dpsu.dp.randomness import compiled
    monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
    rnd = random.Random(21)

    def block(lines, users):
        rows = [f"u{rnd.randrange(users)}\t{rnd.choice(['a', 'b', 'c', 'é', 'x y'])}"
                f"{rnd.randrange(30)}" for _ in range(lines)]
        rows.insert(rnd.randrange(lines), "no tab here")
        rows.insert(rnd.randrange(lines), "u1\titem\r")
        return "\n".join(rows).encode() + b"\n\xff\tbad"
    blocks = [block(n, u) for n, u in ((3000, 200), (40, 5), (5000, 900), (7, 3), (2500, 60))]
    scratch = buffers.Scratch()
    for sample in (None, (3, b"k" * 16)):
        for text in blocks:
            fresh_parse = columnar_text.parse_block(text)
            fresh = columnar.pair_blocks(fresh_parse, 4, sample)
            parsed = columnar_text.parse_block(text, scratch)
            assert parsed.malformed == fresh_parse.malformed and len(parsed.malformed) == 2
            reused = columnar.pair_blocks(parsed, 4, sample, scratch)
            assert {g: b.to_bytes() for g, b in reused.items()} == {
                g: b.to_bytes() for g, b in fresh.items()}
            held = list(scratch._arrays.values())
            assert len(held) >= 8  # the line scan's, the encoding's, the repeats' ...
            for b in reused.values():
                for a in (b.user_index, b.counts, b.first):
                    assert a is None or not any(np.shares_memory(a, h) for h in held)



def test_the_line_scan_refuses_arrays_of_the_wrong_length():
    # the compiled scan writes without bounds checks: it checks its arrays itself
    pytest.importorskip("numba")
    from beam_dpsu.dp.randomness import array_kernels
    buf = np.frombuffer(b"a\tb\nc\td\ne", np.uint8)
    for lines in (3, 2, 0):
        arrays = [np.empty(lines, np.int64) for _ in range(3)]
        if lines == 3:
            array_kernels.line_spans(buf, *arrays)
            assert arrays[0].tolist() == [0, 4, 8]
        else:
            with pytest.raises(ValueError, match="line"):
                array_kernels.line_spans(buf, *arrays)


def test_a_block_parses_the_same_from_a_memoryview(compiled_kernels):
    # ``dp.data.lines.read_blocks`` hands the parser read-only views into reused buffers:
    # the same lines, items and malformed lines (as bytes) as from a bytes block
    rnd = random.Random(9)
    kinds = [b"u\ti", b"", b"\r", b"nolinetab", b"\tx", b"\xc3\xa9\t1", b"\xff\tbad", b"u\t\tx\r",
             b"v\t\xe2\x82"]
    for _ in range(60):
        block = b"\n".join(rnd.choice(kinds) + str(rnd.randrange(5)).encode()
                           for _ in range(rnd.randrange(1, 80)))
        buffer = bytearray(b"#" + block + b"#")
        view = memoryview(buffer)[1:-1].toreadonly()
        assert columnar_text.count_byte(np.frombuffer(view, np.uint8), 10) == block.count(b"\n")
        want, got = columnar_text.parse_block(block), columnar_text.parse_block(view)
        assert got.malformed == want.malformed
        assert all(type(line) is bytes for line in got.malformed)
        assert got.users.to_pylist() == want.users.to_pylist()
        assert got.items.to_pylist() == want.items.to_pylist()
        assert {g: (b.users.to_pylist(), b.items.to_pylist(), b.user_index.tolist())
                for g, b in columnar.pair_blocks(got, 3).items()} == {
            g: (b.users.to_pylist(), b.items.to_pylist(), b.user_index.tolist())
            for g, b in columnar.pair_blocks(want, 3).items()}
        # what leaves the block holds none of its buffer: the reader may overwrite it
        out = columnar.pair_blocks(columnar_text.parse_block(view), 3,
                                   rnd.choice([None, (1, bytes(range(16)))]))
        sent = {g: b.to_bytes() for g, b in out.items()}
        buffer[:] = b"\t" * len(buffer)
        assert {g: b.to_bytes() for g, b in out.items()} == sent


def test_kernels_writing_into_given_arrays_refuse_wrong_sizes(monkeypatch):
    # the kernels that write to arrays they are given check every size first (an
    # index out of range in compiled code would write outside the array)
    pytest.importorskip("numba")
    from beam_dpsu.dp.randomness import array_kernels
    buf = np.frombuffer(b"abcdef", np.uint8)
    starts, lengths = np.array([0, 2], np.int64), np.array([2, 3], np.int64)
    with pytest.raises(ValueError, match="one length and output per message"):
        array_kernels.siphash24_key(np.uint64(1), np.uint64(2), buf, starts, lengths, -1,
                                    np.empty(3, np.uint64))
    with pytest.raises(ValueError, match="total length"):
        array_kernels.gather_spans(buf, starts, lengths, np.empty(3, np.int32),
                                   np.empty(4, np.uint8))
    with pytest.raises(ValueError, match="n \\+ 1 offsets"):
        array_kernels.gather_spans(buf, starts, lengths, np.empty(2, np.int32),
                                   np.empty(5, np.uint8))
    with pytest.raises(ValueError, match="one score and output per element"):
        array_kernels.smallest_distinct(np.zeros(2, np.int64), np.zeros(2, np.uint64), 1,
                                        np.empty(1, np.bool_))
    with pytest.raises(ValueError, match="one length, code and output"):
        array_kernels.item_keys(buf, starts, lengths, np.zeros(1, np.int64), 1, 1,
                                np.empty(2, np.uint64))
    with pytest.raises(ValueError, match="spans within the buffer"):  # 4 + 3 > 6 bytes
        array_kernels.gather_spans(buf, np.array([0, 4], np.int64), lengths,
                                   np.empty(3, np.int32), np.empty(5, np.uint8))
    for bits, index_bits in ((0, 1), (64, 0), (40, 30), (1, 0 + 1)):  # (1, 1): 2 lines fit
        args = (buf, starts, lengths, np.zeros(2, np.int64), bits, index_bits,
                np.empty(2, np.uint64))
        if (bits, index_bits) == (1, 1):
            array_kernels.item_keys(*args)
            with pytest.raises(ValueError, match="index bits for every line"):  # 3 lines
                array_kernels.item_keys(buf, np.zeros(3, np.int64), np.ones(3, np.int64),
                                        np.zeros(3, np.int64), 1, 1, np.empty(3, np.uint64))
        else:
            with pytest.raises(ValueError, match="1 to 63 user bits"):
                array_kernels.item_keys(*args)
    out = [np.empty(2, np.int64) for _ in range(3)]
    with pytest.raises(ValueError, match="1 to 63 index bits"):
        array_kernels.without_repeats(buf, starts, lengths, np.array([0, 1], np.uint64), 0,
                                      np.zeros(2, np.int64), *out)
    with pytest.raises(ValueError, match="index outside the lines"):  # index 2 of 2 lines
        array_kernels.without_repeats(buf, starts, lengths, np.array([0, 2], np.uint64), 2,
                                      np.zeros(2, np.int64), *out)
    # and is_sorted against its numpy form
    rng = np.random.default_rng(3)
    for a in (np.zeros(0, np.int64), np.array([5]), np.sort(rng.integers(0, 9, 50)),
              rng.integers(0, 9, 50), np.array([1, 1, 0])):
        assert array_kernels.is_sorted(a) == bool(np.all(a[1:] >= a[:-1]))


def test_dropping_repeats_refuses_a_block_too_large_for_packed_keys():
    # user code bits + line index bits must fit in 64: 2^62 users and 8 lines do not
    data = np.frombuffer(b"abcdefgh", np.uint8)
    starts, lengths = np.arange(8, dtype=np.int64), np.ones(8, np.int64)
    with pytest.raises(ValueError, match="read in smaller blocks"):
        columnar._drop_repeats(data, starts, lengths, np.zeros(8, np.int64), 2 ** 62)


def _pair_set(block):
    """A PairBlock's pairs as a sorted list of (user, item, count, first)."""
    users, items = block.users.to_pylist(), block.items.to_pylist()
    counts = [None] * len(items) if block.counts is None else block.counts.tolist()
    first = [None] * len(items) if block.first is None else block.first.tolist()
    return sorted(zip([users[k] for k in block.user_index.tolist()], items, counts, first),
                  key=repr)


@pytest.mark.parametrize("counted", [False, True])
def test_merged_pair_blocks_hold_the_blocks_pairs_and_give_the_same_group(counted):
    # A user's lines spread over many blocks: the merged block holds every pair of the
    # blocks (with its count and first position), each user once, and group_pairs
    # gives the same group from it as from the blocks.
    rnd = random.Random(12)
    lines = [(f"user{rnd.randrange(50)}", f"it{rnd.randrange(70)}") for _ in range(6000)]
    for blocks in _blocks_of(lines, 3, 3000, counted).values():
        assert len(blocks) > 5
        merged = columnar.merge_pair_blocks(blocks)
        assert _pair_set(merged) == sorted((p for b in blocks for p in _pair_set(b)), key=repr)
        users = merged.users.to_pylist()
        assert len(set(users)) == len(users)
        want, got = columnar.group_pairs(blocks), columnar.group_pairs([merged])
        for name in ("users", "items"):
            assert getattr(got, name).equals(getattr(want, name))
        for name in ("u", "i", "counts", "first"):
            a, b = getattr(got, name), getattr(want, name)
            assert (a is None and b is None) or a.tolist() == b.tolist()
        assert columnar.PairBlock.from_bytes(merged.to_bytes()).users.equals(merged.users)
    one = _blocks_of(lines[:10], 1, 3000, counted)[0]
    assert columnar.merge_pair_blocks(one) is one[0]


def test_merging_refuses_no_blocks_and_mixed_counted_blocks():
    rnd = random.Random(13)
    lines = [(f"user{rnd.randrange(5)}", f"it{rnd.randrange(9)}") for _ in range(200)]
    plain, counted = _blocks_of(lines, 1, 10_000)[0], _blocks_of(lines, 1, 10_000, True)[0]
    with pytest.raises(ValueError, match="at least one"):
        columnar.merge_pair_blocks([])
    with pytest.raises(ValueError, match="some blocks have counts"):
        columnar.merge_pair_blocks(plain + counted)


def test_a_pair_buffer_sends_everything_once_it_holds_enough_pairs():
    rnd = random.Random(14)
    lines = [(f"user{rnd.randrange(60)}", f"it{rnd.randrange(90)}") for _ in range(5000)]
    text = "".join(f"{u}\t{i}\n" for u, i in lines).encode()
    by_block = [columnar.pair_blocks(columnar_text.parse_block(b), 4)
                for b in iter_raw_blocks(io.BytesIO(text), 2500)]
    sizes = [sum(len(pb.user_index) for pb in made.values()) for made in by_block]
    limit = 3 * max(sizes)
    buffer = columnar.PairBuffer(limit)
    sent, held = {}, 0
    for made, n in zip(by_block, sizes):
        out = buffer.add(made)
        held += n
        if held >= limit:  # everything held goes, one merged block per group held
            assert out and sum(len(pb.user_index) for pb in out.values()) == held
            held = 0
        else:
            assert out == {}
        for g, pb in out.items():
            sent.setdefault(g, []).append(pb)
    rest = buffer.flush()
    assert sum(len(pb.user_index) for pb in rest.values()) == held and buffer.flush() == {}
    for g, pb in rest.items():
        sent.setdefault(g, []).append(pb)
    every = {}
    for made in by_block:
        for g, pb in made.items():
            every.setdefault(g, []).append(pb)
    assert set(sent) == set(every)
    for g in every:
        assert len(sent[g]) < len(every[g])
        assert sorted((p for b in sent[g] for p in _pair_set(b)), key=repr) == sorted(
            (p for b in every[g] for p in _pair_set(b)), key=repr)
    for bad in (0, -1, 1.5, True, "9"):
        with pytest.raises(ValueError, match="flush_pairs"):
            columnar.PairBuffer(bad)


def test_the_read_stage_sends_the_same_groups_however_often_it_flushes(tmp_path,
                                                                       monkeypatch):
    # FLUSH_PAIRS of 1 (a message per group and block) and the default (one per group
    # and file) release the same items, in one process and on the DirectRunner.
    pairs = list(synthetic.occurrences(800, seed=21))
    lines = [f"{u}\t{i}".encode() for u, i in pairs]
    _write(tmp_path, "a.tsv", lines[:len(lines) // 2])
    _write(tmp_path, "b.tsv", lines[len(lines) // 2:])
    mechanism = MECHANISMS[0]
    expected = mechanism.run_local(per_user_counts(pairs), RK)
    paths = [str(tmp_path / "a.tsv"), str(tmp_path / "b.tsv")]
    for flush in (1, columnar.FLUSH_PAIRS):
        monkeypatch.setattr(columnar, "FLUSH_PAIRS", flush)
        released, users, _ = on_blocks.release_from_files(paths, mechanism, RK, user_groups=3,
                                                         item_shards=2, block_bytes=3000)
        assert released == set(expected) and users == 800
        with local_pipeline() as p:
            out, _, _ = p | SelectFromText(str(tmp_path / "*.tsv"), mechanism, RK,
                                           user_groups=3, item_shards=2, block_bytes=3000)
            assert_that(out, equal_to(sorted(expected)))
