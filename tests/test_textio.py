"""Reading user<TAB>item text: formats, compression, malformed lines."""
import bz2
import gzip

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu import textio
from beam_dpsu.textio import ReadUserItems

from conftest import beam_options

CONTENT = (b"u1\ta\nu1\ta\nu1\tb\r\nu2\ta\tb\n"      # duplicate, CRLF, extra tab
           b"no-tab-line\n\tmissing-user\n\n"         # 3 malformed
           b"u3\t\xff\xfe\n"                          # invalid UTF-8: malformed
           b"u3\t\xc3\xa9\n"                           # é
           b"u4\t")                                    # last line without newline, empty item
EXPECTED = {"u1": {"a": 2, "b": 1}, "u2": {"a\tb": 1}, "u3": {"é": 1}, "u4": {"": 1}}


def test_parse_line():
    assert textio.parse_line(b"u\ti") == ("u", "i")
    assert textio.parse_line(b"u\ti\tj\r") == ("u", "i\tj")
    assert textio.parse_line(b"\ti") is None
    assert textio.parse_line(b"ui") is None
    assert textio.parse_line(b"u\t\xff") is None


@pytest.mark.parametrize("suffix,compress", [("", lambda b: b), (".gz", gzip.compress),
                                             (".bz2", bz2.compress)])
@pytest.mark.parametrize("block", [3, 1 << 20])
def test_read_user_items(tmp_path, suffix, compress, block):
    path = tmp_path / ("data.tsv" + suffix)
    path.write_bytes(compress(CONTENT))
    users, malformed = {}, 0
    for kind, value in textio.read_user_items(str(path), flush_pairs=2, block_bytes=block):
        if kind == "user":
            u, c = value
            for k, v in c.items():
                users.setdefault(u, {})
                users[u][k] = users[u].get(k, 0) + v
        else:
            malformed += value[1]
    assert users == EXPECTED
    assert malformed == 4


def test_read_user_items_transform_merges_across_files(tmp_path):
    (tmp_path / "a.tsv").write_bytes(b"u1\tx\nu2\ty\n")
    (tmp_path / "b.tsv.gz").write_bytes(gzip.compress(b"u1\tx\nu1\tz\nbad\n"))
    with beam.Pipeline(options=beam_options()) as p:
        out = p | ReadUserItems(str(tmp_path / "*"))
        assert_that(out, equal_to([("u1", {"x": 2, "z": 1}), ("u2", {"y": 1})]))


def test_empty_file(tmp_path):
    (tmp_path / "empty.tsv").write_bytes(b"")
    with beam.Pipeline(options=beam_options()) as p:
        out = p | ReadUserItems(str(tmp_path / "empty.tsv"))
        assert_that(out, equal_to([]))


def test_bad_pattern():
    with pytest.raises(ValueError, match="file_pattern"):
        ReadUserItems("")
