"""The ``beam-dpsu`` console command: subcommands, packaging, quiet Beam, progress.

What is covered here (and what is not): ``beam_dpsu.cli.main`` is run in-process
(help, dispatch, exit statuses, progress lines), the same code is run as a
subprocess with ``python -m beam_dpsu.cli`` (what the console script calls,
so stderr holds exactly what a user sees, including Beam's import-time and
worker-process output), and setup.py's ``setup()`` arguments are checked for
the ``beam-dpsu`` entry point and the packages. Installing into a fresh venv is
not done here (minutes); ``.ci/run`` installs the package before the tests.
"""
import json
import os
import re
import pathlib
import subprocess
import sys

import pytest
import setuptools

from beam_dpsu.pipelines import cli

from beam_dpsu.pipelines import console
from conftest import PROGRESS_LINE, without_progress

ROOT = pathlib.Path(__file__).resolve().parents[1]
SELECT = ["--mechanism", "weighted-gaussian", "--epsilon", "1", "--delta", "1e-6",
          "--max-items-per-user", "20"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("console") / "data.tsv.gz")
    assert cli.main(["generate", "--output", path, "--users", "300", "--quiet"]) == 0
    return path


def run_cli(*args, env_extra=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("BEAM_DPSU_DEBUG", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "beam_dpsu.pipelines.cli", *args], capture_output=True,
                          text=True, env=env, cwd=str(ROOT), timeout=600)


def test_help_lists_the_subcommands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("select", "top-k", "compare", "generate", "audit"):
        assert f"\n  {command} " in out


