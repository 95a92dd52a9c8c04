"""Reading ``user_id<TAB>item`` text files straight into per-user item counts.

``ReadUserItems(pattern)`` is the fast path for text input: each file is read
inside one DoFn call in large binary blocks, identical lines are counted with
``collections.Counter`` (in C), and only the distinct lines are parsed and
grouped per user before the first shuffle. This avoids the per-element cost of
the Python SDK for every occurrence (``ReadFromText`` followed by a map costs
several times as much on the same data).

The format and its parsing are ``beam_dpsu.dp.data.lines``; files ending in
``.gz`` or ``.bz2`` are decompressed; a UTF-8 byte-order mark at the start of
a file is removed (``lines.iter_raw_blocks``, which every read path of this
module goes through); a malformed line is skipped and counted in the metric
``beam_dpsu/malformed_lines``, never a crash. User ids and items are always
``str``.
"""
from __future__ import annotations

import bz2
import collections
import os
import pickle
from typing import Any, Dict, List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_dpsu.transforms import runners
from beam_dpsu.dp.privacy.calibration import check_flag, check_positive_int
from beam_dpsu.dp.data.contribution import DEFAULT_FLUSH_PAIRS, ItemCounts
from beam_dpsu.dp.data.lines import (BLOCK_BYTES, byte_ranges, group_line_counts, gzip_reader,
                                is_compressed, iter_line_blocks, iter_line_counts,
                                iter_raw_blocks, pack_user_groups, read_user_items,
                                with_positions)
from beam_dpsu.transforms.bounding import MergeItemCountsFn, mark_canonical_ids
from beam_dpsu.transforms.write import local_absolute

__all__ = ["DEFAULT_COMPLETE_MAX_PAIRS", "MAX_FILE_PARTITIONS", "DEFAULT_READ_GROUPS",
           "open_binary", "MergeUserGroups", "MergeOrderedItemCountsFn", "read_per_user",
           "match_files", "match_sized", "file_ranges", "file_of",
           "balanced_bins", "input_files", "dealt_files", "ReadUserItems"]


#: ``ReadUserItems(complete_users=True)``: a single input file with at most this
#: many distinct lines is read whole, its users emitted as complete.
DEFAULT_COMPLETE_MAX_PAIRS = 8 << 20
#: On Dask (``runners.Capabilities.redistributes`` False), the most partitions the
#: input files are dealt into: one ``Create`` each, so one dask partition each.
MAX_FILE_PARTITIONS = 1024
#: ``ReadUserItems`` merges the users' partial counts in this many groups (a
#: hash of the user id picks the group): one shuffle element per (file chunk,
#: group) instead of one per (file chunk, user).
DEFAULT_READ_GROUPS = 1024


def open_binary(path: str):
    """Opens ``path`` (any Beam filesystem) for binary reading, decompressing by suffix."""
    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if path.endswith(".gz"):
        return gzip_reader(raw)
    if path.endswith(".bz2"):
        return bz2.BZ2File(raw, mode="rb")
    return raw


class _MergeGroupDoFn(beam.DoFn):
    """``(group, [pickled {user: partial}, ...])`` → ``(user, merged counts)`` per user.

    A user found in one part keeps its value as it is (with ``keep_order`` its
    counts already iterate in position order); users in several parts are
    merged with ``MergeItemCountsFn`` / ``MergeOrderedItemCountsFn``.
    """

    def __init__(self, keep_order: bool):
        self._keep_order = keep_order

    def process(self, element):
        merged: Dict[str, Any] = {}
        several = set()
        for blob in element[1]:
            part = pickle.loads(blob)
            if not merged:
                merged = part
                continue
            get = merged.get
            for user, value in part.items():
                old = get(user)
                if old is None:
                    merged[user] = value
                    continue
                several.add(user)  # the parts are fresh from pickle: merged in place
                merged[user] = (_ORDERED if self._keep_order else _COUNTS).add_input(old, value)
        if not self._keep_order:
            yield from merged.items()
            return
        for user, (counts, positions) in merged.items():
            yield user, (_ORDERED.extract_output((counts, positions)) if user in several
                         else counts)


