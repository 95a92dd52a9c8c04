"""The files of a release: their names, the checks of a location, the steps that write them.

What every run of a release command (``runs.ReleaseRun``, which owns a run's files
from its checks to its final files) writes, and how; nothing here keeps the state of
a run:

* the release is ONE file, ``PREFIX-items-00000-of-00001``, whose line order
  is a function of the released set alone (sorted; top-k: rank order), never
  of the input order (``transforms.write.WriteRelease``);
* ``PREFIX.json`` holds only what may be published with the items; the exact
  counts, input paths, runner and timings go to the owner-only file
  ``PREFIX.PRIVATE-run-details.json`` (mode 0600 on local disks);
* every file that holds private data has ``PRIVATE`` in its name and is
  written owner-only (mode 0600 on local disks, ``write_private_file``): the
  run details, the dead-letter file ``PATH.PRIVATE-dead-letter-00000-of-00001``
  (raw input lines) and the counts the pipeline itself writes,
  ``PREFIX.PRIVATE-run-counts-NAME.json`` (``tally`` / ``write_counts``), which the
  run reads into the run details and deletes (``read_counts``);
* every location is checked before anything is read or created (``check_input``,
  ``check_columns``, ``check_output``), and a pipeline never writes a second
  release under a prefix: outputs of an earlier run are refused, or deleted first
  with ``--overwrite`` (``runs.ReleaseRun.check``).
"""
from __future__ import annotations

import json
import logging
import os
import uuid
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_dpsu.dp.data import lines as lines_mod
from beam_dpsu.pipelines.console import UsageError, last_line as _last_line
from beam_dpsu.transforms import runners, staging
from beam_dpsu.transforms.textio import match_files
from beam_dpsu.transforms.write import TEMP_PREFIX, WriteRelease, sorted_text, write_one_file


__all__ = ["SHARD", "ITEMS_SUFFIX", "TOPK_KIND", "SUB_RELEASE_KINDS", "PUBLIC_SUFFIX",
           "PRIVATE_SUFFIX", "COUNTS_SUFFIX", "COUNT_NAMES", "counts_file", "DEAD_LETTER_SUFFIX",
           "dead_letter_file", "NEVER_PUBLISH_NOTE", "PUBLIC_NOTE", "RELEASE_UNITS",
           "run_files", "temp_files", "is_remote",
           "check_input", "check_columns", "check_output", "check_locations", "prepare_output",
           "remove_empty", "delete_files",
           "write_private_file", "replace_local", "WritePrivateFile", "staging_directory",
           "write_items", "count_output_lines", "write_dead_letter", "tally_users",
           "tally", "write_counts", "read_counts"]


# -- the names of a run's files ----------------------------------------------------

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


#: The counts the pipeline itself writes (users, malformed lines, released items):
#: one owner-only file per count, ``PREFIX`` + this + ``-NAME.json``
#: (``counts_file``); the launcher reads them into the run details and deletes them
#: (``read_counts``).
COUNTS_SUFFIX = ".PRIVATE-run-counts"


#: What ``write_counts`` always writes (0 when nothing was tallied under a name).
COUNT_NAMES = ("users", "malformed_lines", "released")


def counts_file(prefix: str, name: str) -> str:
    """The file of the count ``name`` of a run under ``prefix`` (``write_counts``)."""
    return f"{prefix}{COUNTS_SUFFIX}-{name}.json"


#: The one dead-letter file of ``--dead-letter PATH``: ``PATH`` + this (raw private
#: input lines, owner-only).
DEAD_LETTER_SUFFIX = ".PRIVATE-dead-letter" + SHARD


def dead_letter_file(path: str) -> str:
    """The one dead-letter file of ``--dead-letter PATH``:
    ``PATH.PRIVATE-dead-letter-00000-of-00001``."""
    return path + DEAD_LETTER_SUFFIX


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


#: The meaning of the fields every release's PREFIX.json has besides the
#: mechanism's own (``describe()["units"]`` explains those).
RELEASE_UNITS = {
    "num_released": "number of items in the items file",
    "items_file": "the file of released items, next to this summary",
    "seeded": "true when the run used --insecure-test-seed (then NOT private)",
    "insecure_test_seed": "the insecure test seed, or null (a private run)",
    "beam_dpsu_version": "version of the library that made the release",
}


