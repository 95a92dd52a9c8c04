"""Reading user<TAB>item text: formats, compression, malformed lines."""
import bz2
import gzip

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu.dp.data import contribution, lines
from beam_dpsu.transforms import textio
from beam_dpsu.transforms.textio import ReadUserItems

from conftest import local_pipeline, transform_labels

CONTENT = (b"u1\ta\nu1\ta\nu1\tb\r\nu2\ta\tb\n"      # duplicate, CRLF, extra tab
           b"no-tab-line\n\tmissing-user\n\n"         # 3 malformed
           b"u3\t\xff\xfe\n"                          # invalid UTF-8: malformed
           b"u3\t\xc3\xa9\n"                           # é
           b"u4\t")                                    # last line without newline, empty item
EXPECTED = {"u1": {"a": 2, "b": 1}, "u2": {"a\tb": 1}, "u3": {"é": 1}, "u4": {"": 1}}


def test_parse_line():
    assert lines.parse_line(b"u\ti") == ("u", "i")
    assert lines.parse_line(b"u\ti\tj\r") == ("u", "i\tj")
    assert lines.parse_line(b"\ti") is None
    assert lines.parse_line(b"ui") is None
    assert lines.parse_line(b"u\t\xff") is None


@pytest.mark.parametrize("suffix,compress", [("", lambda b: b), (".gz", gzip.compress),
                                             (".bz2", bz2.compress)])
@pytest.mark.parametrize("block", [3, 1 << 20])
def test_read_user_items(tmp_path, suffix, compress, block):
    path = tmp_path / ("data.tsv" + suffix)
    path.write_bytes(compress(CONTENT))
    users, malformed = {}, 0
    for kind, value in lines.read_user_items(str(path), flush_pairs=2, block_bytes=block):
        if kind == "user":
            u, c = value
            for k, v in c.items():
                users.setdefault(u, {})
                users[u][k] = users[u].get(k, 0) + v
        else:
            malformed += value[1]
    assert users == EXPECTED
    assert malformed == 4


