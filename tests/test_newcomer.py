"""A newcomer's first hour: the exact steps that went wrong, and what they give now."""
import gzip
import os
import subprocess
import sys

import pytest

from beam_dpsu.dp.data import lines
from beam_dpsu.dp.evaluation import synthetic

pytestmark = pytest.mark.subprocess


def beam_dpsu(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "beam_dpsu.pipelines.cli", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


SELECT = ["--mechanism", "weighted-gaussian", "--epsilon", "1", "--delta", "1e-6",
          "--insecure-test-seed", "1", "--quiet"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("newcomer") / "data.tsv")
    synthetic.write_tsv(path, 3000, seed=5)
    return path


def _swapped(src, dst):
    # awk -F'\t' '{print $2"\t"$1}' data.tsv > swapped.tsv
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for line in f:
            user, item = line.rstrip("\n").split("\t")
            g.write(f"{item}\t{user}\n")


def test_swapped_columns_are_refused_with_the_way_out(data, tmp_path):
    swapped = str(tmp_path / "swapped.tsv")
    _swapped(data, swapped)
    done = beam_dpsu("select", "--input", swapped, "--output", str(tmp_path / "out"), *SELECT)
    assert done.returncode == 2
    errors = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "look swapped" in errors[0] and "--trust-columns" in errors[0]
    assert not list(tmp_path.glob("out*"))               # nothing written, nothing read
    # the way out, when the first column really is the person
    done = beam_dpsu("select", "--input", swapped, "--output", str(tmp_path / "out"),
                     "--trust-columns", *SELECT)
    assert done.returncode == 0, done.stderr
    # the same data the right way round passes, gzipped too
    gz = str(tmp_path / "data.tsv.gz")
    with open(data, "rb") as f, gzip.open(gz, "wb") as g:
        g.write(f.read())
    for path in (data, gz):
        done = beam_dpsu("select", "--input", path, "--output", str(tmp_path / os.path.basename(
            path)), *SELECT)
        assert done.returncode == 0, done.stderr


def test_the_check_tells_the_projects_datasets_from_their_swaps():
    # Each shared dataset (when present) and its swap: never a false alarm on the
    # originals, always an alarm on the swaps (they are in user order).
    folder = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
    names = sorted(f for f in os.listdir(folder) if f.endswith(".tsv.gz")) if os.path.isdir(
        folder) else []
    if not names:
        pytest.skip("the shared datasets are not here")
    for name in names:
        sample = lines.sniff_lines(os.path.join(folder, name))
        swapped = [b"\t".join(ln.split(b"\t", 1)[::-1]) for ln in sample]
        assert not lines.looks_swapped(sample), name
        assert lines.looks_swapped(swapped), name


def test_shuffled_or_short_input_gives_no_alarm():
    users = [b"u%d\ti%d" % (k % 97, k % 13) for k in range(5000)]  # no order at all
    assert not lines.looks_swapped(users)
    assert not lines.looks_swapped([b"i1\tu1", b"i2\tu1"])        # too few lines to tell


def test_a_third_column_is_refused_unless_the_item_is_the_rest(data, tmp_path):
    three = tmp_path / "three.tsv"
    with open(data, encoding="utf-8") as f:
        three.write_text("".join(line.rstrip("\n") + "\t1\n" for line in f))
    done = beam_dpsu("select", "--input", str(three), "--output", str(tmp_path / "o"), *SELECT)
    assert done.returncode == 2
    errors = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "line 1" in errors[0] and "3 tab-separated fields" in errors[0]
    assert "--tabs-in-items" in errors[0] and not list(tmp_path.glob("o*"))
    done = beam_dpsu("select", "--input", str(three), "--output", str(tmp_path / "o"),
                     "--tabs-in-items", *SELECT)
    assert done.returncode == 0, done.stderr
    items = open(str(tmp_path / "o") + "-items-00000-of-00001", encoding="utf-8").read()
    assert items and all(line.endswith("\t1") for line in items.splitlines())


@pytest.mark.parametrize("command", ["top-k", "hitting-set", "compare"])
def test_every_command_checks_its_columns(data, tmp_path, command):
    swapped = str(tmp_path / "swapped.tsv")
    _swapped(data, swapped)
    extra = {"top-k": ["--k", "3", "--epsilon", "1", "--delta", "1e-6"],
             "hitting-set": ["--k", "3", "--epsilon", "1", "--delta", "1e-6"],
             "compare": ["--mechanisms", "weighted-gaussian", "--epsilons", "1",
                         "--delta", "1e-6", "--trials", "1"]}[command]
    done = beam_dpsu(command, "--input", swapped, "--output", str(tmp_path / "o"), *extra)
    assert done.returncode == 2 and "look swapped" in done.stderr, done.stderr


@pytest.mark.parametrize("command,bad,message", [
    ("select", SELECT[:2] + ["--epsilon", "-1", "--delta", "1e-6"], "--epsilon must be"),
    ("top-k", ["--k", "0", "--epsilon", "1", "--delta", "1e-6"], "--k must be"),
    ("hitting-set", ["--k", "3", "--epsilon", "1", "--delta", "2"], "--delta must be"),
    ("compare", ["--mechanisms", "nope", "--epsilon", "1", "--delta", "1e-6"],
     "unknown mechanism"),
    ("select", ["--help"], None)])
def test_a_parameter_mistake_is_reported_before_beam_is_imported(data, tmp_path, command, bad,
                                                                   message):
    # python -X importtime lists every module imported, on stderr
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "beam_dpsu.pipelines.cli",
                           command, "--input", data, "--output", str(tmp_path / "o"), *bad],
                          capture_output=True, text=True, timeout=300)
    imported = [ln for ln in done.stderr.splitlines() if ln.startswith("import time:")]
    said = [ln for ln in done.stderr.splitlines() if not ln.startswith("import time:")]
    assert imported and not any("apache_beam" in ln for ln in imported)
    if message is None:
        assert done.returncode == 0 and "--epsilon" in done.stdout and not said
    else:
        assert done.returncode == 2 and len(said) == 1 and message in said[0], said


