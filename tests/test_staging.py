"""Staged shuffles (``transforms.staging``): blocks written to files, references shuffled.

What the release rests on: every block read back is the block written (any order of
references, several files); a writer's file is its own (a retried attempt never shares
one) and a failed writer leaves nothing and gives no reference; the directory is
owner-only; ``SelectFromText`` with a staging directory releases what it releases
without; the command line stages where the runner holds shuffles in memory and leaves no
staged file behind, whether the run succeeds or fails.
"""
import glob
import os
import random
import stat

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.dp.data.contribution import per_user_counts
from beam_dpsu.dp.mechanisms import GW, WeightedGaussian
from beam_dpsu.dp.mechanisms.sips import Sips
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.pipelines import outputs, select_partitions
from beam_dpsu.transforms import runners, staging
from beam_dpsu.transforms.columnar import SelectFromText
from beam_dpsu.transforms.columnar_read import _ReadPairsDoFn

from conftest import local_pipeline

RK = RunKey.from_test_seed(41)
NO_KEY = bytes(32)  # the read stage without a mechanism presamples nothing: no key is used


@pytest.fixture
def stage(tmp_path):
    return staging.Staging(staging.make_directory(str(tmp_path / "st")))


def test_blocks_read_back_are_the_blocks_written_in_any_order(stage):
    rng = random.Random(3)
    written, refs = {}, []
    for _ in range(3):  # three writers: three files
        blobs = [rng.randbytes(rng.randrange(0, 300)) for _ in range(20)]
        with stage.writer() as w:
            for k, blob in enumerate(blobs):
                w.add(k, blob)
        refs += w.refs
        written.update((ref, blob) for (_, ref), blob in zip(w.refs, blobs))
    assert len({ref.name for _, ref in refs}) == 3
    # each file is its blocks, one after the other, and nothing else
    for name in {ref.name for _, ref in refs}:
        mine = sorted((ref for _, ref in refs if ref.name == name), key=lambda r: r.offset)
        with open(os.path.join(stage.directory, name), "rb") as f:
            assert f.read() == b"".join(written[ref] for ref in mine)
    order = [ref for _, ref in refs]
    rng.shuffle(order)
    assert stage.read(order) == [written[ref] for ref in order]
    assert stage.read([]) == []


def test_the_blocks_are_the_writer_s_in_the_order_added(stage):
    blobs = [b"a", b"", b"bcd", bytes(range(256)) * 10]
    with stage.writer() as w:
        for k, b in enumerate(blobs):
            w.add(k, b)
    assert [k for k, _ in w.refs] == [0, 1, 2, 3]
    assert stage.read([ref for _, ref in w.refs]) == blobs
    # a reference travels as a plain tuple (as a runner's coder may give it back)
    assert stage.read([tuple(ref) for _, ref in w.refs]) == blobs


def test_staged_files_are_owner_only_and_never_remake_a_removed_directory(stage):
    old = os.umask(0)
    try:
        with stage.writer() as w:
            w.add(0, b"x")
    finally:
        os.umask(old)
    path = os.path.join(stage.directory, w.refs[0][1].name)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    staging.remove_directory(stage.directory)
    with pytest.raises(FileNotFoundError):  # a task still running after the run ended
        with stage.writer() as late:
            late.add(0, b"private")
    assert not os.path.exists(stage.directory)


def test_a_failed_writer_deletes_its_file_and_gives_no_reference(stage):
    with pytest.raises(RuntimeError):
        with stage.writer() as w:
            w.add(0, b"half")
            raise RuntimeError("attempt fails")
    assert w.refs == [] and os.listdir(stage.directory) == []


def test_a_short_file_is_an_error_not_a_short_block(stage):
    with stage.writer() as w:
        w.add(0, b"0123456789")
    path = os.path.join(stage.directory, w.refs[0][1].name)
    with open(path, "r+b") as f:
        f.truncate(4)
    with pytest.raises(IOError, match="ends before"):
        stage.read([w.refs[0][1]])