def run_files(prefix: str, dead_letter: Optional[str] = None) -> List[str]:
    """The files a run under ``prefix`` (with ``--dead-letter`` ``dead_letter``)
    writes, whether or not they exist: release files, summaries, counts, dead letter."""
    return ([prefix + ITEMS_SUFFIX] + [f"{prefix}-{kind}{SHARD}" for kind in SUB_RELEASE_KINDS]
            + [prefix + PUBLIC_SUFFIX, prefix + PRIVATE_SUFFIX]
            + [counts_file(prefix, name) for name in COUNT_NAMES]
            + [counts_file(prefix, f"released_{kind}") for kind in SUB_RELEASE_KINDS]
            + ([dead_letter_file(dead_letter)] if dead_letter else []))


def temp_files(prefixes: Sequence[str]) -> set:
    """The local temporary files and directories a run under these prefixes (or
    ``--dead-letter`` paths) makes next to them: those of ``write.write_one_file``
    for the release files (``beam-temp-PREFIX-items-00000-of-00001-<hex>``), of
    ``write_private_file`` and the staging directories (``beam-temp-PREFIX.PRIVATE-...``);
    never another prefix's, such as ``PREFIX-2``'s or ``PREFIX2``'s."""
    out = set()
    for prefix in prefixes:
        if not prefix or is_remote(prefix):
            continue
        parent = os.path.dirname(os.path.abspath(prefix))
        base = TEMP_PREFIX + os.path.basename(prefix)
        starts = tuple(f"{base}-{kind}{SHARD}-" for kind in ("items", *SUB_RELEASE_KINDS)
                       ) + (base + ".PRIVATE-",)
        try:
            out |= {os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(starts)}
        except OSError:
            pass
    return out


def is_remote(path: str) -> bool:
    """Whether ``path`` is on a remote filesystem (``gs://``, ``s3://`` ...): no file modes,
    no local directories."""
    return "://" in path


# -- before a run: the checks of its locations, then its directories ---------------

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
        if is_remote(path):
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


def check_columns(paths: Sequence[str], tabs_in_items: bool = False,
                  trust_columns: bool = False) -> None:
    """UsageError when the first MiB of the first local input file shows a column mistake:

    * a line with more than two tab-separated fields (``user<TAB>item<TAB>1``), whose
      item would be glued to the rest of the line (``item<TAB>1``), unless
      ``tabs_in_items`` (``--tabs-in-items``) says the rest of the line is the item;
    * columns that look swapped (``dp.data.lines.looks_swapped``: the second column comes in
      runs as a user's lines do): the release would publish user ids and protect items,
      not people; unless ``trust_columns`` (``--trust-columns``).

    And before both, whatever the flags: input that is not text at all (binary, or
    compressed without the name that says so: ``dp.data.lines.not_text_reason``).

    Remote files are not read here. Nothing else of the input is checked.
    """
    local = [p for p in paths if not is_remote(p)]
    if not local:
        return
    path = local[0]
    try:
        reason = lines_mod.not_text_reason(lines_mod.sniff_head(path))
    except (OSError, EOFError) as e:  # unreadable or corrupt: the read reports it
        logging.debug("text check skipped for %s: %s", path, e)
        reason = None
    if reason is not None:
        raise UsageError(f"{path} is not user<TAB>item text: {reason}")
    if tabs_in_items and trust_columns:
        return
    try:
        lines = lines_mod.sniff_lines(path)
    except (OSError, EOFError) as e:  # unreadable or corrupt: the read reports it
        logging.debug("column check skipped for %s: %s", path, e)
        return
    if not tabs_in_items:
        k = lines_mod.first_extra_column(lines)
        if k is not None:
            fields = lines[k].count(b"\t") + 1
            raise UsageError(
                f"line {k + 1} of {path} has {fields} tab-separated fields, so its item would "
                f"be everything after the first tab; give user<TAB>item lines (e.g. cut -f1,2), "
                f"or pass --tabs-in-items if the rest of the line is the item")
    if not trust_columns and lines_mod.looks_swapped(lines):
        user_runs, item_runs = lines_mod.column_runs(lines)
        raise UsageError(
            f"the columns of {path} look swapped: the first column must be the person (the "
            f"user id), but there the second column comes in runs of {item_runs:.1f} lines "
            f"as a user's lines do, the first in runs of {user_runs:.1f}; the release would "
            f"publish user ids. Swap them (awk -F'\\t' '{{print $2\"\\t\"$1}}') or, if the first "
            f"column is the person (a file sorted by item looks the same), pass --trust-columns")


