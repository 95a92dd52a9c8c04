"""transforms.write: a release written as ONE sorted file that appears whole or not at all."""
import os

import apache_beam as beam
import pytest

from beam_dpsu.dp.mechanisms import WeightedGaussian
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms import write
from beam_dpsu.transforms.select import SelectPartitions
from beam_dpsu.transforms.write import WriteRelease
from conftest import transform_labels


def test_write_one_file_writes_each_part_as_a_line_and_leaves_no_temporary_file(tmp_path):
    path = str(tmp_path / "sub" / "out-items-00000-of-00001")
    write.write_one_file(path, ["a\nb", b"c", 7])
    assert open(path, "rb").read() == b"a\nb\nc\n7\n"
    assert os.listdir(tmp_path / "sub") == ["out-items-00000-of-00001"]
    write.write_one_file(path, [])  # a retried attempt replaces the file
    assert open(path, "rb").read() == b""
    assert os.listdir(tmp_path / "sub") == ["out-items-00000-of-00001"]


def test_write_one_file_never_shows_a_partial_file(tmp_path, monkeypatch):
    # While the text is written, the final name does not exist; when writing fails,
    # neither it nor the temporary file is left.
    path = tmp_path / "out-items-00000-of-00001"
    seen = []

    def parts():
        yield "first"
        seen.append(sorted(os.listdir(tmp_path)))
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write.write_one_file(str(path), parts())
    assert len(seen) == 1 and len(seen[0]) == 1
    assert seen[0][0].startswith(write.TEMP_PREFIX + path.name + "-")
    assert os.listdir(tmp_path) == []


def test_the_release_is_written_in_one_step_on_the_direct_runner(tmp_path):
    # WriteOneFile (GroupByKey + one ParDo), not ToList + WriteToText; the file is
    # the sorted lines, and nothing but the release and its summaries is left.
    import apache_beam as beam
    from beam_dpsu.pipelines import outputs
    prefix = str(tmp_path / "out")
    with beam.Pipeline() as p:
        outputs.write_items(p | beam.Create(["b\t1", "a\t2", "c\t3"]), prefix)
        labels = transform_labels(p)
    assert any(l.endswith("WriteItems/WriteOneFile/Write") for l in labels), labels
    assert not any("WriteToText" in l or "CollectRelease" in l for l in labels)
    assert open(prefix + "-items-00000-of-00001").read() == "a\t2\nb\t1\nc\t3\n"
    assert os.listdir(tmp_path) == ["out-items-00000-of-00001"]


def test_write_one_file_replaces_a_retried_attempts_file_where_rename_does_not(tmp_path,
                                                                              monkeypatch):
    # HDFS: a rename onto an existing file fails; the earlier attempt's file is deleted
    # and the rename tried again.
    from apache_beam.io.filesystems import FileSystems
    path = str(tmp_path / "out-items-00000-of-00001")
    write.write_one_file(path, ["first"])

    class NoReplace:
        def __getattr__(self, name):
            return getattr(FileSystems, name)

        @staticmethod
        def rename(sources, destinations):
            if any(os.path.exists(d) for d in destinations):
                raise OSError("destination exists")
            FileSystems.rename(sources, destinations)

    monkeypatch.setattr(write, "FileSystems", NoReplace())
    write.write_one_file(path, ["second"])
    assert open(path).read() == "second\n" and os.listdir(tmp_path) == [os.path.basename(path)]



def test_write_release_sorts_the_released_items_into_one_file(tmp_path):
    path = str(tmp_path / "vocabulary.txt")
    with beam.Pipeline() as p:
        p | beam.Create(["pear", "apple", "fig", 7]) | WriteRelease(path)
    assert open(path).read() == "7\napple\nfig\npear\n"
    assert os.listdir(tmp_path) == ["vocabulary.txt"]


def test_write_release_after_select_partitions_writes_the_released_set(tmp_path):
    pairs = [(f"u{u}", w) for u in range(300) for w in ("common", "shared", f"rare{u}")]
    path = str(tmp_path / "release.txt")
    with beam.Pipeline() as p:
        released = (p | beam.Create(pairs)
                    | SelectPartitions(WeightedGaussian(3.0, 1e-5, 10), RunKey.from_test_seed(1)))
        released | WriteRelease(path)
    lines = open(path).read().splitlines()
    assert lines == sorted(lines) and {"common", "shared"} <= set(lines)
    assert not any(l.startswith("rare") for l in lines)


def test_write_release_validates_its_path():
    with pytest.raises(ValueError, match="path"):
        WriteRelease("")