class MergeUserGroups(beam.PTransform):
    """``(group, pickled {user: partial})`` from the readers → ``(user, counts)``, one
    element per user: a ``GroupByKey`` on the group, then the merge per user
    inside each group (``_MergeGroupDoFn``). A group's users are held in one
    worker's memory while it is merged (users / groups of them)."""

    def __init__(self, keep_order: bool, label: Optional[str] = None):
        super().__init__(label)
        self._keep_order = keep_order

    def expand(self, packed):
        return (packed
                | "GroupUsers" >> beam.GroupByKey()
                | "MergeGroups" >> beam.ParDo(_MergeGroupDoFn(self._keep_order)))


class MergeOrderedItemCountsFn(beam.CombineFn):
    """Merges ``(counts, positions)`` partials into one ``{item: count}`` per user
    that iterates in the order of the smallest position of each item (the
    user's record order). Lifts into a per-bundle pre-combine."""

    def create_accumulator(self):
        return {}, {}

    def add_input(self, acc, value):
        counts, positions = acc
        new_counts, new_positions = value
        get = counts.get
        for item, c in new_counts.items():
            counts[item] = get(item, 0) + c
        get = positions.get
        for item, p in new_positions.items():
            old = get(item)
            if old is None or p < old:
                positions[item] = p
        return acc

    def merge_accumulators(self, accs):
        merged = self.create_accumulator()
        for acc in accs:
            merged = self.add_input(merged, acc)
        return merged

    def extract_output(self, acc):
        counts, positions = acc
        return {item: counts[item] for item in sorted(positions, key=positions.__getitem__)}


_ORDERED = MergeOrderedItemCountsFn()
_COUNTS = MergeItemCountsFn()


def read_per_user(file_pattern: str, flush_pairs: int = DEFAULT_FLUSH_PAIRS
                  ) -> Dict[str, ItemCounts]:
    """All users of the matching files in memory, for the Beam-free core.

    ``{user_id: {item: count}}``, each user's dict in record order (files in
    sorted path order, then line order): the same per-user counts, in the
    same order, as ``ReadUserItems(file_pattern, keep_order=True)``.
    Malformed lines are skipped. Raises ValueError when nothing matches.
    """
    paths = match_files(file_pattern)
    if not paths:
        raise ValueError(f"no input file matches {file_pattern!r}")
    per_user: Dict[str, ItemCounts] = {}
    for path in paths:
        for kind, value in read_user_items(path, flush_pairs, opener=open_binary):
            if kind != "user":
                continue
            user, counts = value
            mine = per_user.get(user)
            if mine is None:
                per_user[user] = counts
            else:  # later parts append their new items after the earlier ones
                for item, c in counts.items():
                    mine[item] = mine.get(item, 0) + c
    return per_user


class _ReadFileDoFn(beam.DoFn):
    """A file → its users' partial counts packed by merge group (``pack_user_groups``:
    ``(group, pickled {user: counts})``, with ``(counts, positions)`` values when the
    element carries a file index) on the main output, and ``(line, n)`` per
    distinct malformed line on ``MALFORMED``."""

    MALFORMED = "malformed"

    def __init__(self, flush_pairs: int, envelope: bool = False,
                 user_groups: int = DEFAULT_READ_GROUPS):
        self._flush_pairs = flush_pairs
        self._envelope = envelope  # (tag, value) main outputs instead of TaggedOutput
        self._user_groups = user_groups
        self._malformed = beam.metrics.Metrics.counter("beam_dpsu", "malformed_lines")
        self._files = beam.metrics.Metrics.counter("beam_dpsu", "input_files")

    def _malformed_out(self, pending, malformed):
        for line in malformed:
            n = pending[line]
            self._malformed.inc(n)
            yield runners.tag((line, n), self.MALFORMED, self._envelope)

    def _packed_out(self, users, file_index, chunk):
        if file_index is not None:
            users = with_positions(users, file_index, chunk)
        for value in pack_user_groups(users, self._user_groups):
            yield runners.main_output(value, self._envelope)

    def _chunk_out(self, pending, file_index, chunk):
        users: Dict[str, ItemCounts] = {}
        yield from self._malformed_out(pending, group_line_counts(pending, users))
        yield from self._packed_out(users, file_index, chunk)

    def process(self, element):
        self._files.inc()
        file_index, path = element if isinstance(element, tuple) else (None, element)
        for chunk, pending in enumerate(iter_line_counts(path, self._flush_pairs, opener=open_binary)):
            yield from self._chunk_out(pending, file_index, chunk)


