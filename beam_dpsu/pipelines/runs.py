"""A command's release, from the checks of its locations to its final files: ``ReleaseRun``.

One ``ReleaseRun``, made from a command's parsed flags, owns everything of its run:
its input files, output prefix and dead-letter file, the outputs of an earlier run
under that prefix, the run key, the directories it creates, the pipeline (and any
pre-pipeline that counts something first, ``ReleaseRun.count``), its staging
directories and temporary files, the private counts the pipeline writes and it reads
back, the files that complete the release and its summaries, and the clean-up when
anything fails. ``beam_dpsu.pipelines.outputs`` knows the files' names, the checks of
a location and the steps of a graph that write them; it keeps no state of a run.

Conventions of every release pipeline (``select_partitions``, ``top_k``,
``hitting_set``):

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

import contextvars
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from beam_dpsu import __version__
from beam_dpsu.transforms import runners, staging
from beam_dpsu.transforms.run_key import wait_for
from beam_dpsu.transforms.textio import match_files
from beam_dpsu.pipelines import console, outputs
from beam_dpsu.pipelines.console import UsageError, run_main
from beam_dpsu.dp.randomness import compiled
from beam_dpsu.dp.privacy.accounting import readable_up
from beam_dpsu.dp.randomness.noise import RunKey


__all__ = ["INSECURE_SEED_WARNING", "NoWellFormedInput", "make_run_key", "trial_key",
           "runner_name", "counter", "ReleaseRun", "columnar_layout",
           "main_wrapper"]


INSECURE_SEED_WARNING = (
    "WARNING: --insecure-test-seed: all randomness of this run derives from a known seed; "
    "its output is NOT private and must never be published")


class NoWellFormedInput(Exception):
    """The input has no well-formed line: reported as one line, exit status 1."""

    exit_status = 1


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


def runner_name(beam_args: Sequence[str]) -> str:
    """The runner's class name that ``beam_args`` select (default DirectRunner)."""
    return runners.runner_name_of(PipelineOptions(runners.resolve_runner_flag(list(beam_args))))


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


#: Inputs from this size on may use the compiled kernels (``compiled.WORK_BEFORE_COMPILING``
#: elements of work): the run says first when numba will compile them.
_COMPILE_NOTE_BYTES = 32 << 20


