"""Exact identity of user ids and items, and the byte-order mark of input files.

User ids and items must be str, bytes, int (numpy integers become the equal
int) or tuples of these; anything else is refused with one clear error
(``dp.data.contribution.canonical_id``), on every path: the local core, the Beam
transforms and the auditor. Within the accepted types Python equality (which
groups users and items) is exactly equality of ``noise.encode_value`` (which
keys every hash and noise draw). A UTF-8 byte-order mark at the start of an
input file is removed on every read path.
"""
import collections
import contextlib
import enum
import gzip
import io
import itertools
import math
import random
import time

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu.dp.data import lines
from beam_dpsu.dp.evaluation.audit import Scenario
from beam_dpsu.dp.data.contribution import (MAX_INT_ID_DIGITS, IdTypeError, canonical_counts,
                                       canonical_id, canonical_pair, canonical_per_user,
                                       per_user_counts)
from beam_dpsu.dp.mechanisms.base import run_local
from beam_dpsu.dp.mechanisms.histogram_threshold import WeightedGaussian
from beam_dpsu.dp.mechanisms.policy import PolicyGaussian
from beam_dpsu.dp.randomness.noise import RunKey, encode_value
from beam_dpsu.transforms.bounding import PerUserItemCounts, has_canonical_ids
from beam_dpsu.transforms.histogram import WeightedHistogram
from beam_dpsu.transforms.select import SelectPartitions
from beam_dpsu.transforms.textio import ReadUserItems, read_per_user

from conftest import local_pipeline, transform_labels


class Colour(enum.IntEnum):
    RED = 3


Point = collections.namedtuple("Point", "x y")


# ---------------------------------------------------------------------------
# The rule, as a pure function.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [
    ("alice", "alice"), ("", ""), (b"\xff\x00", b"\xff\x00"), (0, 0), (-7, -7),
    (2 ** 64 + 1, 2 ** 64 + 1), (-(10 ** MAX_INT_ID_DIGITS - 1), -(10 ** MAX_INT_ID_DIGITS - 1)),
    ((), ()), (("a", 1, b"b", ("c", (2,))), ("a", 1, b"b", ("c", (2,)))),
    (np.int64(5), 5), (np.uint64(2 ** 64 - 1), 2 ** 64 - 1), (np.int8(-3), -3),
    (Colour.RED, 3), (np.str_("x"), "x"), (np.bytes_(b"y"), b"y"),
    (Point(1, "a"), (1, "a")), (("a", np.int32(2), (np.int16(1),)), ("a", 2, (1,))),
])
def test_canonical_id_accepts_str_bytes_int_and_tuples_as_their_plain_value(value, expected):
    out = canonical_id(value)
    assert out == expected
    assert type(out) is type(expected)
    assert encode_value(out) == encode_value(expected)
    if isinstance(out, tuple):
        assert [type(e) for e in out] == [type(e) for e in expected]


@pytest.mark.parametrize("value,type_name", [
    (True, "bool"), (False, "bool"), (1.0, "float"), (float("nan"), "float"), (None, "NoneType"),
    (np.float64(1.0), "numpy.float64"), (np.bool_(True), "numpy.bool"),
    (frozenset({"a"}), "frozenset"), (complex(1, 0), "complex"), ([1], "list"),
    (("a", 1.5), "float"), (("a", ("b", None)), "NoneType"),
])
def test_every_other_type_is_refused_with_one_line_naming_it(value, type_name):
    for what in ("user id", "item"):
        with pytest.raises(IdTypeError) as err:
            canonical_id(value, what)
        message = str(err.value)
        assert "\n" not in message
        assert f"of type {type_name} is not accepted" in message
        assert what in message
        assert "str, bytes, int" in message
        # Catchable as either built-in kind.
        assert isinstance(err.value, TypeError) and isinstance(err.value, ValueError)


def test_huge_ints_are_refused_and_the_error_never_shows_the_value():
    with pytest.raises(IdTypeError, match="more than 600 decimal digits"):
        canonical_id(10 ** MAX_INT_ID_DIGITS)
    with pytest.raises(IdTypeError, match="more than 600 decimal digits"):
        canonical_id(("a", -(10 ** 700)), "item")
    with pytest.raises(IdTypeError) as err:
        canonical_id(("secret-user-name", 0.5))
    assert "secret-user-name" not in str(err.value)


