"""The run of a command-line release: the run key, the pipeline, progress, the summaries.

Conventions of every release pipeline (``select_partitions``, ``top_k``):

* a user mistake (bad parameter, unknown flag, no input file, an input that is
  a directory or cannot be read, an output location that cannot be written,
  outputs of an earlier run under the same prefix) raises ``UsageError``
  before any data is read and before anything is created, and ``main`` turns
  it into one line on stderr and exit status 2;
* the users, malformed lines and released items are counted by the pipeline
  itself, in its own output (``outputs.tally``, written owner-only to
  ``PREFIX.PRIVATE-run-counts-NAME.json`` and read back into the private run
  details), never from Beam metrics: every runner reports them (Dask has no
  metrics) and every runner follows the rules below;
* input with no well-formed line is one line on stderr and exit status 1, and
  leaves no release; any malformed line gives a one-line warning (with
  its count only with ``--verbose``: it is in the private run details);
* Ctrl-C is one line, ``PROG: interrupted``, and exit status 130;
* any other failure is one line on stderr and exit status 1 (set the
  environment variable ``BEAM_DPSU_DEBUG=1`` to see Beam's own logs and the
  traceback);
* a run that fails or is interrupted leaves nothing behind: no release file,
  summary, dead-letter or counts files, temporary file, or directory it created
  (input without a well-formed line keeps only its dead-letter file, which shows
  what is wrong with it);
* the files of a release are those of ``beam_dpsu.pipelines.outputs``.
"""
from __future__ import annotations

import json
import logging
import os
import contextvars
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from beam_dpsu import __version__
from beam_dpsu.transforms import runners, staging
from beam_dpsu.transforms.run_key import wait_for
from beam_dpsu.pipelines import console, outputs
from beam_dpsu.pipelines.console import run_main
from beam_dpsu.dp.randomness import compiled
from beam_dpsu.dp.privacy.accounting import readable_up
from beam_dpsu.dp.randomness.noise import RunKey


__all__ = ["INSECURE_SEED_WARNING", "NoWellFormedInput", "make_run_key", "trial_key",
           "runner_name", "run_pipeline", "counter", "columnar_layout", "tally_users",
           "run_release", "main_wrapper", "staging_for"]


INSECURE_SEED_WARNING = (
    "WARNING: --insecure-test-seed: all randomness of this run derives from a known seed; "
    "its output is NOT private and must never be published")


class NoWellFormedInput(Exception):
    """The input has no well-formed line: reported as one line, exit status 1."""

    exit_status = 1


# -- locations ----------------------------------------------------------------


def make_run_key(seed: Optional[int]) -> RunKey:
    """The run's key: fresh OS randomness, or (tests only) derived from an insecure seed."""
    if seed is None:
        return RunKey.fresh()
    print(INSECURE_SEED_WARNING, file=sys.stderr)
    return RunKey.from_test_seed(seed)


def trial_key(seed: Optional[int], step: int) -> RunKey:
    """The key of a comparison's ``step``-th trial (1, 2, ...): fresh OS randomness, or,
    with ``--insecure-test-seed N`` (tests only), the key of seed N + step, so that a
    seeded comparison is reproducible and its trials still differ from one another."""
    return RunKey.fresh() if seed is None else RunKey.from_test_seed(seed + step)


# -- the release file -----------------------------------------------------------


# -- running --------------------------------------------------------------------


def runner_name(beam_args: Sequence[str]) -> str:
    """The runner's class name that ``beam_args`` select (default DirectRunner)."""
    return runners.runner_name_of(PipelineOptions(runners.resolve_runner_flag(list(beam_args))))


def run_pipeline(beam_args: Sequence[str], build: Callable[[beam.Pipeline], None],
                 output_prefixes: Sequence[Optional[str]] = ()):
    """Builds and runs a pipeline; returns (result, wall seconds, runner name).

    When the run fails, the ``beam-temp-*`` directories and files it made for
    ``output_prefixes`` (local disks) are removed. When it ends, failed or not, the
    staging directories ``build`` made with ``staging_for`` are removed (a Ctrl-C or
    SIGTERM then waits for the removal); one that cannot be removed is named in a
    warning.
    """
    options = runners.pipeline_options(beam_args)
    runner = runner_name(beam_args)  # the runner asked for (DirectRunner: run as LOCAL_RUNNER)
    before = outputs._temp_dirs(output_prefixes)
    staged = []
    token = _STAGED.set(staged)
    start = time.time()
    try:
        p = beam.Pipeline(options=options)
        build(p)
        runners.join_leaves(p)  # a runner computing only the last branch computes all
        runners.check_pipeline(p)  # refuses what the runner would silently mistranslate
        result = p.run()
        wait_for(p, result)
    except BaseException:
        with _uninterrupted():
            for path in outputs._temp_dirs(output_prefixes) - before:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.remove(path)
                    except OSError:
                        pass
        raise
    finally:
        _STAGED.reset(token)
        with _uninterrupted():
            for path in staged:
                if not staging.remove_directory(path):
                    logging.warning("could not remove the staging directory %s (private "
                                    "data of the run): remove it", path)
    return result, time.time() - start, runner


