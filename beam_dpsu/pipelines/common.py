"""What the command-line pipelines share: argument checks, the run, the outputs.

Conventions of every pipeline here:

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
* the release is ONE file, ``PREFIX-items-00000-of-00001``, whose line order
  is a function of the released set alone (sorted; top-k: rank order), never
  of the input order;
* ``PREFIX.json`` holds only what may be published with the items (mechanism,
  guarantee, calibration, released counts, library version, test seed); the
  exact counts, input paths, runner and timings go to the owner-only file
  ``PREFIX.PRIVATE-run-details.json`` (mode 0600 on local disks), which must
  never be published;
* a pipeline never writes a second release under a prefix: outputs of an
  earlier run are refused, or deleted first with ``--overwrite``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import contextvars
import shutil
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam import coders
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_dpsu import __version__, _quiet_workers, keys, runners, warm_workers
from beam_dpsu import cli
from beam_dpsu.cli import UsageError, last_line as _last_line, run_main
from beam_dpsu.noise import RunKey
from beam_dpsu.textio import match_files

#: The one shard of a release file.
SHARD = "-00000-of-00001"
ITEMS_SUFFIX = "-items" + SHARD
#: Kinds of further releases a run can write beside its items, as
#: ``PREFIX-KIND-00000-of-00001`` (``beam-dpsu select --top-k``:
#: ``PREFIX-top-k-00000-of-00001``). No run under another prefix writes a file of
#: that name (theirs end in ``-items``, ``.json`` or ``.PRIVATE-run-details.json``
#: before or without the shard), so an earlier run's files are never mistaken.
TOPK_KIND = "top-k"
SUB_RELEASE_KINDS = (TOPK_KIND,)
PUBLIC_SUFFIX = ".json"
PRIVATE_SUFFIX = ".PRIVATE-run-details.json"

NEVER_PUBLISH_NOTE = (
    "NEVER PUBLISH THIS FILE. It holds exact, non-private facts about the input and the run "
    "(user and malformed-line counts, input paths, runner, timings) for the data owner; "
    "they are not covered by the differential-privacy guarantee. Publish only the items file "
    "and the public summary PREFIX.json.")

PUBLIC_NOTE = (
    "This file and the release files it names (items_file, and top_k.items_file when "
    "present) may be published together; only the released items are covered by the "
    "guarantee. Exact counts, input paths and timings are in the owner-only "
    "file PREFIX.PRIVATE-run-details.json, which must never be published.")

INSECURE_SEED_WARNING = (
    "WARNING: --insecure-test-seed: all randomness of this run derives from a known seed; "
    "its output is NOT private and must never be published")


#: The meaning of the fields every release's PREFIX.json has besides the
#: mechanism's own (``describe()["units"]`` explains those).
RELEASE_UNITS = {
    "num_released": "number of items in the items file",
    "items_file": "the file of released items, next to this summary",
    "seeded": "true when the run used --insecure-test-seed (then NOT private)",
    "insecure_test_seed": "the insecure test seed, or null (a private run)",
    "beam_dpsu_version": "version of the library that made the release",
}


class NoWellFormedInput(Exception):
    """The input has no well-formed line: reported as one line, exit status 1."""

    exit_status = 1


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line) instead of printing usage and exiting."""

    def __init__(self, prog: str, description: str):
        super().__init__(prog=cli.command_prog(prog), description=description,
                         allow_abbrev=False)
        cli.add_output_flags(self)
        self.set_defaults(_prog=self.prog)

    def error(self, message):
        raise UsageError(message)


