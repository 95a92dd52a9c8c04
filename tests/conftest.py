"""Shared test helpers.

Statistical tests in this suite state their false-failure probability; each
is below 1e-6 (most are 1e-7 or below).
"""
import math
import os
import pathlib
import re

import pytest

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_dataset(name: str) -> pathlib.Path:
    """Path of a dataset in ../shared/data, or skip the test when it is absent."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} not present (the shared datasets are optional)")
    return path


def bernstein_radius(variance: float, false_failure: float, bound: float = 1.0) -> float:
    """t with P(|S − E S| ≥ t) ≤ false_failure for a sum S of independent variables.

    Bernstein: P(|S − ES| ≥ t) ≤ 2·exp(−t² / (2(V + b·t/3))), |X_i − EX_i| ≤ b.
    """
    log_term = math.log(2.0 / false_failure)
    # Solve t² = 2 log_term (V + b t / 3) for t > 0.
    a = 2.0 * log_term * bound / 3.0
    return 0.5 * (a + math.sqrt(a * a + 8.0 * log_term * variance))


@pytest.fixture(scope="session", autouse=True)
def _session_temp_dir(tmp_path_factory):
    """The system's temporary directory, for this session and the processes it
    starts, is one of pytest's own: Beam's portable job service and SDK harness
    leave directories there (``beam-temp*``, ``tmp*``) that nothing removes, and
    pytest keeps only its last few session directories."""
    import tempfile
    private = str(tmp_path_factory.mktemp("system-tmp"))
    saved = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = private
    os.environ["TMPDIR"] = private
    yield private
    tempfile.tempdir = saved[0]
    if saved[1] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[1]


@pytest.fixture(scope="session")
def runners_data(tmp_path_factory):
    """(input file, public counts file) that every runner's test releases from: 600
    synthetic users, and public counts for GW-KT. Written once per session (per xdist
    worker)."""
    from beam_dpsu.dp.evaluation import synthetic
    folder = tmp_path_factory.mktemp("runners")
    path = str(folder / "syn.tsv")
    synthetic.write_tsv(path, 600, seed=7, max_occurrences=60)
    public = folder / "public.tsv"
    public.write_text("".join(f"i{j}\t{1000 - j}\n" for j in range(1, 200)))
    return path, str(public)


@pytest.fixture
def tmp_prefix(tmp_path):
    return str(tmp_path / "out")


def transform_labels(p):
    """The full labels of every transform of pipeline ``p`` (composites and leaves)."""
    out, stack = [], [p._root_transform()]
    while stack:
        t = stack.pop()
        out.append(t.full_label)
        stack.extend(t.parts)
    return out


def beam_options(*extra):
    from apache_beam.options.pipeline_options import PipelineOptions
    return PipelineOptions(["--runner=DirectRunner", *extra])


def local_pipeline(*extra):
    """A pipeline on the DirectRunner's FnApiRunner, as the command lines run it
    (``runners.pipeline_options``: never Prism, whether or not this machine can
    download it), with the DirectRunner options ``extra``."""
    import apache_beam as beam
    from beam_dpsu.transforms import runners
    return beam.Pipeline(options=runners.pipeline_options(["--runner=DirectRunner", *extra]))


# Reaches only the subprocesses tests start (CLI runs, multi-process runner
# workers); this process's own str hashing was seeded at start-up. No test
# may rely on str hash values (test_kernels seeds its data with crc32).
os.environ.setdefault("PYTHONHASHSEED", "0")


#: A progress line of a command (``PROG: [12.3 s] ...``, see ``beam_dpsu.pipelines.console.Progress``).
PROGRESS_LINE = re.compile(r"^[\w -]+: \[\d+\.\d s\] ")


def without_progress(err: str) -> list:
    """The stderr lines of a command that are not progress lines (errors, warnings)."""
    return [l for l in err.strip().splitlines() if not PROGRESS_LINE.match(l)]


#: Tests that run for more than a few seconds on the 2-core CI machine (measured with
#: ``pytest --durations``); deselect them with ``-m "not slow"``.
SLOW = {
    "test_pinned_releases::test_beam_releases_are_pinned",
    "test_pinned_releases::test_beam_releases_from_per_user_parts_are_pinned",
    "test_pinned_releases::test_local_releases_are_pinned",
    "test_audit::test_every_registered_mechanism_passes",
    "test_audit::test_gw_kt_passes",
    "test_robustness::test_unicode_long_and_empty_items_round_trip",
    "test_runners::test_portable_and_multiprocess_release_the_same_set",
    "test_runners::test_top_k_on_portable_and_multiprocess",
    "test_sips::test_beam_rounds_equal_the_core",
    "test_console::test_the_installed_console_script_runs_from_another_directory",
    "test_user_contract::test_sigint_mid_run_exits_130_with_one_line_and_leaves_nothing",
    "test_user_contract::test_the_readme_quickstart_runs_twice_in_a_row",
    "test_user_contract::test_dask_no_well_formed_line_exits_1_and_counts_like_the_direct_runner",
}


def pytest_configure(config):
    """While ``.ci/run`` sets the engines up beside the tests (``BEAM_DPSU_ENGINES_PENDING``),
    pytest-xdist keeps the collection's order (``pytest_collection_modifyitems``) instead of
    sending the largest groups, the engines', first: both workers would wait for the
    set-up."""
    if os.environ.get("BEAM_DPSU_ENGINES_PENDING") and hasattr(config.option,
                                                               "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Marks each test by what it starts: ``dask`` (a local Dask cluster: test_dask.py),
    ``subprocess`` (the command line or another Python process) and ``slow`` (``SLOW``),
    so that ``pytest -m "not slow and not dask and not subprocess"`` runs the fast part;
    leaves out the ``exhaustive`` tests unless the -m expression names them."""
    import inspect
    for item in items:
        module = item.module.__name__ if item.module else ""
        if module == "test_dask":
            item.add_marker(pytest.mark.dask)
        func = getattr(item, "function", None)
        try:
            source = inspect.getsource(func) if func is not None else ""
        except (OSError, TypeError):
            source = ""
        if re.search(r"\bsubprocess\.(run|Popen|check_output|call)\b|\brun_cli\(", source):
            item.add_marker(pytest.mark.subprocess)
        if f"{module}::{item.originalname}" in SLOW:
            item.add_marker(pytest.mark.slow)
    # ``exhaustive`` tests run only when a -m expression names them (``pytest -m
    # exhaustive``, or ``-m "exhaustive or not exhaustive"`` for everything).
    if "exhaustive" not in (config.option.markexpr or ""):
        kept = [item for item in items if item.get_closest_marker("exhaustive") is None]
        if len(kept) < len(items):
            config.hook.pytest_deselected(
                items=[item for item in items if item.get_closest_marker("exhaustive")])
            items[:] = kept
    # While .ci/run sets the engines up beside the tests (BEAM_DPSU_ENGINES_PENDING), the
    # tests that need none come first: the engines' tests after a third of the others,
    # about when the set-up is done, so that no worker waits for it with little to do.
    if os.environ.get("BEAM_DPSU_ENGINES_PENDING"):
        engines = [item for item in items if item.get_closest_marker("engines")]
        others = [item for item in items if not item.get_closest_marker("engines")]
        cut = len(others) // 3
        items[:] = others[:cut] + engines + others[cut:]



