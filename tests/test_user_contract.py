"""What a user of the command line can count on: exit statuses, one-line messages,
progress that says something true, and nothing private left readable.

* the counts (users, malformed lines, released items) come from the pipeline's own
  output, so every runner, also one without metrics (Dask), follows the same rules:
  input without a well-formed line exits 1 and leaves nothing;
* Ctrl-C exits 130 with one line, ``PROG: interrupted``, and leaves nothing behind;
* an output location that cannot be created exits 2 before any data is read;
* a successful Dask run logs no error on the scheduler or the workers;
* progress lines: stage lines at every size; ``--quiet`` puts no exact count on stderr;
* the README's quickstart can be run twice in a row;
* every file holding private data says PRIVATE in its name and is owner-only (the
  dead-letter file, the counts files; ``compare``'s outputs: ``test_compare.py``).
"""
import contextlib
import glob
import json
import logging
import os
import pathlib
import re
import shlex
import signal
import stat
import subprocess
import sys
import time

import pytest

from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.pipelines import console, generate, outputs, runs, select_partitions, top_k
from conftest import PROGRESS_LINE, without_progress

ROOT = pathlib.Path(__file__).resolve().parents[1]
ITEMS = "-items-00000-of-00001"
PRIVATE = ".PRIVATE-run-details.json"
DEAD = ".PRIVATE-dead-letter-00000-of-00001"
SELECT = ["--mechanism", "count-gaussian", "--epsilon", "2", "--delta", "1e-6",
          "--max-items-per-user", "2"]


def small_input(tmp_path, users=300, junk=0):
    path = tmp_path / "in.tsv"
    path.write_text("".join(f"u{u}\tcommon\nu{u}\tx{u % 3}\n" for u in range(users))
                    + "junk line\n" * junk)
    return str(path)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def env_for_subprocess(**extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]), **extra)
    env.pop("BEAM_DPSU_DEBUG", None)
    return env


@pytest.fixture
def no_metrics(monkeypatch):
    """The DirectRunner's result without metrics, as Dask's (NotImplementedError)."""
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    def refuse(self):
        raise NotImplementedError("no metrics on this runner")

    monkeypatch.setattr(fn_runner.RunnerResult, "metrics", refuse)


# -- counts from the pipeline's own output ----------------------------------------

def test_counts_come_from_the_pipeline_on_a_runner_without_metrics(tmp_path, capsys,
                                                                  no_metrics):
    data = small_input(tmp_path, users=300, junk=3)
    prefix = str(tmp_path / "out" / "o")
    assert select_partitions.main(["--input", data, "--output", prefix] + SELECT) == 0
    captured = capsys.readouterr()
    details = json.load(open(prefix + PRIVATE))
    assert details["num_users"] == 300 and details["malformed_lines"] == 3
    items = open(prefix + ITEMS).read().splitlines()
    # > 0: "common" (300 holders; T = 17.3, σ = 3.25) is missed with probability Φ(−87)
    assert json.loads(captured.out)["num_released"] == len(items) > 0
    assert json.load(open(prefix + ".json"))["num_released"] == len(items)
    err = without_progress(captured.err)
    assert err == ["WARNING: malformed input lines were skipped (no tab, empty user id or "
                   f"invalid UTF-8); their count is in {prefix + PRIVATE}"], err
    # The counts files were read into the private details and deleted.
    assert sorted(os.listdir(tmp_path / "out")) == sorted(["o" + ITEMS, "o.json", "o" + PRIVATE])