def check_output(prefix: str, flag: str = "--output") -> None:
    """UsageError unless files ``PREFIX...`` can be created; creates and leaves nothing.

    On a local disk the nearest existing ancestor of the prefix's directory
    must be a directory we may write; then the missing directories are really
    created, an empty probe file is created in the prefix's directory, and all
    of them are removed again (permission bits do not tell everything: ``/proc``
    or a read-only mount refuse what ``os.access`` allows). The directories are
    created for good only when the run starts (``prepare_output``). On other
    filesystems an empty probe file is created and deleted.
    """
    if prefix.endswith(("/", os.sep)):
        raise UsageError(f"{flag} {prefix!r} ends with a separator; it is a file prefix, "
                         f"e.g. {os.path.join(prefix, 'release')!r}")
    if is_remote(prefix):
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
    _probe_local(prefix)


def _probe_local(prefix: str) -> None:
    """Creates the prefix's missing directories and a probe file in it, then removes
    them all; UsageError (with the system's reason) when any step fails."""
    directory = os.path.dirname(os.path.abspath(prefix))
    missing = []
    parent = directory
    while not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    made: List[str] = []
    step = ""
    try:
        for path in reversed(missing):  # outermost first
            step = f"cannot create directory {path!r}"
            os.mkdir(path)
            made.append(path)
        step = f"cannot create files in {directory!r}"
        probe = os.path.join(directory, f".beam-dpsu-probe-{uuid.uuid4().hex}")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.remove(probe)
    except OSError as e:
        raise UsageError(f"cannot write to {prefix!r}: {step}: {e.strerror or e}") from None
    finally:
        remove_empty(made)


def check_locations(input_pattern: str, *output_prefixes: Optional[str]) -> None:
    """UsageError unless the input is readable files and each output can be written."""
    check_input(input_pattern)
    for prefix in output_prefixes:
        if prefix:
            check_output(prefix)


def prepare_output(prefix: str) -> List[str]:
    """Creates the prefix's directory (local disks), after every check passed.

    Returns the directories it created, outermost first (for ``remove_empty``).
    """
    if is_remote(prefix):
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


def delete_files(paths: Sequence[str]) -> None:
    """Deletes ``paths`` (on any filesystem)."""
    if paths:
        FileSystems.delete(list(paths))


# -- owner-only files, appearing whole or not at all -------------------------------

def _temp_name(path: str) -> str:
    """A temporary file next to ``path``: ``beam-temp-NAME-<hex>`` (``write.TEMP_PREFIX``),
    which a failed run's clean-up finds (``temp_files``)."""
    directory, name = FileSystems.split(path)
    return FileSystems.join(directory, f"{TEMP_PREFIX}{name}-{uuid.uuid4().hex}")


def write_private_file(path: str, parts) -> None:
    """Writes ``parts`` (bytes or str, each followed by a newline) as the file ``path``,
    owner-only, appearing whole or not at all.

    On a local disk the text goes to a temporary file next to ``path`` created
    with mode 0600 (whatever the umask: no moment at which another user could
    open it), which is then renamed to ``path``. On other filesystems (object
    stores have no file modes; their access control applies) this is
    ``transforms.write.write_one_file``. ``parts`` is iterated once (it may be
    a runner's lazy iterable of grouped values).
    """
    if is_remote(path):
        write_one_file(path, parts)
        return

    def write(temp: str) -> None:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write((part if isinstance(part, bytes) else str(part).encode("utf-8"))
                        + b"\n")
    replace_local(path, write)


def replace_local(path: str, write: Callable[[str], None]) -> None:
    """Makes the local file ``path`` appear whole or not at all: ``write(temp)`` writes a
    temporary file next to it (``_temp_name``, which a failed run's clean-up finds), which
    is then renamed to ``path``; on any failure the temporary file is removed."""
    temp = _temp_name(path)
    try:
        write(temp)
        os.replace(temp, path)
    except BaseException:
        try:
            os.remove(temp)
        except OSError:
            pass
        raise