class _ReadFileCompleteDoFn(_ReadFileDoFn):
    """``(file_index, path, number of files)`` → per-user counts, as ``_ReadFileDoFn``,
    with the users of a whole input read at once on the ``COMPLETE`` output.

    When the input is ONE file, the reader accumulates its users (parsing the
    distinct lines every ``flush_pairs``, as always) and emits them only at
    the end of the file: every ``(user, counts)`` is then the user's complete
    data and goes to ``COMPLETE``, needing no merge. When the accumulated
    distinct lines would exceed ``complete_max_pairs``, or the input has
    several files (a user may be in several), users go to the main output as
    partial counts, to be merged per user. With ``keep_order`` a complete
    user's counts iterate in record order.
    """

    COMPLETE = "complete"

    def __init__(self, flush_pairs: int, complete_max_pairs: int, keep_order: bool,
                 envelope: bool = False, user_groups: int = DEFAULT_READ_GROUPS):
        super().__init__(flush_pairs, envelope, user_groups)
        self._complete_max_pairs = complete_max_pairs
        self._keep_order = keep_order

    def _users_out(self, users, file_index, chunk, complete):
        if complete:
            for value in users.items():
                yield runners.tag(value, self.COMPLETE, self._envelope)
        else:
            yield from self._packed_out(users, file_index, chunk)

    def process(self, element):
        self._files.inc()
        file_index, path, num_files = element
        if not self._keep_order:
            file_index = None
        whole = num_files == 1  # this call sees all of every user's lines
        held: Dict[str, ItemCounts] = {}  # the users accumulated so far (whole file)
        held_lines = 0
        chunk = 0
        with open_binary(path) as f:
            pending: collections.Counter = collections.Counter()
            for lines in iter_line_blocks(f):
                pending.update(lines)
                if len(pending) < self._flush_pairs:
                    continue
                users = held if whole else {}
                yield from self._malformed_out(pending, group_line_counts(pending, users))
                held_lines += len(pending)
                pending = collections.Counter()
                if whole and held_lines <= self._complete_max_pairs:
                    continue
                whole, held = False, {}  # too large to hold (or several files): merge
                yield from self._users_out(users, file_index, chunk, False)
                chunk += 1
            users = held if whole else {}
            yield from self._malformed_out(pending, group_line_counts(pending, users))
            yield from self._users_out(users, file_index, chunk, whole)


def _file_elements(paths: List[str], ordered: bool, counted: bool) -> list:
    """The readers' input elements for ``paths`` (sorted): ``(file index, path, number
    of files)`` when ``counted``, ``(file index, path)`` when ``ordered``, else the path."""
    if counted:
        return [(i, path, len(paths)) for i, path in enumerate(paths)]
    return list(enumerate(paths)) if ordered else list(paths)