def test_no_or_unknown_command_is_one_line_and_status_2(capsys):
    assert cli.main([]) == 2
    assert "usage: beam-dpsu COMMAND" in capsys.readouterr().err
    assert cli.main(["selekt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("beam-dpsu: error: unknown command 'selekt'")


@pytest.mark.parametrize("command,flag", [("select", "--max-items-per-user"),
                                          ("top-k", "--k-bar"), ("compare", "--mechanisms"),
                                          ("generate", "--users"), ("audit", "--trials")])
def test_subcommand_help_lists_its_flags_under_the_console_name(capsys, command, flag):
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: beam-dpsu {command} ") and flag in out
    assert "--quiet" in out and "--verbose" in out


def test_select_in_process_reports_progress_under_the_console_name(data, tmp_path, capsys):
    prefix = str(tmp_path / "out")
    assert cli.main(["select", "--input", data, "--output", prefix] + SELECT) == 0
    captured = capsys.readouterr()
    # the printed summary is the run's: its count is the items file's
    with open(prefix + "-items-00000-of-00001", encoding="utf-8") as f:
        assert json.loads(captured.out)["num_released"] == len(f.read().splitlines())
    lines = captured.err.strip().splitlines()
    assert lines and all(l.startswith("beam-dpsu select: [") for l in lines), lines
    # Stage lines that say something true at every size (no per-worker line on a
    # short run: a worker prints one only after its first interval).
    assert any(re.search(r"\] reading 1 file \([\d.]+ (bytes|kB|MB)\) on DirectRunner$", l)
               for l in lines), lines
    assert any(re.search(r"\] pipeline finished in \d+\.\d s \(the input's exact counts: "
                         r"--verbose, or the private run details\)$", l) for l in lines), lines
    assert not any("so far" in l for l in lines), lines
    assert any(l.endswith(f"summary {prefix}.json") for l in lines)
    assert os.path.exists(prefix + ".json")


def test_errors_carry_the_console_name(tmp_path, capsys):
    assert cli.main(["select", "--input", str(tmp_path / "none"), "--output",
                     str(tmp_path / "o")] + SELECT) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("beam-dpsu select: error: no input file")


def test_quiet_prints_no_progress(data, tmp_path, capsys):
    assert cli.main(["select", "--input", data, "--output", str(tmp_path / "o"), "--quiet"]
                    + SELECT) == 0
    assert capsys.readouterr().err == ""
    assert cli.main(["top-k", "--input", data, "--output", str(tmp_path / "t"), "--quiet",
                     "--k", "3", "--epsilon", "1", "--delta", "1e-6"]) == 0
    assert capsys.readouterr().err == ""


def test_a_plain_subprocess_run_prints_only_our_lines(data, tmp_path):
    # No Beam noise: the apitools warning (printed when apache_beam is imported)
    # and INFO lines are suppressed; only our progress lines are on stderr.
    proc = run_cli("select", "--input", data, "--output", str(tmp_path / "o"), *SELECT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines and all(l.startswith("beam-dpsu select: [") for l in lines), lines
    assert json.loads(proc.stdout)["mechanism"] == "weighted-gaussian"


def test_multi_processing_progress_lines_stay_whole(data, tmp_path):
    # The worker processes of the multi-process DirectRunner are Beam's own (they log
    # Beam's lines to the shared stderr); each of OUR lines is still one whole line.
    proc = run_cli("select", "--input", data, "--output", str(tmp_path / "o"), *SELECT,
                   "--direct_running_mode=multi_processing", "--direct_num_workers=2")
    assert proc.returncode == 0, proc.stderr
    ours = [l for l in proc.stderr.splitlines() if "beam-dpsu select: [" in l]
    assert ours and all(PROGRESS_LINE.match(l) for l in ours), proc.stderr
    stamps = [len(re.findall(r"\[\d+\.\d s\]", l)) for l in ours]
    assert set(stamps) == {1}, proc.stderr  # (two lines' texts on one line)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_whose_stderr_reader_is_gone_still_releases(data, tmp_path, workers):
    # `beam-dpsu select ... 2> >(head -1)`: progress lines are dropped once stderr
    # cannot be written. Before, the worker's failed line failed its bundle, a
    # one-worker run exited 1 and a two-worker run waited forever.
    extra = (["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
             if workers > 1 else [])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("BEAM_DPSU_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "beam_dpsu.pipelines.cli", "select", "--input", data,
                             "--output", str(tmp_path / "o"), *SELECT, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(ROOT), env=env)
    proc.stderr.close()
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert json.loads(out)["num_released"] == len(
        (tmp_path / "o-items-00000-of-00001").read_text().splitlines())


class _Writes:
    """A stream recording each ``write`` call."""

    def __init__(self):
        self.calls = []

    def write(self, text):
        self.calls.append(text)

    def flush(self):
        self.calls.append(None)


def test_progress_and_error_lines_are_each_one_write(monkeypatch):
    # Workers share the command's stderr: a line written in two calls (print's text,
    # then its newline: two system calls when PYTHONUNBUFFERED is set) can be split by
    # another process's line. Each line is one write, followed by a flush.
    stream = _Writes()
    monkeypatch.setattr(sys, "stderr", stream)
    console.Progress("beam-dpsu select")("3 users read")
    assert console.run_main("beam-dpsu select", lambda: 1 // 0) == 1
    writes = [c for c in stream.calls if c is not None]
    assert len(writes) == 2 and stream.calls == [w for c in writes for w in (c, None)]
    assert all(w.endswith("\n") and w.count("\n") == 1 for w in writes), writes
    assert PROGRESS_LINE.match(writes[0]) and writes[0].endswith("] 3 users read\n")
    assert writes[1].startswith("beam-dpsu select: failed: ")


def test_quiet_subprocess_prints_nothing_on_stderr(data, tmp_path):
    proc = run_cli("select", "--input", data, "--output", str(tmp_path / "o"), "--quiet",
                   *SELECT)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_verbose_brings_beam_logs_back(data, tmp_path):
    proc = run_cli("select", "--input", data, "--output", str(tmp_path / "o"), "--verbose",
                   *SELECT)
    assert proc.returncode == 0, proc.stderr
    assert without_progress(proc.stderr)  # Beam's own lines (apitools, INFO, ...)
    assert any(l.startswith("beam-dpsu select: [") for l in proc.stderr.splitlines())


def test_checkout_module_commands_still_work(data, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "pipelines.select_partitions", "--input", data,
                           "--output", str(tmp_path / "o")] + SELECT, capture_output=True,
                          text=True, env=env, cwd=str(ROOT), timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert all(l.startswith("select_partitions: [") for l in proc.stderr.strip().splitlines())
    # The checkout's entry point is a plain module that calls the installed package's
    # main (no sys.modules swap): the package is imported under one name only.
    source = (ROOT / "pipelines" / "select_partitions.py").read_text(encoding="utf-8")
    assert "sys.modules" not in source and "beam_dpsu.pipelines" in source


def setup_arguments(monkeypatch):
    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.chdir(ROOT)
    code = (ROOT / "setup.py").read_text(encoding="utf-8")
    exec(compile(code, str(ROOT / "setup.py"), "exec"), {"__name__": "__main__"})
    return captured


def test_setup_installs_the_console_command_and_no_generic_package(monkeypatch):
    kw = setup_arguments(monkeypatch)
    assert "beam-dpsu=beam_dpsu.pipelines.cli:console" in kw["entry_points"]["console_scripts"]
    packages = kw["packages"]
    assert {"beam_dpsu.dp", "beam_dpsu.transforms", "beam_dpsu.pipelines"} <= set(packages)
    assert all(p == "beam_dpsu" or p.startswith("beam_dpsu.") for p in packages), packages
    module, func = "beam_dpsu.pipelines.cli:console".split(":")
    assert callable(getattr(__import__(module, fromlist=[func]), func))


def test_the_installed_console_script_runs_from_another_directory(data, tmp_path):
    # Install this checkout (no dependencies: they are this interpreter's) into a
    # scratch prefix, then run the generated `beam-dpsu` script from a directory that
    # is not the checkout, with only the scratch site-packages on the path: the
    # console entry point itself, not a module run, releases items.
    prefix = tmp_path / "prefix"
    build = subprocess.run(
        # --ignore-installed: never uninstall this interpreter's own beam-dpsu
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed",
         "--no-build-isolation", "--prefix", str(prefix), str(ROOT)],
        capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    script = prefix / "bin" / "beam-dpsu"
    site = next(prefix.glob("lib/python*/site-packages"))
    assert script.exists() and (site / "beam_dpsu").is_dir()
    assert not (site / "pipelines").exists()          # nothing generic installed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("BEAM_DPSU_DEBUG", None)
    proc = subprocess.run([str(script), "select", "--input", data, "--output", "out",
                           "--insecure-test-seed", "3", *SELECT], cwd=elsewhere,
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["num_released"] > 0
    assert (elsewhere / "out-items-00000-of-00001").read_text().strip()


@pytest.mark.parametrize("verbose", [False, True])
def test_info_lines_of_a_logger_with_its_own_level_follow_verbose(verbose):
    # Beam's Prism job server sets its logger to INFO and logs Prism's own lines through
    # it ("INFO: Serving JobManagement ..."): without --verbose they are not shown
    code = ("import logging; from beam_dpsu.pipelines import console; "
            f"console.configure_logging({verbose}); "
            "log = logging.getLogger('PrismJobServer'); log.setLevel(logging.INFO); "
            "log.info('Serving JobManagement'); log.error('a real error')")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stderr.splitlines()
    assert ("INFO: Serving JobManagement" in err) is verbose
    assert "ERROR: a real error" in err
