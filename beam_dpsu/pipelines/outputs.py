"""The files of a release: where they go, what is checked before a run, how they are written.

* the release is ONE file, ``PREFIX-items-00000-of-00001``, whose line order
  is a function of the released set alone (sorted; top-k: rank order), never
  of the input order (``transforms.write.WriteRelease``);
* ``PREFIX.json`` holds only what may be published with the items; the exact
  counts, input paths, runner and timings go to the owner-only file
  ``PREFIX.PRIVATE-run-details.json`` (mode 0600 on local disks);
* every location is checked before anything is read or created, and a
  pipeline never writes a second release under a prefix: outputs of an
  earlier run are refused, or deleted first with ``--overwrite``.
"""
from __future__ import annotations

import json
import os
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

import apache_beam as beam
from apache_beam import coders
from apache_beam.io.filesystems import FileSystems

from beam_dpsu.pipelines.cli import UsageError, last_line as _last_line
from beam_dpsu.transforms import runners
from beam_dpsu.transforms.textio import match_files
from beam_dpsu.transforms.write import WriteOneFile, WriteRelease, sorted_text


__all__ = ["SHARD", "ITEMS_SUFFIX", "TOPK_KIND", "SUB_RELEASE_KINDS", "PUBLIC_SUFFIX",
           "PRIVATE_SUFFIX", "NEVER_PUBLISH_NOTE", "PUBLIC_NOTE", "RELEASE_UNITS",
           "write_dead_letter", "check_input", "check_output", "prepare_output", "remove_empty",
           "earlier_outputs", "check_earlier_outputs", "delete_files", "write_items",
           "count_output_lines", "write_public", "write_private", "check_locations"]


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


#: The meaning of the fields every release's PREFIX.json has besides the
#: mechanism's own (``describe()["units"]`` explains those).
RELEASE_UNITS = {
    "num_released": "number of items in the items file",
    "items_file": "the file of released items, next to this summary",
    "seeded": "true when the run used --insecure-test-seed (then NOT private)",
    "insecure_test_seed": "the insecure test seed, or null (a private run)",
    "beam_dpsu_version": "version of the library that made the release",
}


def _repeat_line(element):
    line, n = element
    return [line] * n


def write_dead_letter(malformed: beam.PCollection, path: Optional[str]) -> None:
    """Writes ``(line, count)`` malformed lines (raw bytes, each occurrence) to ``path-*``."""
    if path and not runners.capabilities(malformed.pipeline).file_sinks:
        (malformed  # no working file sink (Dask): one file, written by one ParDo
         | "RepeatMalformed" >> beam.FlatMap(_repeat_line)
         | "WriteDeadLetter" >> WriteOneFile(path + "-00000-of-00001"))
    elif path:
        (malformed
         | "RepeatMalformed" >> beam.FlatMap(_repeat_line)
         | "WriteDeadLetter" >> beam.io.WriteToText(path, coder=coders.BytesCoder()))


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
    # the items' shards (one; an older version wrote several), never
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
    writes no file; ``run_release`` then creates it empty).
    """
    lines | label + "WriteItems" >> WriteRelease(f"{prefix}-{kind}{SHARD}", arrange)


def _temp_dirs(prefixes: Sequence[str]) -> set:
    """Local ``beam-temp-*`` directories Beam's file sinks make for these prefixes, and
    the temporary files of ``write.write_one_file``."""
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


def check_locations(input_pattern: str, *output_prefixes: Optional[str]) -> None:
    """UsageError unless the input is readable files and each output can be written."""
    check_input(input_pattern)
    for prefix in output_prefixes:
        if prefix:
            check_output(prefix)