def _gzip_cases():
    """Inputs for the gzip reader, with what ``gzip`` gives: the bytes, or the error."""
    big = b"".join(b"u%d\titem %d\n" % (k % 977, k) for k in range(200_000))
    z = gzip.compress(big)
    return {"empty": b"", "one member": gzip.compress(CONTENT), "large": z,
            "two members": z + gzip.compress(b"u9\tz\n"), "trailing zeros": z + bytes(64),
            "truncated": z[:len(z) // 2], "not gzip": b"user\titem\n" * 10,
            "bad crc": z[:-8] + bytes([z[-8] ^ 1]) + z[-7:]}


@pytest.mark.parametrize("name", sorted(_gzip_cases()))
@pytest.mark.parametrize("module", ["installed", "gzip"])
def test_gzip_reader_gives_what_gzip_gives(tmp_path, monkeypatch, name, module):
    """``lines.gzip_reader`` (python-isal's reader where the ``fast`` extra is installed,
    else ``gzip``'s) gives the bytes ``gzip.decompress`` gives, or an error where it
    raises one (OSError, e.g. ``gzip.BadGzipFile``, or EOFError), through both
    ``open_local_binary`` and ``textio.open_binary``; with ``module='gzip'`` the reader
    without the extra."""
    import io
    if module == "gzip":
        monkeypatch.setattr(lines, "_gzip", gzip)
    blob = _gzip_cases()[name]
    try:
        expected = gzip.decompress(blob)
    except (OSError, EOFError):
        expected = None
    path = tmp_path / "data.tsv.gz"
    path.write_bytes(blob)
    for opener in (lambda: lines.gzip_reader(io.BytesIO(blob)),
                   lambda: lines.open_local_binary(str(path)),
                   lambda: textio.open_binary(str(path))):
        if expected is None:
            with pytest.raises((OSError, EOFError)):
                with opener() as f:
                    f.read()
        else:
            with opener() as f:
                assert f.read() == expected


def test_gzip_reader_is_isal_with_the_fast_extra():
    """With python-isal installed (the ``fast`` and ``test`` extras), the reader is its
    ``igzip``; the test suite installs it, so this checks that the extra is used."""
    igzip = pytest.importorskip("isal.igzip")
    import io
    assert isinstance(lines.gzip_reader(io.BytesIO(gzip.compress(b"u\ti\n"))),
                      igzip.GzipFile)


def test_read_user_items_transform_merges_across_files(tmp_path):
    (tmp_path / "a.tsv").write_bytes(b"u1\tx\nu2\ty\n")
    (tmp_path / "b.tsv.gz").write_bytes(gzip.compress(b"u1\tx\nu1\tz\nbad\n"))
    with local_pipeline() as p:
        out = p | ReadUserItems(str(tmp_path / "*"))
        assert_that(out, equal_to([("u1", {"x": 2, "z": 1}), ("u2", {"y": 1})]))


def test_read_user_items_with_malformed_returns_both(tmp_path):
    (tmp_path / "a.tsv").write_bytes(b"u1\tx\nbad\nu2\ty\nbad\n\tnouser\n")
    with local_pipeline() as p:
        users, malformed = p | ReadUserItems(str(tmp_path / "*"), with_malformed=True)
        assert_that(users, equal_to([("u1", {"x": 1}), ("u2", {"y": 1})]), label="Users")
        assert_that(malformed, equal_to([(b"bad", 2), (b"\tnouser", 1)]), label="Malformed")


def test_empty_file(tmp_path):
    (tmp_path / "empty.tsv").write_bytes(b"")
    with local_pipeline() as p:
        out = p | ReadUserItems(str(tmp_path / "empty.tsv"))
        assert_that(out, equal_to([]))


def test_bad_pattern():
    with pytest.raises(ValueError, match="file_pattern"):
        ReadUserItems("")


def _first_occurrence(paths):
    """An independent reading: each user's items in the order they first appear."""
    out = {}
    for path in paths:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        for line in data.decode().splitlines():
            user, tab, item = line.partition("\t")
            if tab and user:
                counts = out.setdefault(user, {})
                counts[item] = counts.get(item, 0) + 1
    return out


def _keep_order_files(tmp_path):
    import numpy as np
    rng = np.random.default_rng(7)
    paths = []
    for f in range(3):
        lines = [f"u{rng.integers(0, 6)}\tw{rng.integers(0, 40)}" for _ in range(400)]
        path = tmp_path / (f"part-{f}.tsv" + (".gz" if f == 1 else ""))
        data = ("\n".join(lines) + "\n").encode()
        path.write_bytes(gzip.compress(data) if f == 1 else data)
        paths.append(path)
    return paths


def test_keep_order_gives_each_user_their_record_order_across_flushes_and_files(tmp_path):
    paths = _keep_order_files(tmp_path)
    want = _first_occurrence(sorted(paths))
    assert textio.read_per_user(str(tmp_path / "part-*")) == want
    assert all(list(textio.read_per_user(str(tmp_path / "part-*"), flush_pairs=7)[u]) == list(c)
               for u, c in want.items())
    # flush_pairs=7 splits every file into many partial dicts, merged in any order.
    with local_pipeline() as p:
        out = (p | ReadUserItems(str(tmp_path / "part-*"), flush_pairs=7, keep_order=True)
               | beam.Map(lambda kv: (kv[0], list(kv[1].items()))))
        assert_that(out, equal_to([(u, list(c.items())) for u, c in want.items()]))


def test_merge_ordered_item_counts_takes_the_earliest_position_whatever_the_merge_order():
    fn = textio.MergeOrderedItemCountsFn()
    late = ({"b": 1, "a": 1}, {"b": 10, "a": 11})
    early = ({"a": 2, "c": 1}, {"a": 3, "c": 4})
    for parts in ((late, early), (early, late)):
        acc = fn.create_accumulator()
        for part in parts:
            acc = fn.add_input(acc, part)
        assert list(fn.extract_output(acc).items()) == [("a", 3), ("c", 1), ("b", 1)]
    acc = fn.merge_accumulators([fn.add_input(fn.create_accumulator(), late),
                                 fn.add_input(fn.create_accumulator(), early)])
    assert list(fn.extract_output(acc)) == ["a", "c", "b"]
    assert fn.extract_output(fn.create_accumulator()) == {}


def test_read_per_user_without_a_match(tmp_path):
    with pytest.raises(ValueError, match="no input file matches"):
        textio.read_per_user(str(tmp_path / "nothing-*"))


def test_split_files_reads_the_same_users_in_the_same_order(tmp_path):
    # Blocks of a few bytes: every file is parsed in many blocks on any worker;
    # the per-user counts and (keep_order) their order equal the one-call reader.
    import gzip
    lines = [f"u{i % 7}\titem{(i * 13) % 11}\n" for i in range(300)] + ["bad line\n", "\tx\n"]
    for k in range(3):
        with gzip.open(tmp_path / f"part-{k}.tsv.gz", "wt") as f:
            f.writelines(lines[k::3])
    pattern = str(tmp_path / "part-*")
    expected = textio.read_per_user(pattern)
    for keep_order in (False, True):
        with local_pipeline() as p:
            reader = ReadUserItems(pattern, keep_order=keep_order, split_files=True,
                                   block_bytes=64, with_malformed=True)
            users, malformed = p | reader
            out = users | beam.Map(lambda kv: (kv[0], list(kv[1].items())))
            want = [(u, list(c.items()) if keep_order else sorted(c.items()))
                    for u, c in expected.items()]
            if not keep_order:
                out = out | beam.Map(lambda kv: (kv[0], sorted(kv[1])))
            assert_that(out, equal_to(want))
            assert_that(malformed | beam.Map(lambda kv: kv[1]) | beam.CombineGlobally(sum),
                        equal_to([2]), label="malformed")


def _complete_run(pattern, **kwargs):
    """(merged users, complete users, malformed total) of ReadUserItems(complete_users=True)."""
    with local_pipeline() as p:
        users, complete, malformed = p | ReadUserItems(pattern, with_malformed=True,
                                                       complete_users=True, **kwargs)
        key = lambda kv: (kv[0], list(kv[1].items()))  # noqa: E731
        return users | "U" >> beam.Map(key), complete | "C" >> beam.Map(key), malformed


def test_complete_users_one_file_read_whole_go_to_the_complete_output(tmp_path):
    paths = _keep_order_files(tmp_path)
    want = _first_occurrence(paths[:1])
    with local_pipeline() as p:
        users, complete, malformed = p | ReadUserItems(
            str(paths[0]), with_malformed=True, complete_users=True, keep_order=True)
        assert_that(users, equal_to([]), label="merged")
        assert_that(complete | beam.Map(lambda kv: (kv[0], list(kv[1].items()))),
                    equal_to([(u, list(c.items())) for u, c in want.items()]), label="complete")


@pytest.mark.parametrize("case", ["several-files", "flush"])
def test_complete_users_need_one_file_read_without_a_flush(tmp_path, case):
    # Several files (a user may be in several) or a flush (a user's lines split):
    # nothing is complete, every user goes through the merge, in record order.
    paths = _keep_order_files(tmp_path)
    pattern = str(tmp_path / "part-*") if case == "several-files" else str(paths[0])
    want = _first_occurrence(sorted(paths) if case == "several-files" else paths[:1])
    limit = {"complete_max_pairs": 7, "flush_pairs": 5} if case == "flush" else {}
    with local_pipeline() as p:
        users, complete, _ = p | ReadUserItems(pattern, with_malformed=True, complete_users=True,
                                               keep_order=True, **limit)
        assert_that(complete, equal_to([]), label="complete")
        assert_that(users | beam.Map(lambda kv: (kv[0], list(kv[1].items()))),
                    equal_to([(u, list(c.items())) for u, c in want.items()]), label="merged")


def test_complete_users_count_malformed_lines_and_refuse_split_files(tmp_path):
    (tmp_path / "a.tsv").write_bytes(b"u1\tx\nbad\nu2\ty\nbad\n\tnouser\nu1\tx\n")
    with local_pipeline() as p:
        users, complete, malformed = p | ReadUserItems(str(tmp_path / "a.tsv"),
                                                       with_malformed=True, complete_users=True)
        assert_that(users, equal_to([]), label="merged")
        assert_that(complete, equal_to([("u1", {"x": 2}), ("u2", {"y": 1})]), label="complete")
        assert_that(malformed, equal_to([(b"bad", 2), (b"\tnouser", 1)]), label="malformed")
    with pytest.raises(ValueError, match="split_files"):
        ReadUserItems("x", complete_users=True, split_files=True)
    with pytest.raises(ValueError, match="complete_max_pairs"):
        ReadUserItems("x", complete_users=True, complete_max_pairs=0)


@pytest.mark.parametrize("user_groups", [1, 3, 1024])
def test_user_groups_merge_every_part_of_a_user_whatever_the_grouping(tmp_path, user_groups):
    # 3 files, each flushed every 7 distinct lines: each user has many partial
    # dicts; they must meet in one group and merge to the record-order counts.
    paths = _keep_order_files(tmp_path)
    want = _first_occurrence(sorted(paths))
    for keep_order in (False, True):
        with local_pipeline() as p:
            out = (p | ReadUserItems(str(tmp_path / "part-*"), flush_pairs=7,
                                     keep_order=keep_order, user_groups=user_groups)
                   | beam.Map(lambda kv, k: (kv[0], list(kv[1].items()) if k
                                             else sorted(kv[1].items())), keep_order))
            assert_that(out, equal_to([(u, list(c.items()) if keep_order else sorted(c.items()))
                                       for u, c in want.items()]))


def test_pack_user_groups_puts_each_user_in_its_group_once():
    import pickle
    users = {f"u{i}": {"a": i} for i in range(50)}
    packed = list(lines.pack_user_groups(users, 4))
    assert len({g for g, _ in packed}) == len(packed) <= 4
    seen = {}
    for g, blob in packed:
        part = pickle.loads(blob)
        assert all(contribution.user_group(u, 4) == g for u in part)
        seen.update(part)
    assert seen == users
    assert list(lines.pack_user_groups({}, 4)) == []


def test_merge_group_sums_counts_and_orders_by_position_whatever_the_part_order():
    import pickle
    fn = textio._MergeGroupDoFn(keep_order=True)
    late = {"u": ({"b": 1, "a": 1}, {"b": 10, "a": 11}), "v": ({"x": 1}, {"x": 5})}
    early = {"u": ({"a": 2, "c": 1}, {"a": 3, "c": 4})}
    for parts in ((late, early), (early, late)):
        out = dict(fn.process((0, [pickle.dumps(p) for p in parts])))
        assert list(out["u"].items()) == [("a", 3), ("c", 1), ("b", 1)]
        assert out["v"] == {"x": 1}
    plain = textio._MergeGroupDoFn(keep_order=False)
    out = dict(plain.process((0, [pickle.dumps({"u": {"a": 1}}), pickle.dumps({"u": {"a": 2,
                                                                                       "b": 1}})])))
    assert out == {"u": {"a": 3, "b": 1}}


def test_user_groups_must_be_a_positive_integer():
    for bad in (0, -1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="user_groups"):
            ReadUserItems("x", user_groups=bad)


def _best_makespan(sizes, bins):
    import itertools
    return min(max(sum(s for s, b in zip(sizes, assign) if b == k) for k in range(bins))
               for assign in itertools.product(range(bins), repeat=len(sizes)))


def test_balanced_bins_is_within_four_thirds_of_the_best_split():
    import numpy as np
    rng = np.random.default_rng(3)
    for _ in range(60):
        n, bins = int(rng.integers(1, 8)), int(rng.integers(1, 4))
        sizes = [int(x) for x in rng.integers(0, 100, size=n)]
        got = textio.balanced_bins(sizes, bins)
        assert len(got) == n and all(0 <= b < bins for b in got)
        makespan = max(sum(s for s, b in zip(sizes, got) if b == k) for k in range(bins))
        assert makespan * 3 <= 4 * _best_makespan(sizes, bins)
    # the benchmark's 8 files (sizes in kB): 11.61 and 11.32 MB, where taking the
    # files in turn (sorted names) gives 10.7 and 12.1 MB
    sizes = [3524, 4349, 2216, 3115, 2313, 2366, 2715, 2333]
    assert textio.balanced_bins(sizes, 2) == [1, 0, 0, 1, 1, 1, 0, 0]
    assert textio.balanced_bins([], 2) == [] and textio.balanced_bins([5, 5], 3) == [0, 1]
    assert textio.balanced_bins([0] * 5, 2) == [0, 1, 0, 1, 0]  # no sizes: in turn
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="bins"):
            textio.balanced_bins([1], bad)