def _accepted_values():
    """Accepted values chosen to be close to each other: equal-looking text in every
    type, nested tuples, signs, big ints, surrogates, quotes and separators."""
    out = ["", "1", "01", "-0", "0", "a", "A", "é", "e\u0301", "\ud800", "\ud83d\ude00", "😀",
           "'", '"', "', '", "(1,)", "b'1'", "\x00", "a\tb",
           b"", b"1", b"0", b"a", b"\xff", b"'", b"\xed\xa0\x80",
           0, -0, 1, -1, 10, 2 ** 63, 2 ** 64, -(2 ** 64), 10 ** 30, -(10 ** 30),
           10 ** (MAX_INT_ID_DIGITS - 1), 10 ** MAX_INT_ID_DIGITS - 1,
           (), (1,), ("1",), (b"1",), ((1,),), (((),),), ((), ()), (1, "a"), ("a", 1), (1, 2),
           (12,), ("1", "2"), ("1, '2'",), ("a', 'b",), ("a", "b"), (b"a", "a"), (0, (0,)),
           (-1,), (2 ** 64,)]
    rng = random.Random(7)
    atoms = ["", "x", "1", "'", b"x", b"1", 0, 1, -1, 2 ** 70]
    for _ in range(300):
        depth_one = tuple(rng.choice(atoms) for _ in range(rng.randrange(4)))
        out.append(depth_one)
        out.append((rng.choice(atoms), depth_one))
    return out


def test_equality_of_accepted_values_is_equality_of_their_encoded_bytes():
    values = _accepted_values()
    encoded = [encode_value(canonical_id(v)) for v in values]
    for (a, ea), (b, eb) in itertools.combinations(zip(values, encoded), 2):
        assert (a == b) == (ea == eb), (a, b)
        if a == b:
            assert hash(a) == hash(b)
    # The converted numpy forms encode exactly as the plain ints they equal.
    for v in (0, -5, 2 ** 40):
        assert encode_value(canonical_id(np.int64(v))) == encode_value(v)


def test_the_refused_types_are_those_where_python_and_the_hashes_disagree():
    # What the rule prevents: equal in Python (one dict key), different to the hashes.
    for a, b in [(1, True), (1, 1.0), (0, -0.0), (1, np.int64(1))]:
        assert a == b and hash(a) == hash(b)
        assert encode_value(a) != encode_value(b)
    assert len({1: 0, True: 0, 1.0: 0}) == 1


def test_canonical_pair_counts_and_per_user():
    pair = ("u", "i")
    assert canonical_pair(pair) is pair
    assert canonical_pair(["u", "i"]) == ("u", "i")
    assert canonical_pair((np.int64(1), np.int32(2))) == (1, 2)
    counts = {"a": 1, "b": 2}
    assert canonical_counts(counts) is counts
    assert canonical_counts({np.int64(4): 2, "x": 1}) == {4: 2, "x": 1}
    with pytest.raises(IdTypeError, match="an item of type float"):
        canonical_counts({"a": 1, 2.5: 1})
    per_user = {"u": {"a": 1}}
    assert canonical_per_user(per_user) is per_user
    converted = canonical_per_user({np.int64(1): {np.int64(2): 3}})
    assert converted == {1: {2: 3}} and type(next(iter(converted))) is int
    with pytest.raises(IdTypeError, match="a user id of type bool"):
        canonical_per_user({True: {"a": 1}})


# ---------------------------------------------------------------------------
# The local path and the neighbouring datasets.
# ---------------------------------------------------------------------------

D = [(1, "a")]
TWENTY = [f"t{j}" for j in range(20)]


def test_per_user_counts_converts_numpy_ints_and_refuses_other_types():
    per_user = per_user_counts([(1, "a"), (np.int64(1), "b"), ("1", np.int64(7)), ("1", 7)])
    assert per_user == {1: {"a": 1, "b": 1}, "1": {7: 2}}
    assert [type(u) for u in per_user] == [int, str]
    assert type(next(iter(per_user["1"]))) is int
    for bad in [(None, "x"), ("u", None), (1.0, "x"), ("u", 2.5), (True, "x"), ("u", False)]:
        with pytest.raises(IdTypeError):
            per_user_counts([("ok", "fine"), bad])