class _RefuseSeed(argparse.Action):
    """``--seed`` on a release pipeline: refused, pointing to the unmistakable flag."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError("--seed is not accepted: a seeded run is not private; for tests only, "
                         "use --insecure-test-seed N")


def add_io_arguments(p: argparse.ArgumentParser) -> None:
    """--input, --output, --overwrite and --insecure-test-seed, as every release pipeline
    takes them (``--seed`` is refused with a pointer to ``--insecure-test-seed``)."""
    p.add_argument("--input", required=True, help="input file or glob of user<TAB>item lines")
    p.add_argument("--output", required=True,
                   help="output prefix: the release goes to PREFIX-items-00000-of-00001 and "
                        "PREFIX.json (publishable), the owner-only run details to "
                        "PREFIX.PRIVATE-run-details.json (never publish)")
    p.add_argument("--overwrite", action="store_true",
                   help="delete the outputs of an earlier run under PREFIX (and the "
                        "--dead-letter files) before running; without it such outputs are "
                        "refused")
    p.add_argument("--insecure-test-seed", dest="insecure_test_seed", type=int, metavar="N",
                   help="TESTS ONLY: derive all randomness from N; the output is NOT private "
                        "against anyone who knows or guesses N and must never be published")
    p.add_argument("--seed", nargs="?", action=_RefuseSeed, help=argparse.SUPPRESS)


def add_dead_letter_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dead-letter", dest="dead_letter",
                   help="write the malformed input lines to files PATH-* for the data owner "
                        "(they are private input, not a release)")


def _repeat_line(element):
    line, n = element
    return [line] * n


def write_dead_letter(malformed: beam.PCollection, path: Optional[str]) -> None:
    """Writes ``(line, count)`` malformed lines (raw bytes, each occurrence) to ``path-*``."""
    if path and not runners.capabilities(malformed.pipeline).file_sinks:
        (malformed  # no working file sink (Dask): one file, written by one ParDo
         | "RepeatMalformed" >> beam.FlatMap(_repeat_line)
         | "WriteDeadLetter" >> runners.WriteOneFile(path + "-00000-of-00001"))
    elif path:
        (malformed
         | "RepeatMalformed" >> beam.FlatMap(_repeat_line)
         | "WriteDeadLetter" >> beam.io.WriteToText(path, coder=coders.BytesCoder()))


def _beam_option_parser() -> argparse.ArgumentParser:
    """A parser that knows every registered Beam pipeline option."""
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    seen = set()
    stack = list(PipelineOptions.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
        try:
            cls._add_argparse_args(parser)
        except argparse.ArgumentError:
            pass  # an option registered by two classes
    return parser


def check_beam_args(beam_args: Sequence[str]) -> None:
    """Raises UsageError for an argument that is neither ours nor a Beam option.

    (Beam itself only logs and drops unknown arguments, so a typo such as
    ``--epsilonn`` would otherwise be ignored silently.)
    """
    beam_args = runners.resolve_runner_flag(list(beam_args))  # registers --dask_* options
    _, unknown = _beam_option_parser().parse_known_args(list(beam_args))
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")


# -- locations ----------------------------------------------------------------

def _is_remote(path: str) -> bool:
    return "://" in path


def check_input(input_pattern: str) -> List[str]:
    """The input files; UsageError unless each is a readable file (nothing is read).

    A directory (``--input data`` instead of ``--input 'data/*'``), a file that
    cannot be opened (permissions, a socket) or a pattern matching nothing is
    refused. Remote files (``gs://`` ...) are only matched.
    """
    try:
        paths = match_files(input_pattern)
    except Exception as e:  # a filesystem that refuses the pattern
        raise UsageError(f"cannot list input {input_pattern!r}: {_last_line(e)}") from None
    if not paths:
        raise UsageError(f"no input file matches {input_pattern!r}")
    for path in paths:
        if _is_remote(path):
            continue
        if os.path.isdir(path):
            raise UsageError(f"input {path!r} is a directory; give files or a glob, e.g. "
                             f"--input '{os.path.join(path, '*')}'")
        try:  # opening reads nothing (O_NONBLOCK: a FIFO does not block here)
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        except OSError as e:
            raise UsageError(f"cannot read input file {path!r}: {e.strerror}") from None
        if not os.access(path, os.R_OK):
            raise UsageError(f"cannot read input file {path!r}: permission denied")
    return paths


def check_output(prefix: str, flag: str = "--output") -> None:
    """UsageError unless files ``PREFIX...`` can be created; creates and leaves nothing.

    On a local disk the nearest existing ancestor of the prefix's directory
    must be a directory we may write (missing directories are created only
    when the run starts, by ``prepare_output``). On other filesystems an empty
    probe file is created and deleted.
    """
    if prefix.endswith(("/", os.sep)):
        raise UsageError(f"{flag} {prefix!r} ends with a separator; it is a file prefix, "
                         f"e.g. {os.path.join(prefix, 'release')!r}")
    if _is_remote(prefix):
        probe = f"{prefix}.beam-dpsu-probe-{uuid.uuid4().hex}"
        try:
            with FileSystems.create(probe) as f:
                f.write(b"")
        except Exception as e:  # any filesystem's refusal
            raise UsageError(f"cannot write to {prefix!r}: {_last_line(e)}") from None
        finally:
            try:
                if FileSystems.exists(probe):
                    FileSystems.delete([probe])
            except Exception:  # nothing more we can do
                pass
        return
    ancestor = os.path.dirname(os.path.abspath(prefix))
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise UsageError(f"cannot write to {prefix!r}: {ancestor!r} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write to {prefix!r}: no permission to create files in "
                         f"{ancestor!r}")


def prepare_output(prefix: str) -> List[str]:
    """Creates the prefix's directory (local disks), after every check passed.

    Returns the directories it created, outermost first (for ``remove_empty``).
    """
    if _is_remote(prefix):
        return []
    missing = []
    parent = os.path.dirname(os.path.abspath(prefix))
    while not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    return missing[::-1]


def remove_empty(directories: Sequence[str]) -> None:
    """Removes the directories a failed run created, innermost first, if still empty."""
    for path in reversed(directories):
        try:
            os.rmdir(path)
        except OSError:
            pass


def _existing(paths: Sequence[str]) -> List[str]:
    return [p for p in paths if FileSystems.exists(p)]


def earlier_outputs(prefix: str, dead_letter: Optional[str] = None) -> List[str]:
    """Files an earlier run left under ``prefix``: items, summaries, dead letters.

    The dead-letter files are those of ``dead_letter`` and those the earlier
    run's private details name.
    """
    # shards of the items (one since issue #13; several from older versions), never
    # another run's files such as PREFIX-items-x-items-00000-of-00001
    found = match_files(prefix + "-items-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]")
    found += _existing([prefix + PUBLIC_SUFFIX, prefix + PRIVATE_SUFFIX]
                       + [f"{prefix}-{kind}{SHARD}" for kind in SUB_RELEASE_KINDS])
    patterns = [dead_letter + "-*"] if dead_letter else []
    if prefix + PRIVATE_SUFFIX in found:
        try:
            with FileSystems.open(prefix + PRIVATE_SUFFIX) as f:
                earlier = json.loads(f.read().decode("utf-8")).get("dead_letter_files")
            if isinstance(earlier, str) and earlier.endswith("-*"):
                patterns.append(earlier)
        except Exception:  # unreadable or not ours: its own path is still refused
            pass
    for pattern in patterns:
        found += match_files(pattern)
    return sorted(set(found))


def check_earlier_outputs(prefix: str, dead_letter: Optional[str], overwrite: bool
                          ) -> List[str]:
    """UsageError when an earlier run's outputs exist and ``overwrite`` is off.

    Returns the files to delete (with ``overwrite``) before the run; two
    releases under one prefix would otherwise be read as one, and cost twice.
    """
    found = earlier_outputs(prefix, dead_letter)
    if found and not overwrite:
        raise UsageError(
            f"{len(found)} output file(s) of an earlier run exist (e.g. {found[0]!r}); a new "
            f"release must not be mixed with them: choose another --output, or pass "
            f"--overwrite to delete them first")
    return found


def delete_files(paths: Sequence[str]) -> None:
    if paths:
        FileSystems.delete(list(paths))


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

def sorted_text(lines: Sequence[str]) -> List[str]:
    """All lines as one element, sorted: an order that depends on the set alone."""
    return ["\n".join(sorted(lines))] if lines else []


def write_items(lines: beam.PCollection, prefix: str,
                arrange: Callable[[List[Any]], List[str]] = sorted_text,
                label: str = "", kind: str = "items") -> None:
    """Writes a release as ONE file ``PREFIX-KIND-00000-of-00001`` (default kind
    ``items``; a further release of the run: one of ``SUB_RELEASE_KINDS``).

    The released elements are collected (the release is small next to the
    data) and ``arrange`` turns the whole list into the file's text (default:
    sorted lines), so the order of lines never depends on the order in which
    the runner produced them, which could reflect the input order and so
    individual users. ``label`` prefixes the steps' labels (a second release
    of the same pipeline needs its own).

    Written by ``runners.WriteOneFile`` on every runner: one step collects the
    lines, one writes them to a temporary file next to the release and renames
    it, so the file appears whole or not at all (an empty release writes no
    file; ``run_release`` then creates it empty).
    """
    lines | label + "WriteItems" >> runners.WriteOneFile(f"{prefix}-{kind}{SHARD}", arrange)


# -- running --------------------------------------------------------------------

def _temp_dirs(prefixes: Sequence[str]) -> set:
    """Local ``beam-temp-*`` directories Beam's file sinks make for these prefixes, and
    the temporary files of ``runners.write_one_file``."""
    out = set()
    for prefix in prefixes:
        if not prefix or _is_remote(prefix):
            continue
        parent = os.path.dirname(os.path.abspath(prefix))
        start = "beam-temp-" + os.path.basename(prefix) + "-"  # (not PREFIX2's)
        try:
            out |= {os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(start)}
        except OSError:
            pass
    return out


def runner_name(beam_args: Sequence[str]) -> str:
    """The runner's class name that ``beam_args`` select (default DirectRunner)."""
    options = PipelineOptions(runners.resolve_runner_flag(list(beam_args)))
    return (options.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1]


