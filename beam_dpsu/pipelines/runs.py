"""The run of a command-line release: the run key, the pipeline, progress, the summaries.

Conventions of every release pipeline (``select_partitions``, ``top_k``):

* a user mistake (bad parameter, unknown flag, no input file, an input that is
  a directory or cannot be read, an output location that cannot be written,
  outputs of an earlier run under the same prefix) raises ``UsageError``
  before any data is read and before anything is created, and ``main`` turns
  it into one line on stderr and exit status 2;
* input with no well-formed line is one line on stderr and exit status 1, and
  leaves no release; any malformed line gives a one-line warning;
* any other failure is one line on stderr and exit status 1 (set the
  environment variable ``BEAM_DPSU_DEBUG=1`` to see Beam's own logs and the
  traceback);
* the files of a release are those of ``beam_dpsu.pipelines.outputs``.
"""
from __future__ import annotations

import json
import os
import contextvars
import shutil
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from beam_dpsu import __version__
from beam_dpsu.transforms import runners
from beam_dpsu.pipelines import cli, outputs
from beam_dpsu.pipelines.cli import run_main
from beam_dpsu.dp.noise import RunKey


__all__ = ["INSECURE_SEED_WARNING", "NoWellFormedInput", "make_run_key", "progress_seconds",
           "CountUsers", "runner_name", "run_pipeline", "counter", "run_release", "main_wrapper"]


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


#: (prog, start time, seconds between lines) of the release being built by
#: ``run_release``, or None (no progress lines: quiet, or built by a library user).
_RUN_PROGRESS: contextvars.ContextVar = contextvars.ContextVar("beam_dpsu_run_progress",
                                                               default=None)
#: users counted by this worker process, and when it last printed a line.
_WORKER_PROGRESS = {"users": 0, "last": 0.0}
_WORKER_LOCK = threading.Lock()


def progress_seconds() -> float:
    """Seconds between two progress lines of one worker: ``BEAM_DPSU_PROGRESS_SECONDS``
    (default 10; 0 prints one line per bundle)."""
    try:
        return max(0.0, float(os.environ.get("BEAM_DPSU_PROGRESS_SECONDS", "10")))
    except ValueError:
        return 10.0


class CountUsers(beam.DoFn):
    """Passes per-user elements through, counting them in ``beam_dpsu/users``.

    Built inside ``run_release`` (and not ``--quiet``), each worker process also
    prints at most one progress line every ``progress_seconds()`` to its stderr:
    ``PROG: [elapsed] N users read and grouped so far (this worker)``. On the
    DirectRunner that is the command's stderr; on other runners the worker logs.
    """

    def __init__(self):
        self._users = beam.metrics.Metrics.counter("beam_dpsu", "users")
        self._progress = _RUN_PROGRESS.get()

    def process(self, element):
        self._users.inc()
        if self._progress is not None:
            self._report()
        yield element

    def _report(self) -> None:
        prog, start, every = self._progress
        now = time.time()
        with _WORKER_LOCK:
            _WORKER_PROGRESS["users"] += 1
            if every and now - _WORKER_PROGRESS["last"] < every:
                return
            _WORKER_PROGRESS["last"] = now
            users = _WORKER_PROGRESS["users"]
        cli.write_line(f"{prog}: [{now - start:.1f} s] {users} users read and grouped so far "
                       f"(this worker)")  # one write: other workers print too


# -- the release file -----------------------------------------------------------


# -- running --------------------------------------------------------------------


def runner_name(beam_args: Sequence[str]) -> str:
    """The runner's class name that ``beam_args`` select (default DirectRunner)."""
    return runners.runner_name_of(PipelineOptions(runners.resolve_runner_flag(list(beam_args))))