def test_adding_user_true_to_user_1_is_refused_not_merged():
    # Before the rule, True merged into user 1: H[a] fell from 1.0 to 1/sqrt(21) = 0.218,
    # an l2 change of about 1.25 where the noise is calibrated for 1.
    d_prime = D + [(True, item) for item in ["a"] + TWENTY[:19]]
    with pytest.raises(IdTypeError, match="a user id of type bool"):
        per_user_counts(d_prime)


def test_adding_user_str_1_is_a_second_user_with_the_right_weight():
    mechanism = WeightedGaussian(1.0, 1e-6, max_items=100)
    key = RunKey.from_test_seed(11)
    h = mechanism.histogram_local(per_user_counts(D), key)
    d_prime = D + [("1", item) for item in ["a"] + TWENTY[:19]]
    per_user = per_user_counts(d_prime)
    assert set(per_user) == {1, "1"}
    h_prime = mechanism.histogram_local(per_user, key)
    assert h == {"a": 1.0}
    # The added user holds 20 items, each weighted 1/sqrt(20).
    assert h_prime["a"] == pytest.approx(1.0 + 1.0 / math.sqrt(20), rel=1e-12)
    diff = {u: h_prime.get(u, 0.0) - h.get(u, 0.0) for u in set(h) | set(h_prime)}
    assert math.sqrt(sum(v * v for v in diff.values())) == pytest.approx(1.0, rel=1e-12)


def test_sequential_policy_sees_numpy_and_plain_ints_as_one_item():
    mechanism = PolicyGaussian(2.0, 1e-5, max_items=5)
    plain = [(f"u{i}", i % 3) for i in range(60)] + [(f"u{i}", 7) for i in range(60)]
    mixed = [(u, np.int64(item) if k % 2 else item) for k, (u, item) in enumerate(plain)]
    key = RunKey.from_test_seed(5)
    released = run_local(per_user_counts(mixed), mechanism, key)
    assert released == run_local(per_user_counts(plain), mechanism, key)
    assert all(type(item) is int for item in released)


def test_auditor_datasets_are_canonical_and_a_true_neighbouring_pair():
    events = []
    sc = Scenario("custom", "first", {np.int64(1): {"a": 1}}, "1", {"a": 1}, events, b"k" * 32)
    d, d_prime = sc.datasets()
    assert d == {1: {"a": 1}} and type(next(iter(d))) is int
    assert d_prime == {1: {"a": 1}, "1": {"a": 1}}
    same_user = Scenario("custom", "first", {1: {"a": 1}}, np.int64(1), {"b": 1}, events,
                         b"k" * 32)
    with pytest.raises(ValueError, match="D plus one user"):
        same_user.datasets()
    merged = Scenario("custom", "first", {1: {"a": 1}}, True, {"b": 1}, events, b"k" * 32)
    with pytest.raises(IdTypeError, match="a user id of type bool"):
        merged.datasets()


# ---------------------------------------------------------------------------
# The Beam path.
# ---------------------------------------------------------------------------

def test_per_user_item_counts_default_design_checks_ids_inside_its_bundle_dofn():
    # On a runner that keeps finish_bundle outputs, the ids are checked where the
    # occurrences are counted: no step per occurrence is added.
    with local_pipeline() as p:
        _ = p | beam.Create([("u", "a")]) | PerUserItemCounts()
    labels = transform_labels(p)
    assert any(label.endswith("AggregateInBundle") for label in labels)
    assert not any(label.endswith("CanonicalIds") for label in labels)


@pytest.mark.parametrize("design", [None, "combine", "bundle-dofn"])
def test_per_user_item_counts_converts_numpy_ints_in_beam(design):
    occ = [(1, "a"), (np.int64(1), "b"), ("1", "a"), (("t", np.int32(2)), np.int64(9)),
           (("t", 2), 9)]
    with local_pipeline() as p:
        out = p | beam.Create(occ) | PerUserItemCounts(design=design)
        assert has_canonical_ids(out)
        assert_that(out, equal_to([(1, {"a": 1, "b": 1}), ("1", {"a": 1}),
                                   (("t", 2), {9: 2})]))


@pytest.mark.parametrize("design", [None, "combine", "bundle-dofn"])
@pytest.mark.parametrize("bad,message", [
    ((True, "t0"), "a user id of type bool"), ((None, "x"), "a user id of type NoneType"),
    (("u", None), "an item of type NoneType"), (("u", 1.5), "an item of type float")])