#: How long a test marked ``engines`` waits for ``.ci/run``'s set-up of the engines.
ENGINES_WAIT_SECONDS = 900


def _wait_for_engines() -> None:
    """``.ci/run`` sets the engines up beside the tests and names, in
    ``BEAM_DPSU_ENGINES_PENDING``, the file it writes when done ("STATUS SECONDS"): wait
    for it; a failed set-up fails the test with the logs' place."""
    import time
    pending = os.environ.get("BEAM_DPSU_ENGINES_PENDING")
    if not pending:
        return
    path = pathlib.Path(pending)
    deadline = time.monotonic() + ENGINES_WAIT_SECONDS
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the engines' set-up did not finish in {ENGINES_WAIT_SECONDS} s "
                        f"({path} is missing)", pytrace=False)
        time.sleep(1.0)
    if path.read_text().split()[0] != "0":
        pytest.fail(f"the engines' set-up failed: see {path.parent}/prism-setup.log and "
                    f"jvm-setup.log", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test marked ``engines`` first waits for ``.ci/run``'s set-up of the engines
    (``_wait_for_engines``).

    A test of an ``xdist_group`` must run on its group's worker (one job server, one
    Flink cluster per engine); pytest 9.2's node ids broke that grouping in pytest-xdist
    3.8 with no error (pytest-dev/pytest-xdist#1386: every engine then started twice).
    The first worker to run a test of a group owns the group (a file in the session's
    folder, under a lock); a test of it on another worker fails here."""
    import fcntl
    import json
    if item.get_closest_marker("engines") is not None:
        _wait_for_engines()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                     for m in item.iter_markers("xdist_group")})
    if not (worker and groups and getattr(item.config.option, "loadgroup", False)):
        return
    folder = pathlib.Path(item.config.option.basetemp).parent  # the session's, above gwN
    group = "_".join(groups)
    with open(folder / "xdist-groups.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        table = folder / "xdist-groups.json"
        owners = json.loads(table.read_text()) if table.exists() else {}
        owner = owners.setdefault(group, worker)
        table.write_text(json.dumps(owners))
    if owner != worker:
        pytest.fail(f"--dist loadgroup ran {item.nodeid} on {worker}, its group {group!r} on "
                    f"{owner} (pytest-xdist#1386; the test extra pins pytest below 9.2)",
                    pytrace=False)