#: The staging directories of the run ``run_pipeline`` is running (``staging_for``).
_STAGED: contextvars.ContextVar = contextvars.ContextVar("staged", default=None)


def staging_for(p: beam.Pipeline, output_prefix: str) -> Optional[str]:
    """A new staging directory for ``p``'s shuffles (``outputs.staging_directory``),
    where its runner holds a shuffle in memory (``runners.Capabilities.memory_shuffle``)
    and ``run_pipeline`` is running the build (it removes the directory when the run
    ends); None otherwise (the shuffles then go through the runner)."""
    made = _STAGED.get()
    if made is None or not runners.capabilities(p).memory_shuffle:
        return None
    path = outputs.staging_directory(output_prefix)
    if path is not None:
        made.append(path)
    return path


def columnar_layout(p: beam.Pipeline, input_pattern: str, output_prefix: str) -> Dict[str, Any]:
    """The columnar transforms' layout for the input ``input_pattern`` matches now:
    ``user_groups`` for its size (``dp.data.columnar.user_groups_for``; the default when a
    file's size is unknown), ``item_shards`` for those groups and ``staging_dir``
    (``staging_for``). None of them affects a release."""
    from beam_dpsu.dp.data.columnar import item_shards_for, user_groups_for
    from beam_dpsu.transforms.textio import match_sized
    sizes = [size for _, size in match_sized(input_pattern)]
    groups = user_groups_for(None if None in sizes else sum(sizes))
    return {"user_groups": groups, "item_shards": item_shards_for(groups),
            "staging_dir": staging_for(p, output_prefix)}


def tally_users(users: beam.PCollection) -> None:
    """The ``users`` count of a run from a columnar transform's users per group."""
    outputs.tally(users | "UsersPerGroup" >> beam.Map(_group_count), "users",
                  counts_second=True)


def _group_count(n: int):
    return None, n


class _uninterrupted:
    """Ctrl-C and SIGTERM wait while a run's files are removed (main thread only)."""

    def __enter__(self):
        self._saved = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved.append((sig, signal.signal(sig, signal.SIG_IGN)))
        return self

    def __exit__(self, *exc):
        for sig, handler in self._saved:
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        return False


def counter(result, name: str) -> Optional[int]:
    """A ``beam_dpsu`` counter's value, or None where the runner has no metrics."""
    try:
        counters = result.metrics().query(MetricsFilter().with_namespace("beam_dpsu")
                                          .with_name(name))["counters"]
    except Exception:  # a runner without metrics support
        return None
    if not counters:
        return 0
    return int(sum((c.committed if c.committed is not None else c.attempted) or 0
                   for c in counters))