def test_per_user_item_counts_fails_the_pipeline_on_a_refused_type(design, bad, message):
    occ = D + [bad] + [("u", t) for t in TWENTY]
    with pytest.raises(IdTypeError, match=message):
        with local_pipeline() as p:
            _ = p | beam.Create(occ) | PerUserItemCounts(design=design)


def test_beam_histogram_of_the_neighbours_in_beam():
    d_prime = D + [("1", item) for item in ["a"] + TWENTY[:19]]
    with local_pipeline() as p:
        out = p | beam.Create(d_prime) | PerUserItemCounts() | WeightedHistogram("l2")
        w = 1.0 / math.sqrt(20)
        expected = [("a", 1.0 + w)] + [(t, w) for t in TWENTY[:19]]
        assert_that(out, equal_to(expected, equals_fn=lambda a, b: a[0] == b[0]
                                  and math.isclose(a[1], b[1], rel_tol=1e-12)))
    with pytest.raises(IdTypeError, match="a user id of type bool"):
        with local_pipeline() as p:
            _ = (p | beam.Create(D + [(True, t) for t in ["a"] + TWENTY[:19]])
                 | PerUserItemCounts() | WeightedHistogram("l2"))


def test_select_partitions_per_user_checks_unmarked_input_only(tmp_path):
    mechanism = WeightedGaussian(2.0, 1e-6, max_items=3)
    key = RunKey.from_test_seed(3)
    # 300 users with weight 1/sqrt(2) on each item: about 80 noise scales above T.
    users = [(np.int64(i), {np.int64(0): 1, "x": 2}) for i in range(300)]
    with local_pipeline() as p:
        out = p | beam.Create(users) | SelectPartitions(mechanism, key, per_user=True)
        typed = out | beam.Map(lambda item: (type(item).__name__, item))
        assert_that(typed, equal_to([("int", 0), ("str", "x")]))
    assert any(label.endswith("CanonicalPerUser") for label in transform_labels(p))
    with pytest.raises(IdTypeError, match="a user id of type bool"):
        with local_pipeline() as p:
            _ = (p | beam.Create([(True, {"a": 1}), (1, {"b": 1})])
                 | SelectPartitions(mechanism, key, per_user=True))
    with pytest.raises(IdTypeError, match="an item of type float"):
        with local_pipeline() as p:
            _ = (p | beam.Create([("u", {1.0: 1})])
                 | SelectPartitions(mechanism, key, per_user=True))
    # The reader's output is str only: no check step.
    (tmp_path / "in.tsv").write_text("".join(f"u{i}\tx\n" for i in range(300)))
    with local_pipeline() as p:
        read = p | ReadUserItems(str(tmp_path / "in.tsv"))
        assert has_canonical_ids(read)
        out = read | SelectPartitions(mechanism, key, per_user=True)
        assert_that(out, equal_to(["x"]))
    assert not any("CanonicalPerUser" in label for label in transform_labels(p))


# ---------------------------------------------------------------------------
# The UTF-8 byte-order mark.
# ---------------------------------------------------------------------------

BOM = b"\xef\xbb\xbf"
# "\ufeffbob" in the middle of a file is a different user id: only offset 0 is stripped.
BOM_TEXT = BOM + b"alice\ta\nalice\tb\n" + BOM + b"bob\tc\ncarol\ta\n"
BOM_EXPECTED = {"alice": {"a": 1, "b": 1}, "\ufeffbob": {"c": 1}, "carol": {"a": 1}}


def _read_lines_module(path, **kwargs):
    users = {}
    for kind, value in lines.read_user_items(str(path), **kwargs):
        if kind == "user":
            user, counts = value
            mine = users.setdefault(user, {})
            for item, c in counts.items():
                mine[item] = mine.get(item, 0) + c
    return users


@pytest.mark.parametrize("block", [1, 2, 3, 4, 5, 17, 1 << 20])
def test_iter_raw_blocks_strips_a_bom_at_offset_0_only(tmp_path, block):
    path = tmp_path / "bom.tsv"
    path.write_bytes(BOM_TEXT)
    with open(path, "rb") as f:
        joined = b"\n".join(lines.iter_raw_blocks(f, block))
    assert joined == BOM_TEXT[3:-1]
    assert _read_lines_module(path, block_bytes=block) == BOM_EXPECTED