def _one_key(element):
    return None, element


class _WritePrivateFileDoFn(beam.DoFn):
    """(None, elements) → the owner-only file ``path`` (``write_private_file``)."""

    def __init__(self, path: str, to_parts: Callable[[Any], Any]):
        self._path = path
        self._to_parts = to_parts

    def process(self, element):
        write_private_file(self._path, self._to_parts(element[1]))
        yield self._path


def _as_is(elements):
    return elements


class WritePrivateFile(beam.PTransform):
    """Writes a whole PCollection as the ONE owner-only file ``path``
    (``write_private_file``): a ``GroupByKey`` under one key, then one ``ParDo``.
    An empty PCollection writes no file. Works on every runner (also Dask, whose
    file sinks write empty files).

    Args:
      path: the file to write; its name should say PRIVATE.
      to_parts: the grouped elements (an iterable, read once) → the file's lines
        (default: the elements as they come, streamed).
    """

    def __init__(self, path: str, to_parts: Optional[Callable[[Any], Any]] = None,
                 label: Optional[str] = None):
        super().__init__(label)
        self._path = path
        self._to_parts = to_parts or _as_is

    def expand(self, pcoll):
        return (pcoll
                | "OneKey" >> beam.Map(_one_key)
                | "Collect" >> beam.GroupByKey()
                | "Write" >> beam.ParDo(_WritePrivateFileDoFn(self._path, self._to_parts)))


def staging_directory(prefix: str) -> Optional[str]:
    """A new owner-only directory next to the release for the run's staged shuffles
    (``transforms.staging``: private data derived from the input),
    ``beam-temp-NAME.PRIVATE-staging-<hex>``, which the run removes when it ends,
    whether it succeeds or fails (``runs.ReleaseRun.run_pipeline``); None for a prefix on a
    remote filesystem (the run then shuffles through the runner)."""
    if is_remote(prefix):
        return None
    directory = os.path.dirname(os.path.abspath(prefix))
    name = f"{TEMP_PREFIX}{os.path.basename(prefix)}.PRIVATE-staging-{uuid.uuid4().hex}"
    return staging.make_directory(os.path.join(directory, name))