def test_no_well_formed_line_exits_1_and_keeps_only_the_dead_letter_without_metrics(
        tmp_path, capsys, no_metrics):
    path = tmp_path / "junk.tsv"
    path.write_text("no tab here\n" * 7)
    rc = select_partitions.main(["--input", str(path), "--output",
                                 str(tmp_path / "new" / "o"), "--dead-letter",
                                 str(tmp_path / "new" / "dead")] + SELECT)
    err = without_progress(capsys.readouterr().err)
    assert rc == 1 and len(err) == 1, err
    dead = str(tmp_path / "new" / "dead") + DEAD
    assert "no well-formed" in err[0] and "(7 malformed" not in err[0]  # the count: --verbose
    assert err[0].endswith(f"nothing released; the malformed lines are in {dead}")
    # no release, summary or counts files: only the dead letter the user asked for
    assert sorted(os.listdir(tmp_path)) == ["junk.tsv", "new"]
    assert os.listdir(tmp_path / "new") == ["dead" + DEAD] and mode(dead) == 0o600
    assert open(dead).read() == "no tab here\n" * 7


def test_the_counts_file_is_private_while_it_exists(tmp_path, monkeypatch):
    seen = {}
    read = outputs.read_counts

    def check_then_read(prefix, names):
        for name in names:
            path = outputs.counts_file(prefix, name)
            seen[os.path.basename(path)] = mode(path)
        return read(prefix, names)

    monkeypatch.setattr(outputs, "read_counts", check_then_read)
    data = small_input(tmp_path)
    old_umask = os.umask(0)  # owner-only whatever the umask
    try:
        assert select_partitions.main(["--input", data, "--output", str(tmp_path / "o"),
                                       "--quiet"] + SELECT) == 0
    finally:
        os.umask(old_umask)
    assert seen == {f"o.PRIVATE-run-counts-{name}.json": 0o600
                    for name in ("users", "malformed_lines", "released")}
    assert not glob.glob(str(tmp_path / "o") + outputs.COUNTS_SUFFIX + "*")


def test_a_run_that_wrote_no_counts_fails(tmp_path, capsys, monkeypatch):
    # The counts files are always written (zeros included): a missing one means the
    # runner skipped part of the graph, never "no users".
    monkeypatch.setattr(outputs, "write_counts", lambda pipeline, prefix: [])
    data = small_input(tmp_path)
    assert select_partitions.main(["--input", data, "--output", str(tmp_path / "o" / "x")]
                                  + SELECT) == 1
    err = without_progress(capsys.readouterr().err)
    assert len(err) == 1 and "wrote no" in err[0] and "PRIVATE-run-counts" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["in.tsv"]


def _release_run(tmp_path, data):
    import argparse
    args = argparse.Namespace(input=data, output=str(tmp_path / "o"), overwrite=False,
                              insecure_test_seed=1, tabs_in_items=False, trust_columns=False,
                              dead_letter=None, quiet=True)
    return runs.ReleaseRun(args, ["--runner=DirectRunner"])


def _lines_per_user(p):
    import apache_beam as beam
    lines = p | beam.Create([("u1", 2), ("u2", 3)])
    outputs.tally(lines, "lines", counts_second=True)


def test_a_run_counts_in_a_pipeline_of_its_own_and_keeps_no_counts_file(tmp_path):
    # ReleaseRun.count: the pre-pipeline of a calibration (exact counts, owner-only
    # files deleted at once)
    data = small_input(tmp_path)
    run = _release_run(tmp_path, data)
    counts = run.count(_lines_per_user)
    assert counts == {"users": 0, "malformed_lines": 0, "released": 0, "lines": 5}
    assert sorted(os.listdir(tmp_path)) == ["in.tsv"]


def test_a_failed_run_removes_the_counts_files_of_its_pre_pipeline(tmp_path, capsys,
                                                                  monkeypatch):
    # the counts of a pre-pipeline (ReleaseRun.count) are files of the run: a failure
    # before they are read back leaves none of them
    data = small_input(tmp_path)
    run = _release_run(tmp_path, data)

    def fail(prefix, names):
        assert os.path.exists(outputs.counts_file(prefix, "lines"))
        raise RuntimeError("injected failure")

    def build(p, run_key):
        monkeypatch.setattr(outputs, "read_counts", fail)
        run.count(_lines_per_user)

    with pytest.raises(RuntimeError, match="injected failure"):
        run.run(build, lambda result, released: {})
    assert sorted(os.listdir(tmp_path)) == ["in.tsv"]