def _created(p):
    """{label: values} of every ``Create`` labelled ``Files...`` in pipeline ``p``."""
    out, stack = {}, [p._root_transform()]
    while stack:
        t = stack.pop()
        if isinstance(t.transform, beam.Create) and t.full_label.startswith("Files"):
            out[t.full_label] = list(t.transform.values)
        stack.extend(t.parts)
    return out


@pytest.mark.parametrize("bins", [1, 2, 3, 5])
def test_dealt_files_deals_every_file_once_by_size(monkeypatch, bins):
    """Whatever number of partitions the runner's read wants (``read_partitions``),
    each file's element is in exactly one ``Create``, no ``Create`` is empty, the
    files are dealt by size (``balanced_bins``), and the run sees every element."""
    sized = [(f"f{i}", size) for i, size in enumerate([3524, 4349, 2216, None, 2313])]
    elements = [(i, path) for i, (path, _) in enumerate(sized)]
    asked = []

    def wanted(pipeline, files, most):
        asked.append((files, most))
        return bins
    monkeypatch.setattr(textio.runners, "read_partitions", wanted)
    with local_pipeline() as p:
        out = textio.dealt_files(beam.pvalue.PBegin(p), sized, elements, "Files")
        assert_that(out, equal_to(elements))
        created = _created(p)
    assert asked == [(5, textio.MAX_FILE_PARTITIONS)]
    if bins == 1:
        assert created == {"Files": elements}
        return
    which = textio.balanced_bins([size or 0 for _, size in sized], bins)
    assert created == {f"Files/{b}": [e for e, w in zip(elements, which) if w == b]
                       for b in range(bins)}
    assert all(created.values())
    with pytest.raises(ValueError, match="4 elements for 5 files"):
        textio.dealt_files(beam.pvalue.PBegin(beam.Pipeline()), sized, elements[:4], "Files")


