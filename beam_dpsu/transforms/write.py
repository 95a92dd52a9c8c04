"""Writing a release: collected, in an order that depends on the released set alone, as
ONE file that appears whole or not at all.

A PCollection of released items carries no order that may be published: the
order in which a runner produces elements (and so the order of lines a
sharded sink writes, and which shard an item lands in) can follow the input
order and reveal which items the first users hold. ``WriteRelease`` collects
the release (it is small next to the data), sorts it, writes it to a
temporary file next to the target and renames it into place. It works on
every runner, including those whose file sinks do not (Dask).
"""
from __future__ import annotations

import os
import uuid
from typing import Any, Callable, List, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_dpsu.dp.data.contribution import canonical_items

__all__ = ["WriteRelease", "WriteOneFile", "write_one_file", "sorted_text", "ranked_lines",
           "local_absolute"]

#: How the temporary file of ``write_one_file`` starts, before the final name's
#: last part: ``beam-temp-NAME-<random hex>`` next to NAME, as the directories of
#: Beam's file sinks (``beam-temp-NAME-...``), which the command lines remove
#: when a run fails.
TEMP_PREFIX = "beam-temp-"


def sorted_text(lines: Sequence[str]) -> List[str]:
    """All lines as one element, sorted: an order that depends on the set alone."""
    return ["\n".join(sorted(lines))] if lines else []


def ranked_lines(rows: Sequence[tuple]) -> List[str]:
    """Top-k rows ``(rank, item[, noisy_count])`` as one element, in rank order, each
    ``rank<TAB>item[<TAB>noisy_count]``: the command line's format. Pass it as
    ``WriteRelease(path, arrange=ranked_lines)`` after ``TopK``."""
    from beam_dpsu.dp.mechanisms.topk import format_line
    rows = sorted(rows, key=lambda r: r[0])
    return ["\n".join(format_line(r) for r in rows)] if rows else []


def _one_key(element):
    return None, element


def _write_parts(f, parts) -> None:
    for part in parts:
        f.write((part if isinstance(part, bytes) else str(part).encode("utf-8")) + b"\n")


def write_one_file(path: str, parts) -> None:
    """Writes ``parts`` (bytes or str, each followed by a newline) as the file ``path``,
    which appears whole or not at all.

    The text goes to a temporary file in the same directory
    (``beam-temp-NAME-<random hex>``: ``TEMP_PREFIX``), which is then renamed to
    ``path``: on a local disk a rename within a directory is atomic (and replaces
    a file a retried attempt wrote); an object store shows an object only once it
    is complete. Where a rename does not replace an existing file (HDFS), a
    file a retried attempt left at ``path`` is deleted and the rename tried
    again. When writing or renaming fails, the temporary file is deleted and
    the error raised. Compression follows ``path``'s suffix, as Beam's; the
    type is ``text/plain``, as ``WriteToText``'s.
    """
    directory, name = FileSystems.split(path)
    temp = FileSystems.join(directory, f"{TEMP_PREFIX}{name}-{uuid.uuid4().hex}")
    try:
        with FileSystems.create(temp, mime_type="text/plain",
                                compression_type=CompressionTypes.detect_compression_type(
                                    path)) as f:
            _write_parts(f, parts)
        try:
            FileSystems.rename([temp], [path])
        except Exception:
            if not FileSystems.exists(path):
                raise
            FileSystems.delete([path])  # a retried attempt's, which this rename would not replace
            FileSystems.rename([temp], [path])
    except BaseException:
        try:
            if FileSystems.exists(temp):
                FileSystems.delete([temp])
        except Exception:  # noqa: BLE001 (the write's own error is the one to report)
            pass
        raise


class _WriteOneFileDoFn(beam.DoFn):
    """(None, [elements]) → the file ``path`` with ``arrange(elements)``'s lines."""

    def __init__(self, path: str, arrange: Callable[[List[Any]], List[Any]]):
        self._path = path
        self._arrange = arrange

    def process(self, element):
        write_one_file(self._path, self._arrange(list(element[1])))
        yield self._path


def local_absolute(path: str) -> str:
    """``path`` made absolute against the launcher's working directory (a URL such as
    ``gs://…`` as it is): the workers that write it may run in another directory
    (a Dask cluster's), where a relative path would put the file out of sight."""
    if not isinstance(path, str) or not path or "://" in path:
        return path
    tail = os.sep if path.endswith(("/", os.sep)) else ""  # kept, as given
    return os.path.abspath(path).rstrip(os.sep) + tail or os.sep


class WriteOneFile(beam.PTransform):
    """Writes a whole (small) PCollection as the one file ``path``: a ``GroupByKey``
    under one key, then one ``ParDo`` (``write_one_file``: the file appears whole
    or not at all). An empty PCollection writes no file. Output: the path, once.

    Args:
      path: the file to write (any Beam filesystem); a relative local path is
        resolved now, against the launcher's working directory.
      arrange: list of all elements → lines (default: as they come). Use
        ``WriteRelease`` for a release: its lines must not follow the runner's order.
    """

    def __init__(self, path: str, arrange: Optional[Callable[[List[Any]], List[Any]]] = None,
                 label: Optional[str] = None):
        super().__init__(label)
        self._path = local_absolute(path)
        self._arrange = arrange or list

    def expand(self, pcoll):
        return (pcoll
                | "OneKey" >> beam.Map(_one_key)
                | "Collect" >> beam.GroupByKey()
                | "Write" >> beam.ParDo(_WriteOneFileDoFn(self._path, self._arrange)))


def _item_line(item) -> str:
    return item if isinstance(item, str) else str(item)


class _SortedItems:
    """Released items → their text lines, sorted (by ``canonical_items``)."""

    def __call__(self, items: List[Any]) -> List[str]:
        return sorted_text([_item_line(item) for item in canonical_items(items)])


class WriteRelease(beam.PTransform):
    """Writes a release safely: collected, sorted, ONE file, renamed into place.

    Chain it after ``SelectPartitions`` (or any PCollection of released items)::

        released = pairs | SelectPartitions(WeightedGaussian(3, 1e-5))
        released | WriteRelease("out/vocabulary.txt")

    Each item is one line (``str`` items as they are, others as ``str(item)``),
    sorted, so the file's order depends on the released set alone and never on
    the order in which the runner produced the items (which can follow the
    input order). The file is written to a temporary name next to ``path``
    and renamed, so it appears whole or not at all. An empty release writes
    no file (the command lines then create an empty one).

    Args:
      path: the file to write (any Beam filesystem; ``.gz`` compresses); a relative
        local path is resolved now, against the launcher's working directory (the
        workers may run elsewhere).
      arrange: all released elements → the file's lines, in an order that must
        depend on the set alone; default: items sorted, one per line. For the rows
        of ``TopK``, pass ``ranked_lines`` (rank order, ``rank<TAB>item``, as the
        command line writes them).
      label: the transform's label (default ``WriteRelease``).

    Privacy: the file holds the released set and nothing else; it is covered by
    the guarantee of the mechanism that released it. Writing the PCollection to
    a sharded sink instead (``WriteToText``) can leak the input order.
    """

    def __init__(self, path: str, arrange: Optional[Callable[[List[Any]], List[str]]] = None,
                 label: Optional[str] = None):
        super().__init__(label)
        if not isinstance(path, str) or not path:
            raise ValueError(f"path must be a non-empty string, got {path!r}")
        self._path = path
        self._arrange = arrange or _SortedItems()

    def expand(self, pcoll):
        return pcoll | "WriteOneFile" >> WriteOneFile(self._path, self._arrange)
