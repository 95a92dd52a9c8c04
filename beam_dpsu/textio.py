"""Reading ``user_id<TAB>item`` text files straight into per-user item counts.

``ReadUserItems(pattern)`` is the fast path for text input: each file is read
inside one DoFn call in large binary blocks, identical lines are counted with
``collections.Counter`` (in C), and only the distinct lines are parsed and
grouped per user before the first shuffle. This avoids the per-element cost of
the Python SDK for every occurrence (``ReadFromText`` followed by a map costs
several times as much on the same data).

Format: one occurrence per line, ``user_id<TAB>item``; the user id is
everything before the first tab and the item everything after it (an item may
contain further tabs). A trailing ``\\r`` is removed. Files ending in ``.gz``
or ``.bz2`` are decompressed. A line that has no tab, an empty user id, or is
not valid UTF-8 is malformed: it is skipped and counted in the metric
``beam_dpsu/malformed_lines``, never a crash.
"""
from __future__ import annotations

import bz2
import collections
import gzip
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_dpsu.bounding import DEFAULT_FLUSH_PAIRS, ItemCounts, MergeItemCountsFn

BLOCK_BYTES = 8 << 20


def open_binary(path: str):
    """Opens ``path`` (any Beam filesystem) for binary reading, decompressing by suffix."""
    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if path.endswith(".bz2"):
        return bz2.BZ2File(raw, mode="rb")
    return raw


def iter_line_blocks(f, block_bytes: int = BLOCK_BYTES) -> Iterator[List[bytes]]:
    """Yields lists of complete lines (without ``\\n``) read in large blocks."""
    rest = b""
    while True:
        block = f.read(block_bytes)
        if not block:
            break
        if rest:
            block = rest + block
        cut = block.rfind(b"\n")
        if cut < 0:
            rest = block
            continue
        rest = block[cut + 1:]
        yield block[:cut].split(b"\n")
    if rest:
        yield [rest]


def parse_line(line: bytes) -> Optional[Tuple[str, str]]:
    """``b'user<TAB>item'`` → ``('user', 'item')``, or None when malformed."""
    if line.endswith(b"\r"):
        line = line[:-1]
    tab = line.find(b"\t")
    if tab <= 0:
        return None
    try:
        return line[:tab].decode("utf-8"), line[tab + 1:].decode("utf-8")
    except UnicodeDecodeError:
        return None


def group_line_counts(line_counts: Dict[bytes, int], out: Dict[str, ItemCounts]) -> List[bytes]:
    """Parses distinct lines with their multiplicities into ``out`` (user → counts).

    Returns the malformed lines (each once; their multiplicity is in
    ``line_counts``). The common case (all lines valid UTF-8, no carriage
    returns) decodes every line in one call and parses with ``str.partition``;
    otherwise each line goes through ``parse_line``.
    """
    keys = list(line_counts)
    try:
        text = b"\n".join(keys).decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\r" in text:
        return _group_slow(keys, line_counts, out)
    malformed = []
    get_user = out.get
    for raw, line, n in zip(keys, text.split("\n"), line_counts.values()):
        user, tab, item = line.partition("\t")
        if not (tab and user):
            malformed.append(raw)
            continue
        counts = get_user(user)
        if counts is None:
            out[user] = {item: n}
        else:
            counts[item] = counts.get(item, 0) + n
    return malformed


def _group_slow(keys: List[bytes], line_counts: Dict[bytes, int],
                out: Dict[str, ItemCounts]) -> List[bytes]:
    malformed = []
    for line in keys:
        n = line_counts[line]
        parsed = parse_line(line)
        if parsed is None:
            malformed.append(line)
            continue
        user, item = parsed
        counts = out.get(user)
        if counts is None:
            out[user] = {item: n}
        else:
            counts[item] = counts.get(item, 0) + n
    return malformed


def read_user_items(path: str, flush_pairs: int = DEFAULT_FLUSH_PAIRS,
                    block_bytes: int = BLOCK_BYTES
                    ) -> Iterator[Tuple[str, Any]]:
    """Reads one file; yields ``('user', (user_id, counts))`` and ``('malformed', (line, n))``.

    Users may be yielded more than once (after a flush); merge their counts.
    """
    with open_binary(path) as f:
        pending: collections.Counter = collections.Counter()
        for lines in iter_line_blocks(f, block_bytes):
            pending.update(lines)
            if len(pending) >= flush_pairs:
                yield from _drain(pending)
                pending = collections.Counter()
        yield from _drain(pending)


def _drain(pending: Dict[bytes, int]):
    users: Dict[str, ItemCounts] = {}
    malformed = group_line_counts(pending, users)
    for line in malformed:
        yield "malformed", (line, pending[line])
    for user, counts in users.items():
        yield "user", (user, counts)


class _ReadFileDoFn(beam.DoFn):
    MALFORMED = "malformed"

    def __init__(self, flush_pairs: int):
        self._flush_pairs = flush_pairs
        self._malformed = beam.metrics.Metrics.counter("beam_dpsu", "malformed_lines")
        self._files = beam.metrics.Metrics.counter("beam_dpsu", "input_files")

    def process(self, path):
        self._files.inc()
        for kind, value in read_user_items(path, self._flush_pairs):
            if kind == "user":
                yield value
            else:
                self._malformed.inc(value[1])
                yield beam.pvalue.TaggedOutput(self.MALFORMED, value)


def match_files(pattern: str) -> List[str]:
    """The paths matching a file pattern (glob), sorted; empty when none match."""
    result = FileSystems.match([pattern])[0]
    return sorted(m.path for m in result.metadata_list)


class ReadUserItems(beam.PTransform):
    """Text files of ``user_id<TAB>item`` lines → ``(user_id, {item: count})``.

    One output element per user, merging the user's lines across all files.
    Malformed lines are counted in the metric ``beam_dpsu/malformed_lines`` and
    are available as the tagged output ``malformed`` of ``read_with_malformed``.

    Args:
      file_pattern: a path or glob on any Beam filesystem (local, gs://, ...);
        ``.gz`` and ``.bz2`` files are decompressed.
      flush_pairs: a reader emits its partial per-user counts after this many
        distinct lines (bounds worker memory; default 1M). No privacy effect.

    Scaling: files are read in parallel, one file per DoFn call; split a large
    input into many files (as Beam's text sinks write it) to use many workers.
    """

    def __init__(self, file_pattern: str, flush_pairs: int = DEFAULT_FLUSH_PAIRS,
                 label: Optional[str] = None):
        super().__init__(label)
        if not isinstance(file_pattern, str) or not file_pattern:
            raise ValueError(f"file_pattern must be a non-empty string, got {file_pattern!r}")
        if isinstance(flush_pairs, bool) or not isinstance(flush_pairs, int) or flush_pairs < 1:
            raise ValueError(f"flush_pairs must be an integer >= 1, got {flush_pairs!r}")
        self._pattern = file_pattern
        self._flush_pairs = flush_pairs
        self.malformed = None

    def expand(self, pbegin):
        outputs = (pbegin
                   | "Pattern" >> beam.Create([self._pattern])
                   | "MatchFiles" >> beam.FlatMap(match_files)
                   | "SpreadFiles" >> beam.Reshuffle()
                   | "ReadFiles" >> beam.ParDo(_ReadFileDoFn(self._flush_pairs)).with_outputs(
                       _ReadFileDoFn.MALFORMED, main="users"))
        self.malformed = outputs[_ReadFileDoFn.MALFORMED]
        return outputs.users | "MergePerUser" >> beam.CombinePerKey(MergeItemCountsFn())