class quiet_worker_processes:
    """While active, worker subprocesses that Beam starts on this machine
    (DirectRunner ``multi_processing``) end without tearing their interpreter
    down, and (when ``quiet``) log errors only: ``os.environ`` is
    ``_quiet_workers.worker_environment`` (see
    ``beam_dpsu/_quiet_workers/sitecustomize.py``). Restores the environment after."""

    VARIABLES = _quiet_workers.VARIABLES
    WORKER_MODULE = _quiet_workers.WORKER_MODULE

    def __init__(self, quiet: bool):
        self.quiet = quiet

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.VARIABLES}
        env = _quiet_workers.worker_environment(os.environ, self.quiet)
        for k in self.VARIABLES:
            if k in env:
                os.environ[k] = env[k]
            else:
                os.environ.pop(k, None)
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return False


@contextlib.contextmanager
def _warm_workers_for(options: PipelineOptions):
    """The ``WarmWorkers`` of a multi-process DirectRunner run: those the console
    command started before importing Beam (``warm_workers.start_early``), else
    started now, before the graph is built, so that the workers' imports overlap
    it; closed after the run. None for any other run."""
    n = warm_workers.pool_size(options) if runners.is_direct(options) else None
    if n is None:
        yield None
        return
    with warm_workers.take_early(n) or warm_workers.WarmWorkers(n, os.environ) as pool:
        yield pool