def run_release(args, beam_args: Sequence[str],
                build: Callable[[beam.Pipeline, RunKey], None],
                public_fields: Callable[[Any, int], Dict[str, Any]],
                sub_releases: Sequence[str] = ()) -> Dict[str, Any]:
    """The whole life of a release, shared by every release pipeline.

    ``args`` has ``input``, ``output``, ``overwrite``, ``insecure_test_seed``
    and ``dead_letter``; ``build(p, run_key)`` adds the graph (it must count the
    users once, e.g. a columnar transform's users per group through
    ``tally_users``, write the
    release with ``outputs.write_items`` and the malformed lines with
    ``outputs.write_dead_letter``); ``public_fields(result,
    num_released)`` gives the mechanism's publishable fields. Checks every
    location before anything is read or created, runs, reads the counts the
    pipeline wrote (``outputs.read_counts``), refuses a run without a
    well-formed input line, writes the owner-only details and then the public
    summary. When anything fails or is interrupted (Ctrl-C) after the checks,
    every file of this run and every directory it created is removed before the
    exception goes on.

    ``sub_releases``: kinds (of ``SUB_RELEASE_KINDS``) of further releases
    ``build`` writes with ``write_items(..., PREFIX, kind=KIND)``.

    ``args.progress_notes`` (optional, set by ``public_fields``): further
    progress lines, printed after the release's.

    Returns the public summary with the owner-only details under
    ``"PRIVATE_run_details"`` (what ``main`` prints is public fields only).
    """
    dead_letter = getattr(args, "dead_letter", None)
    quiet = getattr(args, "quiet", False)
    progress = console.Progress(console.command_prog(getattr(args, "_prog", "beam-dpsu")), quiet)
    paths = outputs.check_input(args.input)
    outputs.check_columns(paths, args.tabs_in_items, args.trust_columns)
    outputs.check_output(args.output, "--output")
    if dead_letter:
        outputs.check_output(dead_letter, "--dead-letter")
    stale = outputs.check_earlier_outputs(args.output, dead_letter, args.overwrite)
    run_key = make_run_key(args.insecure_test_seed)
    outputs.delete_files(stale)
    created: list = []
    try:
        created += outputs.prepare_output(args.output)
        if dead_letter:
            created += outputs.prepare_output(dead_letter)
        return _run_and_summarise(args, beam_args, build, public_fields, sub_releases,
                                  run_key, paths, progress)
    except BaseException as e:
        # input without a well-formed line keeps the dead-letter file the user asked
        # for: it shows what is wrong with the input
        keep = (outputs.dead_letter_file(dead_letter)
                if dead_letter and isinstance(e, NoWellFormedInput) else None)
        outputs.delete_files([p for p in outputs._existing(outputs.run_files(args.output,
                                                                             dead_letter))
                              if p != keep])
        outputs.remove_empty(created)
        raise


def _size_text(size: int) -> str:
    return (f"{size} bytes" if size < 1000 else f"{size / 1e3:.1f} kB" if size < 1e6
            else f"{size / 1e6:.1f} MB")


#: Inputs from this size on may use the compiled kernels (``compiled.WORK_BEFORE_COMPILING``
#: elements of work): the run says first when numba will compile them.
_COMPILE_NOTE_BYTES = 32 << 20