def test_write_private_file_is_owner_only_whatever_the_umask(tmp_path):
    path = str(tmp_path / "x.PRIVATE")
    old_umask = os.umask(0)
    try:
        outputs.write_private_file(path, [b"a", "b"])
        outputs.write_private_file(path, iter([b"c"]))  # replaces it, still owner-only
    finally:
        os.umask(old_umask)
    assert open(path, "rb").read() == b"c\n" and mode(path) == 0o600
    assert os.listdir(tmp_path) == ["x.PRIVATE"]  # no temporary file left


# -- Ctrl-C ------------------------------------------------------------------------

def test_beams_report_of_a_keyboard_interrupt_is_recognised():
    try:
        try:
            raise KeyboardInterrupt()
        except KeyboardInterrupt:  # what Beam does with it in a DoFn
            raise RuntimeError("KeyboardInterrupt [while running 'ReadUserItems/Read']")
    except RuntimeError as e:
        wrapped = e
    assert console.interrupted(wrapped)
    assert console.interrupted(RuntimeError("KeyboardInterrupt [while running 'X/Y']"))
    assert not console.interrupted(RuntimeError("ValueError: bad [while running 'X']"))
    assert not console.interrupted(ValueError("KeyboardInterrupt"))


def test_an_interrupt_inside_the_pipeline_is_one_line_130_and_leaves_nothing(
        tmp_path, capsys, monkeypatch):
    def interrupt(self, element):
        raise KeyboardInterrupt()

    def interrupt_group(*args):
        raise KeyboardInterrupt()

    from beam_dpsu.dp.data import columnar
    monkeypatch.setattr(columnar, "bounded_histogram", interrupt_group)  # the columnar path
    data = small_input(tmp_path, junk=2)
    for main, flags in ((select_partitions.main, SELECT),
                        (top_k.main, ["--k", "2", "--epsilon", "1", "--delta", "1e-6"])):
        rc = main(["--input", data, "--output", str(tmp_path / "new" / "sub" / "o"),
                   "--dead-letter", str(tmp_path / "new" / "dead")] + flags)
        captured = capsys.readouterr()
        assert rc == 130 and captured.out == ""
        assert without_progress(captured.err) == [
            f"{main.__module__.rsplit('.', 1)[-1]}: interrupted"], captured.err
        assert sorted(os.listdir(tmp_path)) == ["in.tsv"]  # no file, temp file or directory