def test_match_sized_gives_each_matching_file_with_its_size(tmp_path):
    paths = _keep_order_files(tmp_path)
    assert textio.match_sized(str(tmp_path / "part-*")) == [
        (str(p), p.stat().st_size) for p in sorted(paths)]
    assert textio.match_files(str(tmp_path / "part-*")) == [str(p) for p in sorted(paths)]


@pytest.mark.parametrize("complete_users", [False, True])
def test_files_dealt_to_two_workers_read_the_same_users_in_record_order(tmp_path,
                                                                        complete_users):
    # On the DirectRunner with two workers the files go to the workers in bins of
    # about equal size (a GroupByKey of the bin), not through a Reshuffle.
    from beam_dpsu.transforms import runners
    paths = _keep_order_files(tmp_path)
    want = _first_occurrence(sorted(paths))
    with local_pipeline("--direct_num_workers=2", "--direct_running_mode=multi_threading") as p:
        assert runners.dealt_workers(p) == 2
        read = ReadUserItems(str(tmp_path / "part-*"), keep_order=True, flush_pairs=7,
                             complete_users=complete_users)
        out = p | read
        if complete_users:
            assert_that(out[1], equal_to([]), label="complete")
            out = out[0]
        assert_that(out | beam.Map(lambda kv: (kv[0], list(kv[1].items()))),
                    equal_to([(u, list(c.items())) for u, c in want.items()]))
    assert any(label.endswith("DealFiles") for label in transform_labels(p))