class _ReadBlocksDoFn(beam.DoFn):
    """A file → ``(file_index, block number, raw block)``: decompression only."""

    def __init__(self, block_bytes: int):
        self._block_bytes = block_bytes
        self._files = beam.metrics.Metrics.counter("beam_dpsu", "input_files")

    def process(self, element):
        self._files.inc()
        file_index, path = element if isinstance(element, tuple) else (None, element)
        with open_binary(path) as f:
            for n, block in enumerate(iter_raw_blocks(f, self._block_bytes)):
                yield file_index, n, block


class _ParseBlockDoFn(_ReadFileDoFn):
    """A raw block → per-user partial counts (and malformed lines), as ``_ReadFileDoFn``
    does for a whole file; the block number orders the user's items with ``keep_order``."""

    def process(self, element):
        file_index, n, block = element
        yield from self._chunk_out(collections.Counter(block.split(b"\n")), file_index, n)


def match_files(pattern: str) -> List[str]:
    """The paths matching a file pattern (glob), sorted; empty when none match.

    A bare local name (no directory, e.g. ``out-items-*``) is matched as
    ``./out-items-*``: Beam's local filesystem finds nothing for it otherwise,
    which would hide a release file from the stale-output check.
    """
    return [path for path, _ in match_sized(pattern)]


def match_sized(pattern: str) -> List[Tuple[str, Optional[int]]]:
    """``(path, size in bytes as stored)`` of the files matching ``pattern``, sorted by
    path (as ``match_files``); the size is None where the filesystem reports none."""
    if "://" not in pattern and not os.path.dirname(pattern):
        pattern = os.path.join(os.curdir, pattern)
    result = FileSystems.match([pattern])[0]
    return sorted((m.path, m.size_in_bytes if isinstance(m.size_in_bytes, int)
                   and m.size_in_bytes >= 0 else None) for m in result.metadata_list)


def balanced_bins(sizes: Sequence[int], bins: int) -> List[int]:
    """The bin in ``[0, bins)`` of each of ``sizes`` (e.g. files' sizes in bytes as
    stored): largest first, each into the bin with the smallest total so far (on
    a tie, the one with the fewest sizes, then the lowest). This greedy rule
    (LPT) makes the largest total at most 4/3 of the best possible; sizes of 0
    (a filesystem that reports none) are dealt out in turn. ``bins`` >= 1."""
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be an integer >= 1, got {bins!r}")
    totals, counts = [0] * bins, [0] * bins
    out = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        b = min(range(bins), key=lambda b: (totals[b], counts[b], b))
        out[i] = b
        totals[b] += sizes[i]
        counts[b] += 1
    return out


def file_ranges(sized: Sequence[Tuple[str, Optional[int]]], elements: list,
                range_bytes: Optional[int]) -> Tuple[list, list]:
    """``(sized, elements)`` (one element per file of ``sized``, ``match_sized``'s ``(path,
    size)``, in its order; an element a path or ``(file index, path)``) with each file
    that is not compressed (``lines.is_compressed``) and larger than ``range_bytes``
    as one element per byte range (``lines.byte_ranges``): the path replaced by
    ``(path, start, end)`` (``end`` None for the last range: to the end of the file),
    its size by the range's. ``range_bytes`` None: as given (whole files)."""
    if range_bytes is None:
        return list(sized), list(elements)
    out_sized, out = [], []
    for (path, size), element in zip(sized, elements):
        ranges = [(0, None)] if is_compressed(path) else byte_ranges(size, range_bytes)
        if len(ranges) == 1:
            out_sized.append((path, size))
            out.append(element)
            continue
        for start, end in ranges:
            part = (path, start, end)
            out.append((element[0], part) if isinstance(element, tuple) else part)
            out_sized.append((path, (size if end is None else end) - start))
    return out_sized, out


def file_of(file) -> Tuple[str, int, Optional[int]]:
    """A read element's file (a path, or ``file_ranges``' ``(path, start, end)``) as
    ``(path, start, end)``: a whole file is ``(path, 0, None)``."""
    return (file, 0, None) if isinstance(file, str) else tuple(file)