# -- the steps of a release pipeline that write its files --------------------------

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

    Written by ``transforms.write.WriteRelease`` on every runner: one step
    collects the lines, one writes them to a temporary file next to the release
    and renames it, so the file appears whole or not at all (an empty release
    writes no file; ``runs.ReleaseRun`` then creates it empty).

    The released elements are also counted (``tally``: ``released`` for the
    items, ``released_KIND`` for a further release) in the run's counts files.
    """
    tally(lines, "released" if kind == "items" else f"released_{kind}")
    lines | label + "WriteItems" >> WriteRelease(f"{prefix}-{kind}{SHARD}", arrange)


def count_output_lines(prefix: str, kind: str = "items") -> int:
    """Non-empty lines of the release file ``PREFIX-KIND-00000-of-00001`` (this file
    only: a glob would also match other runs' files); 0 if it does not exist."""
    path = f"{prefix}-{kind}{SHARD}"
    if not FileSystems.exists(path):
        return 0
    with FileSystems.open(path) as f:
        return sum(1 for line in f if line.strip())


def _each_occurrence(grouped):
    for line, n in grouped:
        for _ in range(n):
            yield line


def write_dead_letter(malformed: beam.PCollection, path: Optional[str]) -> None:
    """Counts the ``(line, count)`` malformed lines in the run's counts files
    (``tally``: ``malformed_lines``, each occurrence) and writes them (raw bytes,
    each occurrence) to the owner-only file ``dead_letter_file(path)``: no file
    when ``path`` is None or there is no malformed line.

    The lines are private input: the file says PRIVATE in its name and is
    created with mode 0600 on a local disk. One worker writes it, streaming the
    lines (in no particular order).
    """
    tally(malformed, "malformed_lines", counts_second=True)
    if path:
        malformed | "WriteDeadLetter" >> WritePrivateFile(dead_letter_file(path),
                                                          _each_occurrence)


def tally_users(users: beam.PCollection) -> None:
    """Counts a run's users (``tally``: ``users``) from a columnar transform's users per
    group."""
    tally(users | "UsersPerGroup" >> beam.Map(_group_count), "users", counts_second=True)


def _group_count(n: int):
    return None, n


# -- the counts of a run, written by the pipeline itself ---------------------------

#: pipeline -> {name: PCollections of (name, n) to add up in the count's file}
_TALLIES: "weakref.WeakKeyDictionary[beam.Pipeline, dict]" = weakref.WeakKeyDictionary()


class _TallyDoFn(beam.DoFn):
    """element -> ``(name, 1)``, or ``(name, element[1])`` (a ``(line, count)`` pair),
    summed over the bundle and emitted once at its end (``per_bundle``), else
    emitted per element (a runner that drops what ``finish_bundle`` emits: Dask)."""

    def __init__(self, name: str, second: bool, per_bundle: bool):
        self.name, self.second, self.per_bundle = name, second, per_bundle

    def start_bundle(self):
        self._total = 0

    def process(self, element):
        n = int(element[1]) if self.second else 1
        if self.per_bundle:
            self._total += n
        else:
            yield self.name, n

    def finish_bundle(self):
        if self.per_bundle and self._total:
            yield beam.transforms.window.GlobalWindows.windowed_value((self.name, self._total))
        self._total = 0


def tally(pcoll: beam.PCollection, name: str, counts_second: bool = False) -> None:
    """Adds ``pcoll``'s number of elements (``counts_second``: the sum of each
    element's second part, e.g. the ``n`` of ``(line, n)``) to the count ``name``,
    written in its own file (``write_counts``).

    The counts come from the pipeline's own output, not from Beam metrics, so every
    runner reports them (Dask implements no metrics).
    """
    per_bundle = runners.capabilities(pcoll.pipeline).bundle_outputs
    fn = _TallyDoFn(name, counts_second, per_bundle)
    found = _TALLIES.setdefault(pcoll.pipeline, {}).setdefault(name, [])
    found.append(pcoll | f"Tally{len(found)}{name}" >> beam.ParDo(
        fn if per_bundle else runners.per_element_flush(fn)))


def _count_json(grouped):
    """The ``(name, n)`` elements of one count → its file's one line, ``{"name": total}``."""
    totals: Dict[str, int] = {}
    for name, n in grouped:
        totals[name] = totals.get(name, 0) + int(n)
    return [json.dumps(dict(sorted(totals.items())))]


def write_counts(pipeline: beam.Pipeline, prefix: str) -> List[str]:
    """Adds to ``pipeline`` the steps that write each count that ``tally``
    registered for it, summed, to its own owner-only file ``counts_file(prefix,
    NAME)`` (``write_private_file``: exact counts of the input); returns the names.
    ``users``, ``malformed_lines`` and ``released`` are always written, 0 when
    nothing was tallied. Call it after the graph is built.

    One file per count, each the count's own elements and a 0 collected under one
    key: no ``Flatten`` of the stages' outputs before a shuffle, whose number of
    partitions adds up on Beam's Dask runner (and its shuffle's tasks grow with
    the square of that number).
    """
    tallies = _TALLIES.get(pipeline, {})
    names = list(COUNT_NAMES) + sorted(set(tallies) - set(COUNT_NAMES))
    for name in names:
        zero = pipeline | f"Count/{name}/Zero" >> beam.Create([(name, 0)])
        ((zero, *tallies.get(name, ()))
         | f"Count/{name}/Flatten" >> beam.Flatten()
         | f"Count/{name}/Write" >> WritePrivateFile(counts_file(prefix, name), _count_json))
    return names


def read_counts(prefix: str, names: Sequence[str] = ()) -> Dict[str, int]:
    """The counts a run's pipeline wrote (``write_counts``: ``COUNT_NAMES`` and
    ``names``); their files are deleted. Raises RuntimeError when one of them is
    missing (the run always writes each)."""
    counts: Dict[str, int] = {}
    paths = [counts_file(prefix, name) for name in dict.fromkeys([*COUNT_NAMES, *names])]
    for path in paths:
        if not FileSystems.exists(path):
            raise RuntimeError(f"the run wrote no {path}: its runner skipped part of the graph")
        with FileSystems.open(path) as f:
            counts.update({k: int(v) for k, v in json.loads(f.read().decode("utf-8")).items()})
    FileSystems.delete(paths)
    return counts