def test_sigint_mid_run_exits_130_with_one_line_and_leaves_nothing(tmp_path):
    data = str(tmp_path / "data.tsv.gz")
    synthetic.write_tsv(data, 60_000, seed=2)  # a run of many seconds
    before = sorted(os.listdir(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "beam_dpsu.pipelines.cli", "select", "--input", data,
         "--output", str(tmp_path / "out" / "sub" / "o"), "--dead-letter",
         str(tmp_path / "out" / "dead")] + SELECT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
        env=env_for_subprocess(),
        # a terminal's SIGINT disposition, even when the tests run with SIGINT ignored
        # (a shell's background job), which the command would otherwise inherit
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = ""
        while "] reading 1 file" not in first:  # wait until the run has started
            line = proc.stderr.readline()
            assert line, "the command ended before its run started"
            first += line
        time.sleep(1.5)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert out == "" and without_progress(err) == ["beam-dpsu select: interrupted"], err
    assert all(PROGRESS_LINE.match(l) for l in (first + err).splitlines()[:-1])
    assert sorted(os.listdir(tmp_path)) == before  # no release, temp file or directory


# -- locations that cannot be created --------------------------------------------

@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("flag", ["--output", "--dead-letter"])
def test_an_output_that_cannot_be_created_exits_2_before_reading(tmp_path, capsys, flag,
                                                                 monkeypatch):
    # /proc passes os.access (as root) but refuses to create anything in it.
    def never(*args, **kwargs):
        raise AssertionError("the input was read")

    monkeypatch.setattr(runs.ReleaseRun, "run_pipeline", never)
    data = small_input(tmp_path)
    argv = ["--input", data, "--output", str(tmp_path / "o")] + SELECT
    argv = (["--input", data, "--output", "/proc/x/y"] + SELECT if flag == "--output"
            else argv + ["--dead-letter", "/proc/x/dead"])
    before = sorted(os.listdir(tmp_path))
    assert select_partitions.main(argv) == 2
    err = without_progress(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("select_partitions: error: cannot write to "
                                               "'/proc/x/"), err
    assert "cannot create directory '/proc/x'" in err[0]
    assert sorted(os.listdir(tmp_path)) == before
    assert top_k.main(["--input", data, "--output", "/proc/o", "--k", "1", "--epsilon", "1",
                       "--delta", "1e-6"]) == 2
    assert "cannot create files in '/proc'" in capsys.readouterr().err


# -- progress lines ----------------------------------------------------------------

def test_stage_lines_and_quiet_without_exact_counts(tmp_path, capsys):
    data = small_input(tmp_path, users=300, junk=4)
    dead = str(tmp_path / "dead")
    prefix = str(tmp_path / "o")
    # by default no exact count of the input on stderr (a shared cluster's logs are seen
    # by others): they are in the private run details, and on stderr with --verbose
    assert select_partitions.main(["--input", data, "--output", prefix, "--dead-letter", dead]
                                  + SELECT) == 0
    err = capsys.readouterr().err.strip().splitlines()
    stages = [PROGRESS_LINE.sub("", l) for l in err if PROGRESS_LINE.match(l)]
    assert re.fullmatch(r"reading 1 file \(\d+\.\d kB\) on DirectRunner", stages[0]), stages
    assert re.fullmatch(r"pipeline finished in \d+\.\d s \(the input's exact counts: "
                        r"--verbose, or the private run details\)", stages[1]), stages
    assert without_progress("\n".join(err)) == [
        f"WARNING: malformed input lines were skipped (no tab, empty user id or invalid "
        f"UTF-8); their count is in {prefix + PRIVATE}; they are in {dead + DEAD}"]
    assert select_partitions.main(["--input", data, "--output", prefix, "--dead-letter", dead,
                                   "--overwrite", "--verbose"] + SELECT) == 0
    err = capsys.readouterr().err.strip().splitlines()
    stages = [PROGRESS_LINE.sub("", l) for l in err if PROGRESS_LINE.match(l)]
    assert re.fullmatch(r"pipeline finished in \d+\.\d s: 300 users, 4 malformed lines",
                        stages[1]), stages
    assert re.fullmatch(rf"released \d+ items: {re.escape(prefix + ITEMS)}, summary "
                        rf"{re.escape(prefix)}\.json", stages[2]), stages
    assert (f"WARNING: 4 malformed input line(s) skipped (no tab, empty user id or invalid "
            f"UTF-8); they are in {dead + DEAD}") in without_progress("\n".join(err))
    # --quiet: the warning stays, without the count (it is in the private details).
    assert select_partitions.main(["--input", data, "--output", prefix, "--dead-letter", dead,
                                   "--overwrite", "--quiet"] + SELECT) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"WARNING: malformed input lines were skipped (no tab, empty user id or invalid "
        f"UTF-8); their count is in {prefix + PRIVATE}; they are in {dead + DEAD}"]
    assert not re.search(r"\d", err.replace(prefix, "").replace(dead + DEAD, "")
                         .replace("UTF-8", ""))
    assert json.load(open(prefix + PRIVATE))["malformed_lines"] == 4
    # No well-formed line under --quiet: the error carries no count either.
    (tmp_path / "junk.tsv").write_text("junk\n" * 5)
    assert select_partitions.main(["--input", str(tmp_path / "junk.tsv"), "--output",
                                   str(tmp_path / "j"), "--quiet"] + SELECT) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"select_partitions: error: no well-formed user<TAB>item line in "
        f"{str(tmp_path / 'junk.tsv')!r}: nothing released"]