def _match_dealt(pattern: str, workers: int, ordered: bool, counted: bool,
                 range_bytes: Optional[int] = None):
    """The matching files as ``(bin, element)``: ``balanced_bins`` of their sizes over
    ``workers`` bins, elements by ``_file_elements`` (with ``range_bytes``, a large
    uncompressed file's byte ranges, ``file_ranges``)."""
    sized = match_sized(pattern)
    elements = _file_elements([path for path, _ in sized], ordered, counted)
    sized, elements = file_ranges(sized, elements, range_bytes)
    bins = balanced_bins([size or 0 for _, size in sized], workers)
    return zip(bins, elements)


class _SpreadFiles(beam.PTransform):
    """The files matching a pattern, spread over the workers: one element per file
    (see ``_match_dealt`` for its form), after a ``Reshuffle``, or, on a runner
    that deals a ``GroupByKey``'s keys to its workers in turn
    (``runners.dealt_workers``: the multi-worker DirectRunner), in one group per
    worker whose files' sizes add up to about the same total (``balanced_bins``),
    so that a few large files do not all land on one worker. Which worker reads
    which file changes only the time a run takes. ``range_bytes``: each large
    uncompressed file is matched and cut into byte ranges when the pipeline runs
    (``file_ranges``), one element each; None: whole files."""

    def __init__(self, pattern: str, ordered: bool, counted: bool,
                 range_bytes: Optional[int] = None):
        super().__init__()
        if counted and range_bytes is not None:
            raise ValueError("a counted read (complete users) reads whole files")
        self._args = (pattern, ordered, counted, range_bytes)

    def expand(self, pbegin):
        pattern, ordered, counted, range_bytes = self._args
        workers = runners.dealt_workers(pbegin.pipeline)
        matched = (pbegin
                   | "Pattern" >> beam.Create([pattern])
                   | "MatchFiles" >> beam.FlatMap(_match_dealt, max(workers, 1), ordered,
                                                  counted, range_bytes))
        if workers > 1:
            return (matched
                    | "DealFiles" >> beam.GroupByKey()
                    | "Files" >> beam.FlatMap(lambda kv: kv[1]))
        return (matched
                | "DropBins" >> beam.Map(lambda kv: kv[1])
                | "SpreadFiles" >> beam.Reshuffle())


def input_files(pbegin, file_pattern: str, label: str = "Files", ordered: bool = False,
                range_bytes: Optional[int] = None):
    """The paths matching ``file_pattern`` as a PCollection spread over the workers:
    ``_SpreadFiles`` (matched when the pipeline runs) where the runner redistributes
    and the pattern matches several files now, or one that is cut into byte ranges;
    else matched now, in the launcher, and dealt into as many ``Create``s as the
    runner's read wants (``dealt_files``; a lone whole file needs no
    redistribution). Which worker reads which file changes only the time a run
    takes. ``ordered``: the elements are ``(file index, path)``, the index the
    file's place in the sorted list of matches (the record order of the input).
    ``range_bytes``: each uncompressed file larger than it is given as its byte
    ranges (``file_ranges``: ``(path, start, end)`` in place of the path; read with
    ``lines.read_range_blocks``), so that one large file is read by several
    workers; None (default): whole files."""
    sized = match_sized(file_pattern)
    paths = [p for p, _ in sized]
    if runners.capabilities(pbegin.pipeline).redistributes and (
            len(sized) != 1 or len(file_ranges(sized, paths, range_bytes)[1]) > 1):
        return pbegin | label >> _SpreadFiles(file_pattern, ordered, False, range_bytes)
    # Dask: matched and cut now, the ranges dealt as files are
    sized, elements = file_ranges(sized, _file_elements(paths, ordered, False), range_bytes)
    return dealt_files(pbegin, sized, elements, label)