def run_pipeline(beam_args: Sequence[str], build: Callable[[beam.Pipeline], None],
                 output_prefixes: Sequence[Optional[str]] = ()):
    """Builds and runs a pipeline; returns (result, wall seconds, runner name).

    When the run fails, the ``beam-temp-*`` directories and files it made for
    ``output_prefixes`` (local disks) are removed.
    """
    options = runners.pipeline_options(beam_args)
    runner = runner_name(beam_args)  # the runner asked for (DirectRunner: run as LOCAL_RUNNER)
    before = outputs._temp_dirs(output_prefixes)
    start = time.time()
    try:
        p = beam.Pipeline(options=options)
        build(p)
        runners.join_leaves(p)  # a runner computing only the last branch computes all
        runners.check_pipeline(p)  # refuses what the runner would silently mistranslate
        result = p.run()
        runners.wait_for(p, result)
    except BaseException:
        for path in outputs._temp_dirs(output_prefixes) - before:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.remove(path)
                except OSError:
                    pass
        raise
    return result, time.time() - start, runner


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
    and ``dead_letter``; ``build(p, run_key)`` adds the graph (it must count
    users in ``beam_dpsu/users`` and write with ``write_items``);
    ``public_fields(result, num_released)`` gives the mechanism's publishable
    fields. Checks every location before anything is read or created, runs,
    refuses a run without a well-formed input line (deleting its items file),
    writes the owner-only details and then the public summary.

    ``sub_releases``: kinds (of ``SUB_RELEASE_KINDS``) of further releases
    ``build`` writes with ``write_items(..., PREFIX, kind=KIND)``; the
    main release's ``num_released`` is then its file's line count, since the
    ``released`` counter counts every release of the run.

    Returns the public summary with the owner-only details under
    ``"PRIVATE_run_details"`` (what ``main`` prints is public fields only).
    """
    dead_letter = getattr(args, "dead_letter", None)
    progress = cli.Progress(cli.command_prog(getattr(args, "_prog", "beam-dpsu")),
                            getattr(args, "quiet", False))
    paths = outputs.check_input(args.input)
    outputs.check_output(args.output, "--output")
    if dead_letter:
        outputs.check_output(dead_letter, "--dead-letter")
    stale = outputs.check_earlier_outputs(args.output, dead_letter, args.overwrite)
    run_key = make_run_key(args.insecure_test_seed)
    outputs.delete_files(stale)
    created = outputs.prepare_output(args.output)
    if dead_letter:
        created += outputs.prepare_output(dead_letter)
    local = [p for p in paths if not outputs._is_remote(p)]
    size = sum(os.path.getsize(p) for p in local)
    progress(f"input: {len(paths)} file(s)" + (f", {size / 1e6:.1f} MB" if local else "")
             + f"; running the pipeline on {runner_name(beam_args)}")
    _WORKER_PROGRESS.update(users=0, last=0.0)  # this process's count starts anew
    token = _RUN_PROGRESS.set(None if progress.quiet else
                              (progress.prog, progress.start, progress_seconds()))
    try:
        result, wall, runner = run_pipeline(beam_args, lambda p: build(p, run_key),
                                            (args.output, dead_letter))
    except BaseException:
        outputs.remove_empty(created)
        raise
    finally:
        _RUN_PROGRESS.reset(token)
    files = [args.output + outputs.ITEMS_SUFFIX] + [f"{args.output}-{k}{outputs.SHARD}" for k in sub_releases]
    counted = counter(result, "released") if not sub_releases else None
    for path in files:
        if not FileSystems.exists(path):
            if path == files[0] and counted:
                raise RuntimeError(f"the run counted {counted} released item(s) but wrote no "
                                   f"{path}")
            # runners.WriteOneFile writes no file for an empty release
            with FileSystems.create(path) as f:
                f.write(b"")
    users = counter(result, "users")
    malformed = counter(result, "malformed_lines")
    if users == 0:
        outputs.delete_files(outputs._existing(files))
        outputs.remove_empty(created)
        raise NoWellFormedInput(
            f"no well-formed user<TAB>item line in {args.input!r} ({malformed or 0} malformed "
            f"line(s)): nothing released")
    if malformed:
        print(f"WARNING: {malformed} malformed input line(s) skipped (no tab, empty user id or "
              f"invalid UTF-8)" + (f"; they are in {dead_letter}-*" if dead_letter else ""),
              file=sys.stderr)
    if users is None:
        print("WARNING: the runner reports no metrics: malformed and missing input cannot be "
              "detected", file=sys.stderr)
    progress(f"pipeline finished in {wall:.1f} s: "
             + (f"{users} users, {malformed or 0} malformed lines; " if users is not None
                else "") + "writing the summaries")
    released = counter(result, "released") if not sub_releases else None
    if released is None:
        released = outputs.count_output_lines(args.output)
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
        **({"other_release_outputs": files[1:]} if sub_releases else {}),
        "public_summary": args.output + outputs.PUBLIC_SUFFIX,
        "dead_letter_files": (dead_letter + "-*") if dead_letter else None,
    }
    if dead_letter:
        details["dead_letter_note"] = ("the dead-letter files hold private input lines: they "
                                       "are not a release and must never be published")
    outputs.write_private(args.output, details)
    outputs.write_public(args.output, public)
    progress(f"released {released} items: {args.output + outputs.ITEMS_SUFFIX}, summary "
             f"{args.output + outputs.PUBLIC_SUFFIX}")
    return dict(public, PRIVATE_run_details=details)


def main_wrapper(prog: str, run: Callable[[Optional[Sequence[str]]], Dict[str, Any]],
                 argv: Optional[Sequence[str]], echo: Sequence[str],
                 nested: Optional[Dict[str, Sequence[str]]] = None) -> int:
    """Runs ``run(argv)`` with the exit-status conventions; prints ``echo`` keys as JSON.

    ``echo`` must name public fields only (users paste what is printed), as
    must ``nested`` (``{key: fields}``: those fields of a sub-dict, printed
    when the summary has it); a run with an insecure test seed also prints it.
    """
    # Beam logs worker failures with tracebacks; we print one line instead
    cli.configure_logging(cli.wants_verbose(list(sys.argv[1:] if argv is None else argv)))

    def body() -> int:
        summary = run(argv)
        printed = {k: summary.get(k) for k in echo}
        for key, fields in (nested or {}).items():
            if isinstance(summary.get(key), dict):
                printed[key] = {k: summary[key].get(k) for k in fields}
        if summary.get("insecure_test_seed") is not None:
            printed["insecure_test_seed"] = summary["insecure_test_seed"]
        print(json.dumps(printed, ensure_ascii=False))
        return 0

    return run_main(prog, body)