@pytest.mark.parametrize("content,expected", [
    (BOM, []), (BOM + b"\n", [b""]), (BOM[:2], [BOM[:2]]), (BOM + BOM + b"u\ti", [BOM + b"u\ti"]),
    (b"u\ti\n" + BOM, [b"u\ti", BOM]), (b"", [])])
def test_iter_raw_blocks_edge_cases(tmp_path, content, expected):
    path = tmp_path / "edge.tsv"
    path.write_bytes(content)
    for block in (1, 2, 3, 4, 1 << 20):
        with open(path, "rb") as f:
            got = [line for blk in lines.iter_raw_blocks(f, block) for line in blk.split(b"\n")]
        assert got == expected, block


def test_iter_raw_blocks_gives_the_text_back_in_bytes_blocks_for_any_block_size():
    import io
    import random
    rnd = random.Random(5)
    for _ in range(300):
        parts = [rnd.choice([b"u\ti", b"", b"\n", b"\n\n", b"x" * rnd.randrange(40), BOM])
                 for _ in range(rnd.randrange(12))]
        text = b"".join(parts)
        body = text[3:] if text.startswith(BOM) else text
        expected = body[:-1] if body.endswith(b"\n") else body
        blocks = list(lines.iter_raw_blocks(io.BytesIO(text), rnd.choice([1, 2, 3, 5, 8, 64])))
        assert all(type(b) is bytes for b in blocks)
        assert b"\n".join(blocks) == expected, text


def test_read_user_items_strips_the_bom_of_a_gzip_file(tmp_path):
    path = tmp_path / "bom.tsv.gz"
    path.write_bytes(gzip.compress(BOM_TEXT))
    assert _read_lines_module(path) == BOM_EXPECTED
    assert read_per_user(str(path)) == BOM_EXPECTED


def _bom_files(tmp_path, n):
    # Each file starts with a BOM; bob's line (with its BOM) is in the middle of file 0.
    (tmp_path / "f0.tsv").write_bytes(BOM_TEXT)
    for k in range(1, n):
        (tmp_path / f"f{k}.tsv").write_bytes(BOM + f"alice\tz{k}\ndave{k}\ta\n".encode())
    expected = {u: dict(c) for u, c in BOM_EXPECTED.items()}
    for k in range(1, n):
        expected["alice"][f"z{k}"] = 1
        expected[f"dave{k}"] = {"a": 1}
    return str(tmp_path / "f*.tsv"), sorted(expected.items())


@pytest.mark.parametrize("files", [1, 3])
@pytest.mark.parametrize("mode", ["whole", "split", "keep_order"])
def test_read_user_items_transform_strips_the_bom_of_every_file(tmp_path, files, mode):
    pattern, expected = _bom_files(tmp_path, files)
    kwargs = {"whole": {}, "split": {"split_files": True, "block_bytes": 4},
              "keep_order": {"keep_order": True, "flush_pairs": 1}}[mode]
    with local_pipeline() as p:
        out = p | ReadUserItems(pattern, **kwargs)
        assert_that(out, equal_to(expected))


@pytest.mark.parametrize("files", [1, 3])
def test_complete_users_strip_the_bom(tmp_path, files):
    pattern, expected = _bom_files(tmp_path, files)
    with local_pipeline() as p:
        users, complete = p | ReadUserItems(pattern, complete_users=True)
        both = (users, complete) | beam.Flatten()
        assert_that(both, equal_to(expected))
        if files == 1:
            assert_that(complete, equal_to(expected), label="AllComplete")


class _ShortReads(io.RawIOBase):
    """A stream whose ``readinto`` gives 1 to 7 bytes at a time."""

    def __init__(self, data, rnd):
        self._data, self._at, self._rnd = data, 0, rnd

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), self._rnd.randint(1, 7), len(self._data) - self._at)
        b[:n] = self._data[self._at:self._at + n]
        self._at += n
        return n


class _ReadOnly:
    """A file object with ``read`` and no ``readinto``."""

    def __init__(self, data):
        self._f = io.BytesIO(data)

    def read(self, n):
        return self._f.read(n)


class _RawReadOnly(io.RawIOBase):
    """A raw stream that implements ``read`` only (its inherited ``readinto`` raises)."""

    def __init__(self, data):
        self._f = io.BytesIO(data)

    def readable(self):
        return True

    def read(self, n=-1):
        return self._f.read(n)