def dealt_files(pbegin, sized: Sequence[Tuple[str, Optional[int]]], elements: list,
                label: str):
    """``elements`` (one per file of ``sized``, ``match_sized``'s ``(path, size)``, in
    its order) as one ``Create`` per partition the runner's read starts from
    (``runners.read_partitions``, at most ``MAX_FILE_PARTITIONS``), the files dealt
    by size (``balanced_bins``) and the ``Create``s joined by ``Flatten``. On a
    runner whose parallelism is the number of partitions a read starts from (Dask),
    every later stage has that many partitions. ``label``: the steps' labels
    (``label``, or ``label/0`` ... and ``label/Spread``)."""
    if len(sized) != len(elements):
        raise ValueError(f"{len(elements)} elements for {len(sized)} files")
    bins = runners.read_partitions(pbegin.pipeline, len(elements), MAX_FILE_PARTITIONS)
    if bins <= 1:
        return pbegin | label >> beam.Create(elements)
    which = balanced_bins([size or 0 for _, size in sized], bins)
    return (tuple(pbegin | f"{label}/{b}" >> beam.Create(
                [e for e, w in zip(elements, which) if w == b]) for b in range(bins))
            | f"{label}/Spread" >> beam.Flatten())


class ReadUserItems(beam.PTransform):
    """Text files of ``user_id<TAB>item`` lines → ``(user_id, {item: count})``.

    One output element per user, merging the user's lines across all files.
    Malformed lines are counted in the metric ``beam_dpsu/malformed_lines``;
    with ``with_malformed=True`` they are also returned::

        users, malformed = p | ReadUserItems(pattern, with_malformed=True)

    Args:
      file_pattern: a path or glob on any Beam filesystem (local, gs://, ...);
        ``.gz`` and ``.bz2`` files are decompressed. A UTF-8 byte-order mark
        at the start of a file is removed (once, at offset 0 of the file's
        decompressed text; anywhere else it stays part of the line), so it
        never becomes part of the first user id. User ids and items are
        ``str``.
      flush_pairs: a reader emits its partial per-user counts after this many
        distinct lines (bounds worker memory; default 1M). No privacy effect.
      keep_order: when True, each user's ``{item: count}`` iterates in the
        order the items first occur in the user's records (files in sorted
        path order, then line order), whatever the runner's bundling; this is
        what GW's ``tie_break='first-occurrence'`` reads. Costs a second
        per-user dict through the merge. Default False (the order of a
        user's dict is then unspecified). No privacy effect by itself.
      with_malformed: when True, the transform returns the pair ``(users,
        malformed)``, where ``malformed`` is a PCollection of ``(raw line
        bytes, number of occurrences)`` (e.g. for a dead-letter file). Default
        False: only ``users``. Privacy: the malformed lines are private input,
        never a release.

      split_files: when True, each file is only decompressed by the
        worker that reads it, into blocks of about ``block_bytes`` (8 MiB) of
        whole lines; the blocks are redistributed (``Reshuffle``) and counted
        and parsed in parallel, so even a single large file uses every worker
        for the expensive part (``collections.Counter`` and parsing; a
        block's distinct lines are then one partial aggregate, so
        ``flush_pairs`` does not apply). False reads, counts and parses each
        file in one DoFn call (default: nothing but the per-user partials is
        shuffled). Measured on one 6.4M-line file (``benchmarks/RESULTS.md``):
        on one worker True costs about 2% more time and 160 MiB more peak
        memory (the decompressed blocks pass through the shuffle); with two
        worker processes it was 2% faster, on a machine whose second core was
        busy. No privacy effect.
      complete_users: when True, the transform also returns the users it
        read whole, which need no merge: ``(users, complete)``, or ``(users,
        complete, malformed)`` with ``with_malformed``. Each user is then in
        exactly one of ``users`` and ``complete``, with one element.
        ``complete`` holds every user when the pattern matches ONE file whose
        distinct lines number at most ``complete_max_pairs`` (the reader then
        holds the whole file's distinct lines in memory, as the plain
        in-memory run does: about 800 MiB for the 4.4M distinct lines of
        100,000 synthetic users); otherwise it is empty and every user goes
        through the merge. A consumer that processes users one by one can
        take ``complete`` straight from the reader and skip the shuffle
        (``SelectPartitions`` accepts the pair with ``per_user=True``).
        Not with ``split_files``. No privacy effect (the same per-user counts).
      complete_max_pairs: see ``complete_users`` (default
        ``DEFAULT_COMPLETE_MAX_PAIRS``, 8M distinct lines).
      user_groups: the users' partial counts are merged in this many groups
        (``user_group``: a hash of the user id): each reader packs a chunk's
        users into one pickled ``{user: counts}`` per group, a ``GroupByKey``
        brings a group's packs together and one DoFn call merges them per user
        (``MergeUserGroups``). The shuffle then carries (file chunks × groups)
        opaque elements instead of one decoded dict per user and chunk, which
        is what the per-element cost of the Python SDK and of Beam's Dask
        runner made expensive. A worker holds one group's users while merging
        them (about users / ``user_groups``); raise it when a group would not
        fit in memory (default ``DEFAULT_READ_GROUPS``, 1024). No privacy
        effect (the same per-user counts).
      block_bytes: with ``split_files``, the size of a block of whole lines
        (default ``BLOCK_BYTES``, 8 MiB). No privacy effect.
      label: the transform's label (default: Beam's).

    Scaling: files are decompressed in parallel, one file per DoFn call, and
    their blocks parsed in parallel (``split_files``); a gzip file cannot be
    decompressed by several workers, so split a very large input into many
    files (as Beam's text sinks write it). On Beam's Dask runner, where a
    ``Reshuffle`` does not redistribute (``runners.Capabilities.redistributes``),
    the files are matched when the graph is built and dealt by size into two
    dask partitions per worker thread (``dealt_files``, ``runners.read_partitions``);
    every later stage keeps that many partitions, so there the parallelism is at
    most the number of input files (one file: one partition chain on one worker).
    """

    def __init__(self, file_pattern: str, flush_pairs: int = DEFAULT_FLUSH_PAIRS,
                 keep_order: bool = False, with_malformed: bool = False,
                 label: Optional[str] = None, split_files: bool = False,
                 block_bytes: int = BLOCK_BYTES, complete_users: bool = False,
                 complete_max_pairs: int = None, user_groups: int = DEFAULT_READ_GROUPS):
        super().__init__(label)
        if isinstance(user_groups, bool) or not isinstance(user_groups, int) or user_groups < 1:
            raise ValueError(f"user_groups must be an integer >= 1, got {user_groups!r}")
        self._user_groups = user_groups
        complete_max_pairs = (DEFAULT_COMPLETE_MAX_PAIRS if complete_max_pairs is None
                              else complete_max_pairs)
        if isinstance(complete_max_pairs, bool) or not isinstance(complete_max_pairs, int) \
                or complete_max_pairs < 1:
            raise ValueError(f"complete_max_pairs must be an integer >= 1, "
                             f"got {complete_max_pairs!r}")
        if complete_users and split_files:
            raise ValueError("complete_users needs split_files=False (a block is not a "
                             "user's complete data)")
        self._complete_users = bool(complete_users)
        self._complete_max_pairs = complete_max_pairs
        if not isinstance(file_pattern, str) or not file_pattern:
            raise ValueError(f"file_pattern must be a non-empty string, got {file_pattern!r}")
        self._pattern = local_absolute(file_pattern)  # the workers may run elsewhere
        self._flush_pairs = check_positive_int(flush_pairs, "flush_pairs")
        self._keep_order = check_flag(keep_order, "keep_order")
        self._with_malformed = check_flag(with_malformed, "with_malformed")
        self._split_files = check_flag(split_files, "split_files")
        self._block_bytes = check_positive_int(block_bytes, "block_bytes")

    def expand(self, pbegin):
        if self._complete_users:
            return self._expand_complete(pbegin)
        if runners.capabilities(pbegin.pipeline).redistributes:
            files = pbegin | "Files" >> _SpreadFiles(self._pattern, self._keep_order, False)
        else:  # Dask: one partition per Create (see _file_partitions)
            files = self._file_partitions(pbegin)
        if self._split_files:
            files = (files
                     | "ReadBlocks" >> beam.ParDo(_ReadBlocksDoFn(self._block_bytes))
                     | "SpreadBlocks" >> beam.Reshuffle())
            make_fn, label = _ParseBlockDoFn, "ParseBlocks"
        else:
            make_fn, label = _ReadFileDoFn, "ReadFiles"
        if runners.capabilities(pbegin.pipeline).tagged_outputs:
            outputs = files | label >> beam.ParDo(
                make_fn(self._flush_pairs, user_groups=self._user_groups)).with_outputs(
                    _ReadFileDoFn.MALFORMED, main="users")
            users, malformed = outputs.users, outputs[_ReadFileDoFn.MALFORMED]
        else:  # the runner mixes tagged outputs (Dask): one output of (tag, value)
            split = runners.split_envelopes(
                files | label >> beam.ParDo(make_fn(self._flush_pairs, True, self._user_groups)),
                "SplitOutputs", (None, _ReadFileDoFn.MALFORMED))
            users, malformed = split[None], split[_ReadFileDoFn.MALFORMED]
        # str user ids and items only: SelectPartitions(per_user=True) need not check them.
        users = mark_canonical_ids(users | "MergePerUser" >> MergeUserGroups(self._keep_order))
        return (users, malformed) if self._with_malformed else users

    def _expand_complete(self, pbegin):
        if runners.capabilities(pbegin.pipeline).redistributes:
            files = pbegin | "Files" >> _SpreadFiles(self._pattern, True, True)
        else:  # Dask: the read's partitions (see _file_partitions)
            files = self._file_partitions(pbegin, counted=True)
        complete_tag = _ReadFileCompleteDoFn.COMPLETE
        args = (self._flush_pairs, self._complete_max_pairs, self._keep_order)
        if runners.capabilities(pbegin.pipeline).tagged_outputs:
            outputs = files | "ReadFiles" >> beam.ParDo(_ReadFileCompleteDoFn(
                *args, user_groups=self._user_groups)).with_outputs(
                _ReadFileDoFn.MALFORMED, complete_tag, main="users")
            users, complete = outputs.users, outputs[complete_tag]
            malformed = outputs[_ReadFileDoFn.MALFORMED]
        else:  # the runner mixes tagged outputs (Dask): one output of (tag, value)
            split = runners.split_envelopes(
                files | "ReadFiles" >> beam.ParDo(_ReadFileCompleteDoFn(
                    *args, envelope=True, user_groups=self._user_groups)),
                "SplitOutputs", (None, _ReadFileDoFn.MALFORMED, complete_tag))
            users, complete = split[None], split[complete_tag]
            malformed = split[_ReadFileDoFn.MALFORMED]
        users = mark_canonical_ids(users | "MergePerUser" >> MergeUserGroups(self._keep_order))
        mark_canonical_ids(complete)
        return (users, complete, malformed) if self._with_malformed else (users, complete)

    def _file_partitions(self, pbegin, counted: bool = False):
        """The matching files, matched now (in the launcher) and dealt into
        ``Create``s (``dealt_files``), for a runner whose parallelism is the number of
        partitions the read starts from (``Capabilities.redistributes`` False: Dask).
        Elements as in the runtime match (``(file index, path)`` with ``keep_order``,
        ``(file index, path, number of files)`` when ``counted``), so the release is
        the same."""
        sized = match_sized(self._pattern)
        paths = [path for path, _ in sized]
        return dealt_files(pbegin, sized, _file_elements(paths, self._keep_order or counted,
                                                         counted), "Files")