def test_the_directory_is_owner_only_whatever_the_umask_and_one_run_s(tmp_path):
    old = os.umask(0)
    try:
        path = staging.make_directory(str(tmp_path / "d"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    with pytest.raises(FileExistsError):
        staging.make_directory(path)
    open(os.path.join(path, "x.blocks"), "wb").close()
    assert staging.remove_directory(path) and not os.path.exists(path)
    assert staging.remove_directory(path)  # gone already: nothing to do
    with pytest.raises(ValueError):
        staging.Staging("")


def test_a_retried_read_writes_its_own_file_with_the_same_blocks(tmp_path, stage):
    # Two attempts at the same file (as after a killed worker): two staged files,
    # and each attempt's references read back the same pair blocks.
    pairs = list(synthetic.occurrences(300, seed=2))
    path = tmp_path / "in.tsv"
    path.write_text("".join(f"{u}\t{i}\n" for u, i in pairs) + "bad\n")
    dofn = _ReadPairsDoFn(groups=4, block_bytes=2000, envelope=False, stage=stage)
    attempts = []
    for _ in range(2):
        out = list(dofn.process(str(path), NO_KEY))
        malformed = [o.value for o in out if isinstance(o, beam.pvalue.TaggedOutput)]
        refs = [o for o in out if not isinstance(o, beam.pvalue.TaggedOutput)]
        assert malformed == [(b"bad", 1)]
        attempts.append(refs)
    names = [{ref.name for _, ref in refs} for refs in attempts]
    assert len(names[0]) == len(names[1]) == 1 and names[0] != names[1]
    assert sorted(os.listdir(stage.directory)) == sorted(names[0] | names[1])

    def blocks(refs):
        by_group = {}
        for (group, _), blob in zip(refs, stage.read([ref for _, ref in refs])):
            by_group.setdefault(group, []).append(blob)
        return by_group
    assert blocks(attempts[0]) == blocks(attempts[1])
    plain = _ReadPairsDoFn(groups=4, block_bytes=2000, envelope=False)
    expected = {}
    for o in plain.process(str(path), NO_KEY):
        if not isinstance(o, beam.pvalue.TaggedOutput):
            expected.setdefault(o[0], []).append(o[1])
    assert blocks(attempts[0]) == expected


MECHANISMS = [WeightedGaussian(3.0, 1e-5, 5), Sips(0.3, 1e-5, 5, 2, 1.0), GW(3.0, 1e-5, 5)]


@pytest.mark.parametrize("mechanism,side_inputs_once", [(m, True) for m in MECHANISMS] + [
    (MECHANISMS[1], False)], ids=lambda x: getattr(x, "name", str(x)))
def test_select_from_text_releases_the_same_set_staged(tmp_path, monkeypatch, mechanism,
                                                       side_inputs_once):
    # side_inputs_once=False: DP-SIPS's removal as on Dask (one GroupByKey), whose
    # capabilities are patched in
    pairs = list(synthetic.occurrences(1500, seed=11))
    lines = [f"{u}\t{i}" for u, i in pairs]
    (tmp_path / "a.tsv").write_text("\n".join(lines[:700]) + "\nbad\n")
    (tmp_path / "b.tsv").write_text("\n".join(lines[700:]) + "\n")
    expected = mechanism.run_local(per_user_counts(pairs), RK)
    assert len(expected) > 3
    if not side_inputs_once:
        dask = runners.capabilities("DaskRunner")
        monkeypatch.setattr(runners, "capabilities", lambda _: dask)
    directory = staging.make_directory(str(tmp_path / "st"))
    with local_pipeline() as p:
        released, malformed, users = p | SelectFromText(
            str(tmp_path / "*.tsv"), mechanism, RK, user_groups=3, item_shards=2,
            block_bytes=3000, staging_dir=directory)
        assert_that(released, equal_to(sorted(expected)), label="released")
        assert_that(malformed, equal_to([(b"bad", 1)]), label="malformed")
        assert_that(users | beam.CombineGlobally(sum), equal_to([1500]), label="users")
    assert glob.glob(os.path.join(directory, "*" + staging.SUFFIX))  # it did stage


def test_a_staging_directory_that_does_not_exist_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match="existing directory"):
        SelectFromText(str(tmp_path / "*.tsv"), MECHANISMS[0], RK,
                       staging_dir=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="non-empty"):
        SelectFromText(str(tmp_path / "*.tsv"), MECHANISMS[0], RK, staging_dir="")


def test_runners_that_hold_shuffles_in_memory_stage_them():
    assert runners.capabilities("FnApiRunner").memory_shuffle
    assert runners.capabilities("DirectRunner").memory_shuffle
    assert runners.capabilities("DaskRunner").memory_shuffle
    for name in ("DataflowRunner", "FlinkRunner", "SparkRunner", "SomeNewRunner"):
        assert not runners.capabilities(name).memory_shuffle


def _cli_args(tmp_path):
    pairs = synthetic.occurrences(400, seed=3)
    (tmp_path / "in.tsv").write_text("".join(f"{u}\t{i}\n" for u, i in pairs))
    return ["--input", str(tmp_path / "in.tsv"), "--output", str(tmp_path / "out" / "rel"),
            "--mechanism", "weighted-gaussian", "--epsilon", "3", "--delta", "1e-5",
            "--max-items-per-user", "5", "--quiet"]


def _recording(monkeypatch):
    made = []
    real = outputs.staging_directory

    def record(prefix):
        path = real(prefix)
        made.append(path)
        return path
    monkeypatch.setattr(outputs, "staging_directory", record)
    return made


def test_the_command_line_stages_and_removes_the_staged_files(tmp_path, monkeypatch, capsys):
    made = _recording(monkeypatch)
    seen = []
    real_read = staging.Staging.read

    def read(self, refs):
        seen.append(self.directory)
        return real_read(self, refs)
    monkeypatch.setattr(staging.Staging, "read", read)
    assert select_partitions.main(_cli_args(tmp_path)) == 0
    assert len(made) == 1 and os.path.basename(made[0]).startswith(
        "beam-temp-rel.PRIVATE-staging-")
    assert set(seen) == {made[0]}  # the run read its blocks from there
    assert not os.path.exists(made[0])
    assert sorted(os.listdir(tmp_path / "out")) == [
        "rel-items-00000-of-00001", "rel.PRIVATE-run-details.json", "rel.json"]


def test_a_run_removes_only_its_own_staging_directory(tmp_path, monkeypatch, capsys):
    # a concurrent run's (prefix rel-2, in the same directory, made while this one
    # runs) is left alone
    made = _recording(monkeypatch)
    other = tmp_path / "out" / "beam-temp-rel-2.PRIVATE-staging-0123"
    record = outputs.staging_directory

    def and_another_run(prefix):
        other.mkdir()
        return record(prefix)
    monkeypatch.setattr(outputs, "staging_directory", and_another_run)
    assert select_partitions.main(_cli_args(tmp_path)) == 0
    assert len(made) == 1 and not os.path.exists(made[0]) and other.is_dir()


def test_a_failed_run_removes_its_staged_files(tmp_path, monkeypatch, capsys):
    made = _recording(monkeypatch)
    staged_files = []

    def fail_after_staging(self, refs):
        staged_files.extend(os.listdir(self.directory))
        raise RuntimeError("injected failure")
    monkeypatch.setattr(staging.Staging, "read", fail_after_staging)
    assert select_partitions.main(_cli_args(tmp_path)) == 1
    assert staged_files and len(made) == 1 and not os.path.exists(made[0])
    assert sorted(os.listdir(tmp_path)) == ["in.tsv"]


def test_a_remote_output_is_not_staged():
    assert outputs.staging_directory("gs://bucket/rel") is None


def test_a_terminated_run_removes_its_staged_files(tmp_path):
    # SIGTERM (kill, a job scheduler) while the run stages: exit 130 with one line,
    # and nothing of the run is left, its private staged files included.
    import signal
    import subprocess
    import sys
    import time
    data = tmp_path / "in.tsv"
    synthetic.write_tsv(str(data), 40000, seed=5, max_occurrences=60)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "beam_dpsu.pipelines.cli", "select", "--input", str(data),
         "--output", str(tmp_path / "out" / "rel"), "--mechanism", "weighted-gaussian",
         "--epsilon", "3", "--delta", "1e-5", "--quiet"],
        env=env, stderr=subprocess.PIPE, text=True)
    staged = str(tmp_path / "out" / "beam-temp-rel.PRIVATE-staging-*" / "*.blocks")
    deadline = time.time() + 120
    while proc.poll() is None and not glob.glob(staged) and time.time() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be terminated"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130 and lines[-1].endswith("interrupted"), err
    assert sorted(os.listdir(tmp_path)) == ["in.tsv"]