# -- the dead-letter file ------------------------------------------------------------

def test_the_dead_letter_file_is_private_and_counts_as_an_earlier_output(tmp_path, capsys):
    data = small_input(tmp_path, junk=2)
    dead = str(tmp_path / "d" / "dead")
    prefix = str(tmp_path / "o")
    old_umask = os.umask(0)
    try:
        assert select_partitions.main(["--input", data, "--output", prefix,
                                       "--dead-letter", dead, "--quiet"] + SELECT) == 0
    finally:
        os.umask(old_umask)
    assert os.listdir(tmp_path / "d") == ["dead" + DEAD]
    assert mode(dead + DEAD) == 0o600
    assert open(dead + DEAD).read() == "junk line\njunk line\n"
    assert json.load(open(prefix + PRIVATE))["dead_letter_files"] == dead + DEAD
    capsys.readouterr()
    # another prefix with the same dead letter: refused, then --overwrite replaces it
    other = str(tmp_path / "p")
    assert select_partitions.main(["--input", data, "--output", other, "--dead-letter",
                                   dead] + SELECT) == 2
    assert dead + DEAD in capsys.readouterr().err
    # the earlier run's details name its dead letter: --overwrite deletes it too
    assert select_partitions.main(["--input", data, "--output", prefix, "--overwrite",
                                   "--quiet"] + SELECT) == 0
    assert os.listdir(tmp_path / "d") == []


def test_an_empty_dead_letter_file_is_written_for_clean_input(tmp_path):
    data = small_input(tmp_path)
    dead = str(tmp_path / "dead")
    assert select_partitions.main(["--input", data, "--output", str(tmp_path / "o"),
                                   "--dead-letter", dead, "--quiet"] + SELECT) == 0
    assert open(dead + DEAD).read() == "" and mode(dead + DEAD) == 0o600


# -- generate and the quickstart ----------------------------------------------------

def test_generate_refuses_an_existing_file_unless_overwrite(tmp_path, capsys):
    out = str(tmp_path / "new" / "data.tsv")
    assert generate.main(["--output", out, "--users", "20", "--quiet"]) == 0
    first = open(out).read()
    capsys.readouterr()
    assert generate.main(["--output", out, "--users", "5", "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "exists" in err[0] and "--overwrite" in err[0], err
    assert open(out).read() == first
    assert generate.main(["--output", out, "--users", "5", "--quiet", "--overwrite"]) == 0
    assert open(out).read() != first and os.listdir(tmp_path / "new") == ["data.tsv"]
    # a failure leaves neither a partial file nor the directories it created
    assert generate.main(["--output", str(tmp_path / "a" / "b.tsv"), "--users", "-1"]) == 2
    assert sorted(os.listdir(tmp_path)) == ["new"]


def readme_quickstart() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Quickstart.*?```bash\n(.*?)```", readme, re.S).group(1)
    (command,) = [l for l in block.splitlines() if l.strip()]
    return command


def test_the_readme_quickstart_runs_twice_in_a_row(tmp_path):
    # The quickstart's venv and pip steps need the network; the beam-dpsu steps run
    # here with this interpreter, exactly as written otherwise.
    steps = readme_quickstart().split(" && ")
    assert steps[0].startswith("python3 -m venv") and "pip install" in steps[1]
    runs_ = [shlex.split(s) for s in steps[2:]]
    assert [r[:2] for r in runs_] == [[".venv/bin/beam-dpsu", "generate"],
                                      [".venv/bin/beam-dpsu", "select"]]
    for attempt in (1, 2):
        for argv in runs_:
            proc = subprocess.run([sys.executable, "-m", "beam_dpsu.pipelines.cli"] + argv[1:],
                                  capture_output=True, text=True, cwd=str(tmp_path),
                                  env=env_for_subprocess(), timeout=900)
            assert proc.returncode == 0, (attempt, argv[1], proc.stderr[-2000:])
    assert sorted(os.listdir(tmp_path / "demo")) == [
        "data.tsv.gz", "out" + ITEMS, "out.PRIVATE-run-details.json", "out.json"]


# -- Dask: the same contract, and no error logged ----------------------------------

@pytest.fixture(scope="module")
def dask_cluster():
    distributed = pytest.importorskip(
        "distributed", reason="dask[distributed] is not installed (pip install '.[dask]')")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + old if old else "")
    try:
        # Worker processes: the Dask runner's GroupByKey gives wrong results with
        # thread workers (processes=False). The scheduler runs in this process.
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None) as c:
            yield c
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def dask_flags(cluster):
    return ["--runner=DaskRunner", f"--dask_client_address={cluster.scheduler_address}"]