class ReleaseRun:
    """One command's release, from the checks of its locations to its final files.

    ``args`` has ``input``, ``output``, ``overwrite``, ``insecure_test_seed``,
    ``tabs_in_items`` and ``trust_columns`` (optional: ``dead_letter``, ``quiet``,
    ``verbose``, ``progress_notes``); ``beam_args`` are the Beam flags;
    ``sub_releases``: kinds (of ``outputs.SUB_RELEASE_KINDS``) of further releases
    the graph writes with ``outputs.write_items(..., PREFIX, kind=KIND)``.

    ``run(build, public_fields)`` is the whole life of the run; a command that needs
    exact counts of the input before its graph is built (a calibration) counts them
    in a pipeline of their own with ``count``.
    """

    def __init__(self, args, beam_args: Sequence[str], sub_releases: Sequence[str] = ()):
        self.args = args
        self.beam_args = list(beam_args)
        self.input: str = args.input
        self.prefix: str = args.output
        self.dead_letter: Optional[str] = getattr(args, "dead_letter", None)
        self.seed: Optional[int] = args.insecure_test_seed
        self.sub_releases = tuple(sub_releases)
        self.progress = console.Progress(
            console.command_prog(getattr(args, "_prog", "beam-dpsu")),
            getattr(args, "quiet", False))
        #: the input files (``check``) and the run key (``run``)
        self.paths: List[str] = []
        self.key: Optional[RunKey] = None
        self._earlier: List[str] = []  # an earlier run's outputs, deleted with --overwrite
        self._created: List[str] = []  # directories this run created, outermost first
        self._counted: set = set()  # the names of the counts its pipelines write

    # -- the whole life ---------------------------------------------------------------

    def run(self, build: Callable[[beam.Pipeline, RunKey], None],
            public_fields: Callable[[Any, int], Dict[str, Any]]) -> Dict[str, Any]:
        """Checks every location before anything is read or created, runs the pipeline
        ``build(p, run_key)`` adds (it must count the users once, e.g. a columnar
        transform's users per group through ``outputs.tally_users``, write the release
        with ``outputs.write_items`` and the malformed lines with
        ``outputs.write_dead_letter``), reads the counts the pipeline wrote, refuses a
        run without a well-formed input line, writes the owner-only details and then
        the public summary. ``public_fields(result, num_released)`` gives the
        mechanism's publishable fields. When anything fails or is interrupted (Ctrl-C)
        after the checks, every file of this run and every directory it created is
        removed before the exception goes on.

        ``args.progress_notes`` (optional, set by ``public_fields``): further
        progress lines, printed after the release's.

        Returns the public summary with the owner-only details under
        ``"PRIVATE_run_details"`` (what ``main`` prints is public fields only).
        """
        self.check()
        self.key = make_run_key(self.seed)
        outputs.delete_files(self._earlier)
        try:
            self._created += outputs.prepare_output(self.prefix)
            if self.dead_letter:
                self._created += outputs.prepare_output(self.dead_letter)
            return self._run_and_summarise(build, public_fields)
        except BaseException as e:
            self._clean_up(keep_dead_letter=isinstance(e, NoWellFormedInput))
            raise

    # -- before anything is read or created --------------------------------------------

    def check(self) -> None:
        """UsageError unless the input is readable files of ``user<TAB>item`` text
        (``outputs.check_input``, ``outputs.check_columns``), the output prefix and
        dead-letter path can be written (``outputs.check_output``) and no earlier
        run's outputs are there (or ``--overwrite`` is given: they are deleted when
        the run starts). Reads no data and leaves nothing."""
        self.paths = outputs.check_input(self.input)
        outputs.check_columns(self.paths, self.args.tabs_in_items, self.args.trust_columns)
        outputs.check_output(self.prefix, "--output")
        if self.dead_letter:
            outputs.check_output(self.dead_letter, "--dead-letter")
        found = self.earlier_outputs()
        if found and not self.args.overwrite:
            raise UsageError(
                f"{len(found)} output file(s) of an earlier run exist (e.g. {found[0]!r}); a "
                f"new release must not be mixed with them: choose another --output, or pass "
                f"--overwrite to delete them first")
        self._earlier = found  # two releases under one prefix would be read as one

    def files(self) -> List[str]:
        """The files this run writes, whether or not they exist: release files,
        summaries, counts, dead letter (``outputs.run_files``)."""
        return outputs.run_files(self.prefix, self.dead_letter)

    def earlier_outputs(self) -> List[str]:
        """Files an earlier run left under the prefix: items, summaries, counts, dead
        letters: this run's dead-letter file and those the earlier run's private details
        name."""
        prefix = self.prefix
        # the items' shards (one; an older version wrote several), never
        # another run's files such as PREFIX-items-x-items-00000-of-00001
        found = match_files(
            prefix + "-items-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]")
        found += _existing([p for p in self.files() if p not in found])
        patterns = []
        if prefix + outputs.PRIVATE_SUFFIX in found:
            try:
                with FileSystems.open(prefix + outputs.PRIVATE_SUFFIX) as f:
                    earlier = json.loads(f.read().decode("utf-8")).get("dead_letter_files")
                # this version records the file; an older one a pattern PATH-*
                if isinstance(earlier, str) and earlier.endswith(
                        (outputs.DEAD_LETTER_SUFFIX, "-*")):
                    patterns.append(earlier)
            except Exception:  # unreadable or not ours: its own path is still refused
                pass
        for pattern in patterns:
            found += match_files(pattern)
        return sorted(set(found))

    # -- pipelines -----------------------------------------------------------------------

    def run_pipeline(self, build: Callable[[beam.Pipeline], None]):
        """Builds and runs a pipeline; returns (result, wall seconds, runner name).

        When the run fails, the temporary files and directories it made next to the
        prefix and the dead-letter path (``outputs.temp_files``, local disks) are
        removed. When it ends, failed or not, the staging directories ``build`` made
        (``columnar_layout``) are removed (a Ctrl-C or SIGTERM then waits for the
        removal); one that cannot be removed is named in a warning.
        """
        beam_args = self.beam_args
        options = runners.pipeline_options(beam_args)
        runner = runner_name(beam_args)  # the runner asked for (DirectRunner: run as LOCAL_RUNNER)
        prefixes = (self.prefix, self.dead_letter)
        before = outputs.temp_files(prefixes)
        staged: List[str] = []
        token = _RUNNING.set((self, staged))
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
                for path in outputs.temp_files(prefixes) - before:
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        try:
                            os.remove(path)
                        except OSError:
                            pass
            raise
        finally:
            _RUNNING.reset(token)
            with _uninterrupted():
                for path in staged:
                    if not staging.remove_directory(path):
                        logging.warning("could not remove the staging directory %s (private "
                                        "data of the run): remove it", path)
        return result, time.time() - start, runner

    def count(self, build: Callable[[beam.Pipeline], None]) -> Dict[str, int]:
        """Exact counts of the input from a pipeline of their own, on the run's runner:
        ``build(p)`` adds steps that count with ``outputs.tally(pcoll, NAME, ...)``;
        returns ``{NAME: n}`` (with ``outputs.COUNT_NAMES``, 0 unless tallied). The
        counts pass through this process only, in owner-only files deleted at once
        (and by the run's clean-up when it fails). For a command that calibrates its
        mechanism from the input (``select --max-items-per-user auto``, GW-KT), inside its
        ``build``.
        """
        return self._run_counted(build)[3]

    def _run_counted(self, build: Callable[[beam.Pipeline], None]):
        """``run_pipeline(build)`` with the counts ``build`` tallied written to their
        files (``outputs.write_counts``), then read back and deleted: (result, wall
        seconds, runner name, counts)."""
        names: List[str] = []

        def with_counts(p):
            build(p)
            names[:] = outputs.write_counts(p, self.prefix)  # from the pipeline's own output
            self._counted.update(names)  # for the clean-up, should the run fail

        result, wall, runner = self.run_pipeline(with_counts)
        return result, wall, runner, outputs.read_counts(self.prefix, names)

    # -- the run, its counts, the final files --------------------------------------------

    def _run_and_summarise(self, build, public_fields) -> Dict[str, Any]:
        args, progress, dead_letter = self.args, self.progress, self.dead_letter
        paths = self.paths
        private_path = self.prefix + outputs.PRIVATE_SUFFIX
        # exact counts of the input on stderr only with --verbose (a shared cluster's logs
        # are seen by others); they are always in the private run details
        exact = bool(getattr(args, "verbose", False)) and not progress.quiet
        local = [p for p in paths if not outputs.is_remote(p)]
        size = sum(os.path.getsize(p) for p in local)
        progress(f"reading {len(paths)} file{'s' if len(paths) != 1 else ''}"
                 + (f" ({_size_text(size)})" if len(local) == len(paths) else "")
                 + f" on {runner_name(self.beam_args)}")
        if size >= _COMPILE_NOTE_BYTES and compiled.first_compilation_ahead():
            progress("numba compiles the fast kernels on this installation's first large "
                     "input: about 40 s more, once")

        result, wall, runner, counts = self._run_counted(lambda p: build(p, self.key))
        users, malformed = counts.get("users", 0), counts.get("malformed_lines", 0)
        if users == 0:
            kept = dead_letter and FileSystems.exists(outputs.dead_letter_file(dead_letter))
            raise NoWellFormedInput(
                f"no well-formed user<TAB>item line in {self.input!r}"
                + (f" ({malformed} malformed line(s))" if exact else "")
                + ": nothing released"
                + (f"; the malformed lines are in {outputs.dead_letter_file(dead_letter)}"
                   if kept else ""))
        self._complete_files(counts)
        progress(f"pipeline finished in {wall:.1f} s: {users} users, {malformed} malformed "
                 f"lines" if exact else f"pipeline finished in {wall:.1f} s (the input's "
                                        f"exact counts: --verbose, or the private run details)")
        released = counts.get("released", 0)
        public = self._public_summary(public_fields(result, released), released)
        details = self._private_details(users, malformed, runner, wall)
        self._write_private(details)
        self._write_public(public)
        if malformed:
            where = (f"; they are in {outputs.dead_letter_file(dead_letter)}" if dead_letter
                     else "")
            if not exact:  # no exact count on stderr: it is in the private details
                console.write_line(f"WARNING: malformed input lines were skipped (no tab, "
                                   f"empty user id or invalid UTF-8); their count is in "
                                   f"{private_path}{where}")
            else:
                console.write_line(f"WARNING: {malformed} malformed input line(s) skipped "
                                   f"(no tab, empty user id or invalid UTF-8){where}")
        progress(f"released {released} items: {self.prefix + outputs.ITEMS_SUFFIX}, summary "
                 f"{self.prefix + outputs.PUBLIC_SUFFIX}")
        for note in getattr(args, "progress_notes", None) or ():
            progress(note)
        return dict(public, PRIVATE_run_details=details)

    def _complete_files(self, counts: Dict[str, int]) -> None:
        """Every release file exists (an empty release writes none: created empty), and
        so does the dead-letter file the user asked for (empty, owner-only)."""
        kinds = {"items": "released", **{k: f"released_{k}" for k in self.sub_releases}}
        for kind, name in kinds.items():
            path = f"{self.prefix}-{kind}{outputs.SHARD}"
            if not FileSystems.exists(path):
                if counts.get(name):
                    raise RuntimeError(f"the run counted {counts[name]} released item(s) but "
                                       f"wrote no {path}")
                # transforms.write.WriteRelease writes no file for an empty release
                with FileSystems.create(path) as f:
                    f.write(b"")
        dead_letter = self.dead_letter
        if dead_letter and not FileSystems.exists(outputs.dead_letter_file(dead_letter)):
            # no malformed line: the file the user asked for exists, empty (and owner-only)
            outputs.write_private_file(outputs.dead_letter_file(dead_letter), [])

    def _public_summary(self, fields: Dict[str, Any], released: int) -> Dict[str, Any]:
        name, seed = os.path.basename(self.prefix), self.seed
        public = dict(fields)
        public.update({
            "num_released": released,
            "items_file": name + outputs.ITEMS_SUFFIX,
            "seeded": seed is not None,
            "insecure_test_seed": seed,
            "beam_dpsu_version": __version__,
            "note": outputs.PUBLIC_NOTE.replace("PREFIX", name) + (
                " A run with an insecure test seed is NOT private." if seed is not None
                else ""),
        })
        public["units"] = dict(public.get("units") or {}, **outputs.RELEASE_UNITS)
        return public

    def _private_details(self, users: int, malformed: int, runner: str, wall: float
                         ) -> Dict[str, Any]:
        prefix, dead_letter = self.prefix, self.dead_letter
        details = {
            "NEVER_PUBLISH": outputs.NEVER_PUBLISH_NOTE.replace("PREFIX",
                                                                os.path.basename(prefix)),
            "num_users": users,
            "malformed_lines": malformed,
            "input": self.input,
            "runner": runner,
            "wall_seconds": round(wall, 3),
            "items_output": prefix + outputs.ITEMS_SUFFIX,
            **({"other_release_outputs": [f"{prefix}-{k}{outputs.SHARD}"
                                          for k in self.sub_releases]}
               if self.sub_releases else {}),
            "public_summary": prefix + outputs.PUBLIC_SUFFIX,
            "dead_letter_files": outputs.dead_letter_file(dead_letter) if dead_letter else None,
        }
        if dead_letter:
            details["dead_letter_note"] = ("the dead-letter file holds private input lines: "
                                           "it is not a release and must never be published")
        return details

    def _write_public(self, summary: Dict[str, Any]) -> None:
        with FileSystems.create(self.prefix + outputs.PUBLIC_SUFFIX) as f:
            f.write((json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))

    def _write_private(self, details: Dict[str, Any]) -> None:
        """The owner-only details; on a local disk the file is created with mode 0600."""
        data = (json.dumps(details, indent=2, ensure_ascii=False, default=str) + "\n"
                ).encode("utf-8")
        path = self.prefix + outputs.PRIVATE_SUFFIX
        if outputs.is_remote(path):  # object stores have no file modes: their ACLs apply
            with FileSystems.create(path) as f:
                f.write(data)
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # also when the file existed
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    # -- clean-up ------------------------------------------------------------------------

    def _clean_up(self, keep_dead_letter: bool) -> None:
        """Removes every file of this run and every directory it created (input without
        a well-formed line keeps the dead-letter file the user asked for: it shows what
        is wrong with the input)."""
        keep = (outputs.dead_letter_file(self.dead_letter)
                if self.dead_letter and keep_dead_letter else None)
        files = self.files() + [outputs.counts_file(self.prefix, name)
                                for name in sorted(self._counted)]
        outputs.delete_files([p for p in _existing(list(dict.fromkeys(files))) if p != keep])
        outputs.remove_empty(self._created)