def test_a_misspelt_flag_is_named_before_the_missing_one_it_leaves(data, tmp_path):
    done = beam_dpsu("select", "--input", data, "--output", str(tmp_path / "o"),
                     "--mechanism", "weighted-gaussian", "--epsilonn", "1", "--delta", "1e-6")
    assert done.returncode == 2
    assert done.stderr.strip() == "beam-dpsu select: error: unrecognized arguments: --epsilonn 1"


def test_the_stop_message_never_says_all_k_were_saved():
    from beam_dpsu.dp.mechanisms.topk import TopKMechanism
    m = TopKMechanism(20, 1.0, 1e-6)
    assert "all 20 selections were made" in m.release_note(19)
    assert "only the 20 selections" not in m.release_note(19)
    assert "only the 6 selections made are charged, not 20" in m.release_note(5)


def test_write_release_writes_top_k_rows_as_the_command_line_does(tmp_path):
    import apache_beam as beam
    from beam_dpsu.dp.mechanisms.topk import TopKMechanism
    from beam_dpsu.dp.randomness.noise import RunKey
    from beam_dpsu.transforms import runners
    from beam_dpsu.transforms.topk import TopK
    from beam_dpsu.transforms.write import WriteRelease, ranked_lines
    pairs = [(f"u{u}", f"w{j}") for u in range(300) for j in range(12) if u % (j + 1) == 0]
    out = str(tmp_path / "top.txt")
    with beam.Pipeline(options=runners.pipeline_options([])) as p:
        (p | beam.Create(pairs) | TopK(TopKMechanism(11, 3.0, 1e-6), RunKey.from_test_seed(2))
         | WriteRelease(out, arrange=ranked_lines))
    rows = open(out, encoding="utf-8").read().splitlines()
    assert rows and [r.split("\t")[0] for r in rows] == [str(k) for k in range(1, len(rows) + 1)]
    assert all(len(r.split("\t")) == 2 and r.split("\t")[1].startswith("w") for r in rows)