def _run_and_summarise(args, beam_args, build, public_fields, sub_releases, run_key, paths,
                       progress) -> Dict[str, Any]:
    """``run_release`` after the checks: the run, its counts, the summaries."""
    dead_letter = getattr(args, "dead_letter", None)
    private_path = args.output + outputs.PRIVATE_SUFFIX
    # exact counts of the input on stderr only with --verbose (a shared cluster's logs
    # are seen by others); they are always in the private run details
    exact = bool(getattr(args, "verbose", False)) and not progress.quiet
    local = [p for p in paths if not outputs._is_remote(p)]
    size = sum(os.path.getsize(p) for p in local)
    progress(f"reading {len(paths)} file{'s' if len(paths) != 1 else ''}"
             + (f" ({_size_text(size)})" if len(local) == len(paths) else "")
             + f" on {runner_name(beam_args)}")
    if size >= _COMPILE_NOTE_BYTES and compiled.first_compilation_ahead():
        progress("numba compiles the fast kernels on this installation's first large input: "
                 "about 40 s more, once")
    counted = []

    def build_all(p):
        build(p, run_key)
        counted[:] = outputs.write_counts(p, args.output)  # from the pipeline's own output

    result, wall, runner = run_pipeline(beam_args, build_all, (args.output, dead_letter))
    counts = outputs.read_counts(args.output, counted)
    users, malformed = counts.get("users", 0), counts.get("malformed_lines", 0)
    if users == 0:
        kept = dead_letter and FileSystems.exists(outputs.dead_letter_file(dead_letter))
        raise NoWellFormedInput(
            f"no well-formed user<TAB>item line in {args.input!r}"
            + (f" ({malformed} malformed line(s))" if exact else "")
            + ": nothing released"
            + (f"; the malformed lines are in {outputs.dead_letter_file(dead_letter)}"
               if kept else ""))
    kinds = {"items": "released", **{k: f"released_{k}" for k in sub_releases}}
    for kind, name in kinds.items():
        path = f"{args.output}-{kind}{outputs.SHARD}"
        if not FileSystems.exists(path):
            if counts.get(name):
                raise RuntimeError(f"the run counted {counts[name]} released item(s) but "
                                   f"wrote no {path}")
            # transforms.write.WriteRelease writes no file for an empty release
            with FileSystems.create(path) as f:
                f.write(b"")
    if dead_letter and not FileSystems.exists(outputs.dead_letter_file(dead_letter)):
        # no malformed line: the file the user asked for exists, empty (and owner-only)
        outputs.write_private_file(outputs.dead_letter_file(dead_letter), [])
    progress(f"pipeline finished in {wall:.1f} s: {users} users, {malformed} malformed lines"
             if exact else f"pipeline finished in {wall:.1f} s (the input's exact counts: "
                           f"--verbose, or the private run details)")
    released = counts.get("released", 0)
    public = dict(public_fields(result, released))
    public.update({
        "num_released": released,
        "items_file": os.path.basename(args.output) + outputs.ITEMS_SUFFIX,
        "seeded": args.insecure_test_seed is not None,
        "insecure_test_seed": args.insecure_test_seed,
        "beam_dpsu_version": __version__,
        "note": outputs.PUBLIC_NOTE.replace("PREFIX", os.path.basename(args.output)) + (
            " A run with an insecure test seed is NOT private."
            if args.insecure_test_seed is not None else ""),
    })
    public["units"] = dict(public.get("units") or {}, **outputs.RELEASE_UNITS)
    details = {
        "NEVER_PUBLISH": outputs.NEVER_PUBLISH_NOTE.replace("PREFIX", os.path.basename(args.output)),
        "num_users": users,
        "malformed_lines": malformed,
        "input": args.input,
        "runner": runner,
        "wall_seconds": round(wall, 3),
        "items_output": args.output + outputs.ITEMS_SUFFIX,
        **({"other_release_outputs": [f"{args.output}-{k}{outputs.SHARD}"
                                      for k in sub_releases]} if sub_releases else {}),
        "public_summary": args.output + outputs.PUBLIC_SUFFIX,
        "dead_letter_files": outputs.dead_letter_file(dead_letter) if dead_letter else None,
    }
    if dead_letter:
        details["dead_letter_note"] = ("the dead-letter file holds private input lines: it "
                                       "is not a release and must never be published")
    outputs.write_private(args.output, details)
    outputs.write_public(args.output, public)
    if malformed:
        where = (f"; they are in {outputs.dead_letter_file(dead_letter)}" if dead_letter
                 else "")
        if not exact:  # no exact count on stderr: it is in the private details
            console.write_line(f"WARNING: malformed input lines were skipped (no tab, empty user "
                           f"id or invalid UTF-8); their count is in {private_path}{where}")
        else:
            console.write_line(f"WARNING: {malformed} malformed input line(s) skipped (no tab, "
                           f"empty user id or invalid UTF-8){where}")
    progress(f"released {released} items: {args.output + outputs.ITEMS_SUFFIX}, summary "
             f"{args.output + outputs.PUBLIC_SUFFIX}")
    for note in getattr(args, "progress_notes", None) or ():
        progress(note)
    return dict(public, PRIVATE_run_details=details)


def _readable(value, key: Optional[str] = None):
    """``value`` with every stated ``epsilon``/``delta`` (at any depth) as ``readable_up``."""
    if isinstance(value, dict):
        return {k: _readable(v, k) for k, v in value.items()}
    if key in ("epsilon", "delta") and isinstance(value, float):
        return readable_up(value)
    return value


def main_wrapper(prog: str, run: Callable[[Optional[Sequence[str]]], Dict[str, Any]],
                 argv: Optional[Sequence[str]], echo: Sequence[str],
                 nested: Optional[Dict[str, Sequence[str]]] = None) -> int:
    """Runs ``run(argv)`` with the exit-status conventions; prints ``echo`` keys as JSON.

    ``echo`` must name public fields only (users paste what is printed), as
    must ``nested`` (``{key: fields}``: those fields of a sub-dict, printed
    when the summary has it); a run with an insecure test seed also prints it.
    Stated guarantees (the ``epsilon`` and ``delta`` keys, at any depth) are
    printed readable and rounded up (``accounting.readable_up``: ``3.0``, not
    ``2.9999999999999662``); the JSON summaries keep the exact values.
    """
    # Beam logs worker failures with tracebacks; we print one line instead
    console.configure_logging(console.wants_verbose(list(sys.argv[1:] if argv is None else argv)))

    def body() -> int:
        summary = run(argv)
        printed = {k: summary.get(k) for k in echo}
        for key, fields in (nested or {}).items():
            if isinstance(summary.get(key), dict):
                printed[key] = {k: summary[key].get(k) for k in fields}
        if summary.get("insecure_test_seed") is not None:
            printed["insecure_test_seed"] = summary["insecure_test_seed"]
        print(json.dumps(_readable(printed), ensure_ascii=False))
        return 0

    return run_main(prog, body)