def run_pipeline(beam_args: Sequence[str], build: Callable[[beam.Pipeline], None],
                 output_prefixes: Sequence[Optional[str]] = ()):
    """Builds and runs a pipeline; returns (result, wall seconds, runner name).

    When the run fails, the ``beam-temp-*`` directories and files it made for
    ``output_prefixes`` (local disks) are removed.
    """
    beam_args = runners.resolve_runner_flag(list(beam_args))
    options = PipelineOptions(list(beam_args))
    runner = (options.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1]
    before = _temp_dirs(output_prefixes)
    start = time.time()
    try:
        with quiet_worker_processes(not cli.beam_logs_shown()), \
                _warm_workers_for(options) as pool:
            p = beam.Pipeline(runner=runners.local_runner(options, pool), options=options)
            build(p)
            runners.join_leaves(p)  # a runner computing only the last branch computes all
            runners.check_pipeline(p)  # refuses what the runner would silently mistranslate
            result = p.run()
            try:
                result.wait_until_finish()
            finally:
                client = getattr(result, "client", None)  # the Dask runner's
                if client is not None:
                    try:
                        if keys.shared_key_names(p):
                            keys.delete_shared_keys(p, client)
                    finally:
                        client.close()  # else it retries the scheduler after the run
    except BaseException:
        for path in _temp_dirs(output_prefixes) - before:
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