def _reference_blocks(text, block_bytes):
    # where the blocks are cut, independently of ``dp.data.lines``: read ``block_bytes`` at a
    # time, cut after the last line end (dropping it), carry the rest to the next
    # read; a BOM at offset 0 dropped once (three bytes needed to tell)
    out, rest, at, first = [], b"", 0, True
    while at < len(text):
        chunk = rest + text[at:at + block_bytes]
        at += block_bytes
        if first:
            if len(chunk) < 3 and BOM.startswith(chunk) and at < len(text):
                rest = chunk
                continue
            first = False
            chunk = chunk[3:] if chunk.startswith(BOM) else chunk
        cut = chunk.rfind(b"\n")
        if cut < 0:
            rest = chunk
            continue
        out.append(chunk[:cut])
        rest = chunk[cut + 1:]
    if rest:
        out.append(rest)
    return out


def test_read_blocks_gives_the_reference_blocks_from_any_file_object():
    rnd = random.Random(6)
    for _ in range(400):
        parts = [rnd.choice([b"u\ti", b"", b"\n", b"\r\n", b"\n\n", b"x" * rnd.randrange(40),
                             BOM, BOM[:1], BOM[:2], b"\xff"]) for _ in range(rnd.randrange(14))]
        text = b"".join(parts)
        block = rnd.choice([1, 2, 3, 5, 8, 64])
        expected = _reference_blocks(text, block)
        assert list(lines.iter_raw_blocks(io.BytesIO(text), block)) == expected, (text, block)
        for f in (io.BytesIO(text), _ShortReads(text, rnd), _ReadOnly(text), _RawReadOnly(text),
                  gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(text)))):
            got = []
            with contextlib.closing(lines.read_blocks(f, block, rnd.choice([1, 2]))) as views:
                for view in views:
                    assert isinstance(view, memoryview) and view.readonly
                    got.append(bytes(view))  # a copy, before the next block is asked for
            assert got == expected, (text, block, f)


def test_read_blocks_reads_every_block_into_the_same_few_buffers():
    # depth + 2 buffers in turn, not a new object per block (a line longer than a block
    # gets a larger buffer)
    text = b"".join(b"user%d\titem%d\n" % (k % 7, k) for k in range(5000))
    for depth in (1, 2):
        with contextlib.closing(lines.read_blocks(io.BytesIO(text), 1000, depth)) as views:
            seen = []
            for view in views:
                copy = bytes(view)
                time.sleep(0.002)  # the reader runs ahead as far as it may meanwhile
                assert bytes(view) == copy  # not read into until the next block is asked for
                seen.append((view.obj, copy))
        assert len(seen) > 50
        assert len({id(obj) for obj, _ in seen}) <= depth + 2
        assert b"\n".join(b for _, b in seen) == text[:-1]


def test_a_reader_keeps_its_buffers_from_file_to_file():
    # read_blocks with the caller's buffers: every file still gives the reference
    # blocks, the next file is read into the same buffers (none allocated anew while
    # they are large enough), and a list of the wrong length is refused
    rnd = random.Random(9)
    texts = [b"".join(b"u%d\titem%d\n" % (rnd.randrange(9), k) for k in range(n))
             for n in (3000, 10, 0, 4000)]
    texts.append(b"one line longer than a block " * 40)  # needs a larger buffer
    buffers = [None] * 4
    kept = []
    for text in texts:
        got = []
        with contextlib.closing(lines.read_blocks(io.BytesIO(text), 500, 2, buffers)) as views:
            for view in views:
                time.sleep(0.001)
                got.append(bytes(view))
        assert got == _reference_blocks(text, 500)
        if text == texts[0]:
            kept = list(buffers)  # held: their identities cannot be reused
    assert len(kept) == 4 and None not in kept and None not in buffers
    assert sum(any(b is k for k in kept) for b in buffers) >= 2  # the long line replaced
    # at most two
    with pytest.raises(ValueError, match="depth \\+ 2 = 3 buffers; got 4"):
        lines.read_blocks(io.BytesIO(b"a\tb"), 500, 1, buffers)


# -- byte ranges of one file ---------------------------------------------------------