def test_ctrl_c_during_start_up_is_one_line(data, tmp_path):
    import signal
    import time
    for delay in (0.3, 0.6):  # while Python imports Beam
        # a terminal's SIGINT disposition, even when the tests run with SIGINT ignored (a
        # background job's): Python then installs no handler and the run ignores Ctrl-C
        proc = subprocess.Popen([sys.executable, "-m", "beam_dpsu.pipelines.cli", "select",
                                 "--input", data, "--output", str(tmp_path / "o"), *SELECT],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        # on a fast machine the run may be past its start: the test seed's warning, then
        # the one line
        lines = [ln for ln in err.splitlines()
                 if ln.strip() and not ln.startswith("WARNING: --insecure-test-seed")]
        assert proc.returncode in (130, -signal.SIGINT), err
        assert len(lines) <= 1 and "Traceback" not in err, err


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("during", ["_check", "import_module"])
@pytest.mark.parametrize("entry", ["run_command", "run_module"])
def test_a_signal_while_the_command_starts_is_one_line_and_130(monkeypatch, capsys, signum,
                                                               during, entry):
    # The signal arrives while the flags are checked or the command's module is imported
    # (held there: inside a C extension's import it became an ImportError), then comes
    # through once they are done: one line, 130, whichever signal and entry.
    import importlib
    import signal
    import threading
    from beam_dpsu.pipelines import cli
    sig = getattr(signal, signum)
    pair = {signal.SIGINT, signal.SIGTERM}

    def send():
        # to the main thread, as in the command's own process (its only thread then): a
        # signal to this process could go to one of the test runner's threads instead
        signal.pthread_kill(threading.main_thread().ident, sig)
    if during == "_check":
        real_check = cli._check

        def check(command, argv):
            send()
            return real_check(command, argv)
        monkeypatch.setattr(cli, "_check", check)
    else:
        real_import = importlib.import_module

        def import_module(name, *args):  # the command's module, once (not another's)
            if name == "beam_dpsu.pipelines.generate":
                monkeypatch.setattr(cli.importlib, "import_module", real_import)
                send()
            return real_import(name, *args)
        monkeypatch.setattr(cli.importlib, "import_module", import_module)
    argv = ["--users", "5", "--output", "/nonexistent/never-written"]
    # Python's own Ctrl-C handler (even in a worker started with SIGINT ignored), the
    # default SIGTERM, neither signal blocked: a process's state at its start
    handlers = {s: signal.signal(s, h) for s, h in ((signal.SIGINT, signal.default_int_handler),
                                                    (signal.SIGTERM, signal.SIG_DFL))}
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, pair)
    try:
        status = (cli.run_command("generate", argv) if entry == "run_command"
                  else cli.run_module("generate", argv))
        after = signal.getsignal(signal.SIGTERM)
    except KeyboardInterrupt:  # escaped the command: a failure of this test, not the run's end
        pytest.fail("the signal escaped the command as a KeyboardInterrupt")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, h in handlers.items():
            signal.signal(s, h)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert status == 130 and len(err) == 1 and err[0].endswith("interrupted"), err
    assert after is signal.SIG_DFL  # the command put SIGTERM's handler back


def test_the_first_compilation_is_announced_only_where_it_is_ahead(tmp_path):
    import importlib.util
    from beam_dpsu.dp.randomness import compiled
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    if importlib.util.find_spec("numba") is None:
        assert not compiled.first_compilation_ahead([str(cache)])
        return
    assert compiled.first_compilation_ahead([str(cache)])          # no cache index
    (cache / "array_kernels.is_sorted-1.py311.nbi").write_bytes(b"")
    assert not compiled.first_compilation_ahead([str(cache)])


def test_compare_sweeps_max_items_as_the_readme_says(data, tmp_path):
    # README, "Which mechanism": sweep Δ0 with compare's mechanism specs
    import json
    done = beam_dpsu("compare", "--input", data, "--output", str(tmp_path / "c"),
                     "--mechanisms", "weighted-gaussian:max_items=50,"
                                     "weighted-gaussian:max_items=300",
                     "--epsilon", "1", "--delta", "1e-6", "--trials", "1", "--quiet")
    assert done.returncode == 0, done.stderr
    text = open(tmp_path / "c" / "results.PRIVATE.md", encoding="utf-8").read()
    assert "weighted-gaussian max_items=50" in text and "weighted-gaussian max_items=300" in text
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md"),
                  encoding="utf-8").read()
    assert "weighted-gaussian:max_items=50,weighted-gaussian:max_items=300" in readme.replace(
        "\n", "")
    assert json.loads(done.stdout)["trials"] == 1