def _existing(paths: Sequence[str]) -> List[str]:
    return [p for p in paths if FileSystems.exists(p)]


def _size_text(size: int) -> str:
    return (f"{size} bytes" if size < 1000 else f"{size / 1e3:.1f} kB" if size < 1e6
            else f"{size / 1e6:.1f} MB")


#: The run whose pipeline ``ReleaseRun.run_pipeline`` is running, and the staging
#: directories made for it (``columnar_layout``).
_RUNNING: contextvars.ContextVar = contextvars.ContextVar("running", default=None)


def columnar_layout(p: beam.Pipeline, input_pattern: str) -> Dict[str, Any]:
    """The columnar transforms' layout for the input ``input_pattern`` matches now:
    ``user_groups`` for its size (``dp.data.columnar.user_groups_for``; the default when a
    file's size is unknown), ``item_shards`` for those groups and ``staging_dir``: a new
    staging directory next to the release (``outputs.staging_directory``) where ``p``'s
    runner holds a shuffle in memory (``runners.Capabilities.memory_shuffle``) and a
    ``ReleaseRun`` is running the build (it removes the directory when the pipeline
    ends), else None (the shuffles then go through the runner). None of them affects a
    release."""
    from beam_dpsu.dp.data.columnar import item_shards_for, user_groups_for
    from beam_dpsu.transforms.textio import match_sized
    sizes = [size for _, size in match_sized(input_pattern)]
    groups = user_groups_for(None if None in sizes else sum(sizes))
    return {"user_groups": groups, "item_shards": item_shards_for(groups),
            "staging_dir": _staging_for(p)}


def _staging_for(p: beam.Pipeline) -> Optional[str]:
    running = _RUNNING.get()
    if running is None or not runners.capabilities(p).memory_shuffle:
        return None
    run, staged = running
    path = outputs.staging_directory(run.prefix)
    if path is not None:
        staged.append(path)
    return path


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