@contextlib.contextmanager
def errors_logged_in_this_process():
    """Every ERROR (or worse) log record of this process (the Dask scheduler's too: the
    ``distributed`` logger does not propagate to the root)."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(f"{record.name}: {record.getMessage()}")

    handler = Keep(logging.ERROR)
    loggers = [logging.getLogger(), logging.getLogger("distributed")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@pytest.mark.dask
def test_dask_no_well_formed_line_exits_1_and_counts_like_the_direct_runner(
        dask_cluster, tmp_path, capsys):
    junk = tmp_path / "junk.tsv"
    junk.write_text("no tab here\n" * 3)
    rc = select_partitions.main(["--input", str(junk), "--output", str(tmp_path / "n" / "o"),
                                 "--insecure-test-seed", "1"] + SELECT + dask_flags(dask_cluster))
    err = [l for l in without_progress(capsys.readouterr().err) if "insecure" not in l]
    assert rc == 1 and len(err) == 1 and "no well-formed" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["junk.tsv"]
    data = small_input(tmp_path, users=200, junk=2)
    summaries = {}
    for name, flags in (("d", ["--runner=DirectRunner"]), ("k", dask_flags(dask_cluster))):
        summaries[name] = select_partitions.run(
            ["--input", data, "--output", str(tmp_path / name), "--insecure-test-seed", "1",
             "--dead-letter", str(tmp_path / f"dead-{name}"), "--quiet"] + SELECT + flags)
    for s in summaries.values():
        assert s["PRIVATE_run_details"]["num_users"] == 200
        assert s["PRIVATE_run_details"]["malformed_lines"] == 2
    assert summaries["k"]["num_released"] == summaries["d"]["num_released"] > 0
    assert mode(str(tmp_path / "dead-k") + DEAD) == 0o600
    assert open(str(tmp_path / "dead-k") + DEAD).read() == "junk line\njunk line\n"
    assert not glob.glob(str(tmp_path / "*PRIVATE-run-counts*"))


@pytest.mark.dask
def test_a_successful_dask_run_logs_no_error(dask_cluster, tmp_path, capsys):
    from distributed import Client

    def install(dask_worker):  # in each worker process (pickled by value)
        import logging as worker_logging
        found = []

        class Keep(worker_logging.Handler):
            def emit(self, record):
                found.append(f"{record.name}: {record.getMessage()}")

        handler = Keep(worker_logging.ERROR)
        for name in ("", "distributed"):
            worker_logging.getLogger(name).addHandler(handler)
        dask_worker.beam_dpsu_test_errors = (handler, found)

    def collect(dask_worker):
        import logging as worker_logging
        handler, found = dask_worker.beam_dpsu_test_errors
        for name in ("", "distributed"):
            worker_logging.getLogger(name).removeHandler(handler)
        return found

    data = small_input(tmp_path, users=200)
    with Client(dask_cluster) as client:
        client.run(install)
        with errors_logged_in_this_process() as launcher_and_scheduler:
            # a fresh run key: the first worker draws it, the others read it
            assert select_partitions.main(["--input", data, "--output", str(tmp_path / "o"),
                                           "--quiet"] + SELECT + dask_flags(dask_cluster)) == 0
        workers = client.run(collect)
    assert capsys.readouterr().err == ""
    assert launcher_and_scheduler == []
    assert {w: errors for w, errors in workers.items() if errors} == {}