def count_output_lines(prefix: str, kind: str = "items") -> int:
    """Non-empty lines of the release file ``PREFIX-KIND-00000-of-00001`` (this file
    only: a glob would also match other runs' files); 0 if it does not exist."""
    path = f"{prefix}-{kind}{SHARD}"
    if not FileSystems.exists(path):
        return 0
    with FileSystems.open(path) as f:
        return sum(1 for line in f if line.strip())


def write_public(prefix: str, summary: Dict[str, Any]) -> None:
    with FileSystems.create(prefix + PUBLIC_SUFFIX) as f:
        f.write((json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


def write_private(prefix: str, details: Dict[str, Any]) -> None:
    """Writes the owner-only details; on a local disk the file is created with mode 0600."""
    data = (json.dumps(details, indent=2, ensure_ascii=False, default=str) + "\n").encode("utf-8")
    path = prefix + PRIVATE_SUFFIX
    if _is_remote(path):  # object stores have no file modes: their ACLs apply
        with FileSystems.create(path) as f:
            f.write(data)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # also when the file existed
    with os.fdopen(fd, "wb") as f:
        f.write(data)


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
    paths = check_input(args.input)
    check_output(args.output, "--output")
    if dead_letter:
        check_output(dead_letter, "--dead-letter")
    stale = check_earlier_outputs(args.output, dead_letter, args.overwrite)
    run_key = make_run_key(args.insecure_test_seed)
    delete_files(stale)
    created = prepare_output(args.output)
    if dead_letter:
        created += prepare_output(dead_letter)
    local = [p for p in paths if not _is_remote(p)]
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
        remove_empty(created)
        raise
    finally:
        _RUN_PROGRESS.reset(token)
    files = [args.output + ITEMS_SUFFIX] + [f"{args.output}-{k}{SHARD}" for k in sub_releases]
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
        delete_files(_existing(files))
        remove_empty(created)
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
        released = count_output_lines(args.output)
    public = dict(public_fields(result, released))
    public.update({
        "num_released": released,
        "items_file": os.path.basename(args.output) + ITEMS_SUFFIX,
        "seeded": args.insecure_test_seed is not None,
        "insecure_test_seed": args.insecure_test_seed,
        "beam_dpsu_version": __version__,
        "note": PUBLIC_NOTE.replace("PREFIX", os.path.basename(args.output)) + (
            " A run with an insecure test seed is NOT private."
            if args.insecure_test_seed is not None else ""),
    })
    public["units"] = dict(public.get("units") or {}, **RELEASE_UNITS)
    details = {
        "NEVER_PUBLISH": NEVER_PUBLISH_NOTE.replace("PREFIX", os.path.basename(args.output)),
        "num_users": users,
        "malformed_lines": malformed,
        "input": args.input,
        "runner": runner,
        "wall_seconds": round(wall, 3),
        "items_output": args.output + ITEMS_SUFFIX,
        **({"other_release_outputs": files[1:]} if sub_releases else {}),
        "public_summary": args.output + PUBLIC_SUFFIX,
        "dead_letter_files": (dead_letter + "-*") if dead_letter else None,
    }
    if dead_letter:
        details["dead_letter_note"] = ("the dead-letter files hold private input lines: they "
                                       "are not a release and must never be published")
    write_private(args.output, details)
    write_public(args.output, public)
    progress(f"released {released} items: {args.output + ITEMS_SUFFIX}, summary "
             f"{args.output + PUBLIC_SUFFIX}")
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


def parse_known(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]
                ) -> Tuple[argparse.Namespace, List[str]]:
    """Our flags and the rest (Beam's), after checking the rest are Beam options."""
    args, beam_args = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    check_beam_args(beam_args)
    return args, beam_args


def check_locations(input_pattern: str, *output_prefixes: Optional[str]) -> None:
    """UsageError unless the input is readable files and each output can be written."""
    check_input(input_pattern)
    for prefix in output_prefixes:
        if prefix:
            check_output(prefix)