def test_dealt_workers_is_the_direct_runners_worker_count_only():
    from apache_beam.options.pipeline_options import PipelineOptions
    from beam_dpsu.transforms import runners
    assert runners.dealt_workers(local_pipeline()) == 1
    assert runners.dealt_workers(local_pipeline(
        "--direct_num_workers=3", "--direct_running_mode=multi_processing")) == 3
    import multiprocessing
    assert runners.dealt_workers(local_pipeline(
        "--direct_num_workers=0", "--direct_running_mode=multi_threading")) == \
        multiprocessing.cpu_count()
    # in_memory runs the parts one after the other: nothing to deal
    assert runners.dealt_workers(local_pipeline(
        "--direct_num_workers=3")) == 1
    portable = beam.Pipeline(options=PipelineOptions([
        "--runner=PortableRunner", "--job_endpoint=embed", "--direct_num_workers=2"]))
    assert runners.dealt_workers(portable) == 1


def test_read_ahead_yields_the_same_items_and_raises_the_readers_error():
    import contextlib
    import threading
    from beam_dpsu.dp.data.lines import read_ahead
    for depth in (1, 3):
        assert list(read_ahead(iter(range(50)), depth)) == list(range(50))
    assert list(read_ahead(iter([]))) == []

    def failing():
        yield b"one"
        raise EOFError("truncated input")

    got = []
    with pytest.raises(EOFError, match="truncated input"):
        for block in read_ahead(failing()):
            got.append(block)
    assert got == [b"one"]
    # a consumer that stops early: the reader thread is stopped and joined on close
    produced = []

    def endless():
        k = 0
        while True:
            produced.append(k)
            yield k
            k += 1

    reader = read_ahead(endless())
    assert next(reader) == 0
    reader.close()
    assert not any(t.name == "beam-dpsu-read-ahead" and t.is_alive()
                   for t in threading.enumerate())
    assert len(produced) <= 4  # one in use, one queued, one waiting to be queued
    # an error in the consumer's loop: the reader is joined as the generator is closed
    produced.clear()
    with pytest.raises(RuntimeError):
        with contextlib.closing(read_ahead(endless())) as blocks:
            for block in blocks:
                raise RuntimeError("in the consumer")
    assert not any(t.name == "beam-dpsu-read-ahead" and t.is_alive()
                   for t in threading.enumerate())
    with pytest.raises(ValueError, match="depth"):
        next(read_ahead(iter([1]), 0))