def _range_lines(f, start, end, block):
    """``(text offset, line)`` of every line ``read_range_blocks`` gives for [start, end)."""
    out = []
    offset, blocks = lines.read_range_blocks(f, start, end, block, lines.READ_AHEAD_BLOCKS)
    with contextlib.closing(blocks):
        for view in blocks:
            for line in bytes(view).split(b"\n"):
                out.append((offset, line))
                offset += len(line) + 1
    return out


def _owned(text):
    """The file's lines as the whole-file read gives them, with their text offsets and
    the file offset of their first byte (a BOM belongs to the first line)."""
    mark = 3 if text.startswith(BOM) else 0
    body = text[mark:]
    pieces = body.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    out, at = [], 0
    for k, line in enumerate(pieces):
        out.append((at, line, 0 if k == 0 else at + mark))
        at += len(line) + 1
    return out


def _tiles(cuts):
    bounds = [0] + sorted(set(cuts))
    return [(a, b) for a, b in zip(bounds, bounds[1:])] + [(bounds[-1], None)]


def _check_ranges(text, ranges, block, make):
    every = []
    owned = _owned(text)
    for start, end in ranges:
        got = _range_lines(make(text), start, end, block)
        # exactly the lines whose first byte is in [start, end), with the whole read's
        # text offsets
        assert got == [(at, line) for at, line, first in owned
                       if first >= start and (end is None or first < end)], (text, start, end)
        every += got
    assert every == [(at, line) for at, line, _ in owned], (text, ranges)
    # the reference is the whole-file read's
    with contextlib.closing(lines.read_blocks(make(text), block)) as views:
        whole = [line for view in views for line in bytes(view).split(b"\n")]
    assert [line for _, line in every] == whole, (text, ranges)


def test_byte_ranges_read_every_line_once_wherever_they_are_cut():
    # every cut of a text with a BOM, CRLF, empty lines, a line longer than a block and
    # a last line without a newline: on a newline, a line's first byte, inside a line,
    # between \r and \n, past the end; single cuts and every range size
    text = BOM + b"u1\ta\r\nu2\tb\n\nbad\n" + b"u3\t" + b"x" * 40 + b"\r\nu4\tlast"
    for block in (1, 4, 64):
        for cut in range(1, len(text) + 2):
            _check_ranges(text, _tiles([cut]), block, io.BytesIO)
        for size in range(1, len(text) + 2):
            _check_ranges(text, lines.byte_ranges(len(text), size), block, io.BytesIO)
    for tail in (b"\n", b"\r\n", b"\n\n"):  # a last line with its newline
        t = text + tail
        for cut in range(1, len(t) + 1):
            _check_ranges(t, _tiles([cut]), 8, io.BytesIO)


def test_byte_ranges_of_random_texts_on_any_file_object():
    rnd = random.Random(17)
    for _ in range(300):
        parts = [rnd.choice([b"u\ti", b"", b"\n", b"\r\n", b"\n\n", b"x" * rnd.randrange(40),
                             BOM, BOM[:2], b"\xff"]) for _ in range(rnd.randrange(14))]
        text = b"".join(parts)
        cuts = [rnd.randrange(1, len(text) + 3) for _ in range(rnd.randrange(1, 6))]
        block = rnd.choice([1, 3, 8, 64])
        for make in (io.BytesIO, lambda t: _ShortReads(t, rnd), _ReadOnly, _RawReadOnly):
            _check_ranges(text, _tiles(cuts), block, make)


def test_an_empty_or_small_file_is_one_range_and_an_empty_range_reads_nothing():
    assert lines.byte_ranges(0, 10) == [(0, None)]
    assert lines.byte_ranges(None, 10) == [(0, None)]
    assert lines.byte_ranges(10, 10) == [(0, None)]
    assert lines.byte_ranges(25, 10) == [(0, 10), (10, 20), (20, None)]
    assert _range_lines(io.BytesIO(b""), 0, None, 8) == []
    assert _range_lines(io.BytesIO(b"a\tb\n"), 0, None, 8) == [(0, b"a\tb")]
    assert _range_lines(io.BytesIO(b"a\tb\n"), 3, 4, 8) == []  # no line starts there
    assert _range_lines(io.BytesIO(b"a\tb\n"), 50, None, 8) == []  # past the end
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="range_bytes"):
            lines.byte_ranges(100, bad)
    with pytest.raises(ValueError, match="start < end"):
        lines.read_range_blocks(io.BytesIO(b""), 5, 5)
