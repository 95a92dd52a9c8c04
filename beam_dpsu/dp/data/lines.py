"""The ``user_id<TAB>item`` text format, parsed as pure functions.

Format: one occurrence per line; the user id is everything before the FIRST
tab and the item everything after it (an item may contain further tabs). A
trailing ``\\r`` is removed. A UTF-8 byte-order mark (``EF BB BF``) at the
very start of a file is removed (``iter_raw_blocks``), so an editor that
writes one does not make ``'\\ufeffalice'`` a second user; a mark anywhere
else is kept. A line that has no tab, an empty user id, or is
not valid UTF-8 is malformed: it is skipped and counted, never a crash.
Files are read in large binary blocks cut at line ends; identical lines are
counted before they are parsed, so each distinct line is parsed once.
The Beam reader over these functions is ``beam_dpsu.transforms.textio``.
"""
from __future__ import annotations

import bz2
import collections
import functools
import gzip
import io
import queue
import re
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from beam_dpsu.dp.data.contribution import DEFAULT_FLUSH_PAIRS, ItemCounts, pack_by, user_group


__all__ = ["gzip_reader", "open_local_binary", "BLOCK_BYTES", "UTF8_BOM",
           "iter_line_blocks", "iter_raw_blocks", "read_blocks", "block_buffers",
           "RANGE_BYTES", "is_compressed", "byte_ranges", "read_range_blocks",
           "read_ahead", "parse_line", "group_line_counts", "read_user_items",
           "iter_line_counts", "pack_user_groups", "with_positions", "SNIFF_BYTES",
           "sniff_lines", "first_extra_column", "column_runs", "MIN_RUNS", "looks_swapped",
           "sniff_head", "not_text_reason"]


try:  # the ``fast`` extra: ISA-L's inflate (python-isal), the same bytes as zlib's
    from isal import igzip as _gzip
except ImportError:
    _gzip = gzip


def gzip_reader(fileobj):
    """``fileobj`` (binary, readable) decompressed as gzip: the same bytes and the same
    errors (``gzip.BadGzipFile``, ``EOFError``) as ``gzip.GzipFile``, through
    python-isal's ``igzip`` when it is installed (the ``fast`` extra; about 3.5 times
    less CPU than zlib), else through ``gzip``. Every read path's one gzip reader."""
    return _gzip.GzipFile(fileobj=fileobj, mode="rb")


#: The names' endings of the files the readers decompress (``is_compressed``).
COMPRESSED_SUFFIXES = (".gz", ".bz2")


def is_compressed(path: str) -> bool:
    """Whether the readers decompress ``path`` (its name ends in ``.gz`` or ``.bz2``): such
    a file is read whole, from its start, never in byte ranges (``byte_ranges``)."""
    return path.endswith(COMPRESSED_SUFFIXES)


def open_local_binary(path: str):
    """Opens a local file for binary reading, decompressing ``.gz`` and ``.bz2`` by suffix."""
    if path.endswith(".gz"):
        return _gzip.open(path, "rb")  # gzip_reader's module, owning the file
    if path.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


#: The size of the blocks a file is read in.
BLOCK_BYTES = 8 << 20

#: The size of the byte ranges an uncompressed file larger than it is read in, one
#: range per task (``byte_ranges``), so that one large file is read by several workers.
RANGE_BYTES = 64 << 20

#: The UTF-8 byte-order mark, removed at the start of a file.
UTF8_BOM = b"\xef\xbb\xbf"


def iter_line_blocks(f, block_bytes: int = BLOCK_BYTES) -> Iterator[List[bytes]]:
    """Yields lists of complete lines (without ``\\n``) read in large blocks."""
    for block in iter_raw_blocks(f, block_bytes):
        yield block.split(b"\n")


#: ``read_ahead``: the blocks a reader thread may hold ready beyond the one in use.
READ_AHEAD_BLOCKS = 1


def read_ahead(blocks: Iterator[Any], depth: int = READ_AHEAD_BLOCKS) -> Iterator[Any]:
    """Yields the items of ``blocks``, in order, produced by a reader thread up to
    ``depth`` items ahead of the consumer.

    Decompressing and reading a file (``zlib``, ``bz2``, a file system's stream)
    release the GIL, so the next block is read while the caller works on the
    current one; at most ``depth + 2`` blocks are held (the one in use, ``depth``
    ready, one being read). An exception raised by
    ``blocks`` is raised here, to the consumer, when it reaches that point. When the
    consumer stops early (an exception, ``close()``), the reader thread is stopped
    and joined before this generator returns, so the caller may then close the
    file it reads: close the generator before the file (``contextlib.closing``). Results and their order are those of ``blocks`` itself."""
    if depth < 1:
        raise ValueError(f"depth must be at least 1; got {depth}")
    ready: "queue.Queue[Tuple[bool, Any]]" = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for block in blocks:
                if not put((False, block)):
                    return
        except BaseException as error:  # handed to the consumer, raised there
            put((True, error))
            return
        put((True, None))

    reader = threading.Thread(target=produce, name="beam-dpsu-read-ahead", daemon=True)
    reader.start()
    try:
        while True:
            done, value = ready.get()
            if done:
                if value is not None:
                    raise value
                return
            yield value
    finally:
        stop.set()
        interrupted = None
        while reader.is_alive():  # a second Ctrl-C must not leave the reader in the file
            try:
                reader.join()
            except KeyboardInterrupt as error:
                interrupted = error
        if interrupted is not None:
            raise interrupted


def iter_raw_blocks(f, block_bytes: int = BLOCK_BYTES) -> Iterator[bytes]:
    """Yields the file's bytes in blocks of about ``block_bytes`` that end at a line end
    (the ``\\n`` itself is dropped; the last block may lack it).

    ``f`` is read from its start: a UTF-8 byte-order mark (``UTF8_BOM``) at
    offset 0 is removed, once. Every read path of the library (``ReadUserItems``
    whole files, ``split_files`` blocks and ``complete_users``; ``read_user_items``;
    the columnar path through ``read_blocks``, the same blocks without copies) goes
    through the blocks of this function."""
    for view in _block_views(f, block_bytes, [None]):
        yield bytes(view)


def read_blocks(f, block_bytes: int = BLOCK_BYTES, depth: int = READ_AHEAD_BLOCKS,
                buffers: Optional[List[Optional[bytearray]]] = None,
                at_start: bool = True) -> Iterator[memoryview]:
    """``iter_raw_blocks``' blocks, read by a reader thread (``read_ahead``) into
    ``depth + 2`` buffers used in turn: each is a read-only ``memoryview`` into a
    buffer that the reader may fill again as soon as the consumer asks for the next
    block. So the consumer must be done with a block (and hold nothing that views
    it: copy what outlives it) when it asks for the next one.

    The same bytes as ``iter_raw_blocks`` without a new 8 MiB object per block:
    where pages of freed large objects go back to the system (Dask's workers set
    ``MALLOC_TRIM_THRESHOLD_``), each new one is faulted in anew, a page at a time.
    ``buffers``: ``block_buffers(depth)``'s ``depth + 2`` slots (None or a buffer,
    filled and replaced here) that a reader keeps from file to file, so that its
    buffers are allocated once; the next file may start once this generator is closed (its
    reader thread joined) and its last block dropped. None: new buffers.
    ``at_start``: ``f`` is read from the file's first byte, so a byte-order mark
    there is removed (default True; False for a stream that starts at a line within
    the file, ``read_range_blocks``). As with ``read_ahead``, close this generator
    before the file."""
    if buffers is None:
        buffers = block_buffers(depth)
    elif len(buffers) != depth + 2:
        raise ValueError(f"read_blocks needs depth + 2 = {depth + 2} buffers; got "
                         f"{len(buffers)}")
    return read_ahead(_block_views(f, block_bytes, buffers, at_start), depth)


def block_buffers(depth: int = READ_AHEAD_BLOCKS) -> List[Optional[bytearray]]:
    """The ``depth + 2`` empty slots of ``read_blocks``' buffers, for a reader to keep
    from file to file (``read_blocks(..., buffers=...)``)."""
    return [None] * (depth + 2)


#: ``read_blocks``: the bytes asked of a file object per call. Small enough that a
#: decompressor's output is ordinary heap memory (below glibc's 128 KiB mmap
#: threshold), not pages mapped and faulted in for every call.
READ_CHUNK = 64 << 10


def _read_into(f, view: memoryview) -> int:
    """Fills ``view`` from ``f`` (``readinto`` where it has one, else ``read``) in
    pieces of at most ``READ_CHUNK``; returns the bytes read, fewer than
    ``len(view)`` only at the end of the file."""
    readinto = getattr(f, "readinto", None)
    done = 0
    while done < len(view):
        piece = view[done:done + READ_CHUNK]
        if readinto is not None:
            try:
                got = readinto(piece) or 0
            except (NotImplementedError, io.UnsupportedOperation):  # a stream with read only
                readinto = None
                continue
        else:
            data = f.read(len(piece))
            got = len(data)
            piece[:got] = data
        if not got:
            break
        done += got
    return done


def _block_views(f, block_bytes: int, pool: List[Optional[bytearray]],
                 at_start: bool = True) -> Iterator[memoryview]:
    """The blocks of ``iter_raw_blocks`` as read-only views into the buffers of
    ``pool`` used in turn (a view is overwritten when ``len(pool)`` more blocks
    have been read); an empty slot, or a buffer too small for a block, is
    replaced by a new buffer (never resized: views may hold it). Each block holds
    the text left after the previous one's last line end (copied to the front of
    its buffer), then ``block_bytes`` more, cut after its last line end; without
    one, ``block_bytes`` more again (a larger buffer). ``at_start``: ``f`` starts at
    the file's first byte (a byte-order mark there is removed)."""
    buffers = len(pool)
    if block_bytes < 1 or buffers < 1:
        raise ValueError(f"block_bytes and buffers must be at least 1; got "
                         f"{block_bytes}, {buffers}")
    rest = b""  # the text after the last line end read so far
    first = at_start  # the block starts at offset 0 of the file
    turn = 0
    while True:
        target = len(rest) + block_bytes
        buf = pool[turn]
        if buf is None or len(buf) < target:  # room for the text left by later blocks
            buf = pool[turn] = bytearray(target + target // 4)
        view = memoryview(buf)
        view[:len(rest)] = rest
        end = len(rest)  # the bytes in the buffer
        searched = end  # ``rest`` holds no line end
        while True:
            if len(buf) < target:  # a longer line: a larger buffer, the text copied
                bigger = bytearray(max(target, 2 * len(buf)))
                bigger[:end] = view[:end]
                buf = pool[turn] = bigger
                view = memoryview(buf)
            got = _read_into(f, view[end:target])
            end += got
            if first and got and end < len(UTF8_BOM) and UTF8_BOM.startswith(view[:end]):
                target = end + block_bytes  # too short to tell a mark: read on
                continue
            cut = buf.rfind(b"\n", searched, end)
            if cut >= 0 or end < target:  # a line end, or the end of the file
                break
            searched = end
            target = end + block_bytes
        skip = len(UTF8_BOM) if first and view[:len(UTF8_BOM)] == UTF8_BOM else 0
        if cut < 0:  # the end of the file, no line end since the last one
            if end > skip:
                yield view[skip:end].toreadonly()
            return
        first = False
        rest = bytes(view[cut + 1:end])
        yield view[skip:cut].toreadonly()
        turn = (turn + 1) % buffers


def byte_ranges(size: Optional[int], range_bytes: int = RANGE_BYTES
                ) -> List[Tuple[int, Optional[int]]]:
    """The byte ranges ``[start, end)`` an uncompressed file of ``size`` bytes is read in
    (``read_range_blocks``), one task each: ``range_bytes`` each from offset 0, the
    last one open (``end`` None: to the end of the file as it is when read). One range
    ``(0, None)``, the whole file, when ``size`` is at most ``range_bytes`` or unknown
    (None). Every line of the file is in exactly one range (the one its first byte is
    in), whatever the ranges' bounds."""
    if isinstance(range_bytes, bool) or not isinstance(range_bytes, int) or range_bytes < 1:
        raise ValueError(f"range_bytes must be an integer >= 1, got {range_bytes!r}")
    if size is None or size <= range_bytes:
        return [(0, None)]
    starts = list(range(0, size, range_bytes))
    return [(s, s + range_bytes) for s in starts[:-1]] + [(starts[-1], None)]


def read_range_blocks(f, start: int, end: Optional[int], block_bytes: int = BLOCK_BYTES,
                      depth: int = READ_AHEAD_BLOCKS,
                      buffers: Optional[List[Optional[bytearray]]] = None
                      ) -> Tuple[int, Iterator[memoryview]]:
    """The lines of the byte range ``[start, end)`` of an uncompressed file ``f`` (open
    at its first byte, binary), as ``read_blocks``' blocks: ``(offset, blocks)``, the
    offset in the file's text (the file less a byte-order mark at its start, the
    offsets of ``iter_raw_blocks``' whole-file read) of the first block's first byte.

    The range holds exactly the lines whose first byte is in ``[start, end)`` (``end``
    None: to the end of the file): for ``start`` > 0 the line that holds byte
    ``start - 1`` is left to the range before (read up to its line end), and the
    range's last line is the one that holds byte ``end - 1``, read to its line end
    past ``end``. So ranges that tile the file (``byte_ranges``) give each line once,
    with the bytes, blocks' line splits and text offsets of the whole-file read; a
    byte-order mark is removed only at offset 0. ``f`` is moved with ``seek`` (read
    through where it cannot seek). Close ``blocks`` before the file (``read_blocks``)."""
    if start < 0 or (end is not None and end <= start):
        raise ValueError(f"a byte range needs 0 <= start < end; got [{start}, {end})")
    if start == 0:
        stream = f if end is None else _RangeStream(f, b"", 0, end)
        return 0, read_blocks(stream, block_bytes, depth, buffers)
    head = _read_up_to(f, len(UTF8_BOM))
    mark = len(UTF8_BOM) if head == UTF8_BOM else 0
    if start - 1 < len(head):
        pending = head[start - 1:]
    else:
        _skip_to(f, start - 1, len(head))
        pending = b""
    at = start - 1  # the file offset of pending's first byte
    while True:  # to the end of the line that holds byte start - 1
        cut = pending.find(b"\n")
        if cut >= 0:
            break
        at += len(pending)
        pending = f.read(READ_CHUNK)
        if not pending:  # no line starts in the range: nothing
            return 0, _no_blocks()
    first = at + cut + 1  # the first line that starts at or after start
    if end is not None and first >= end:
        return 0, _no_blocks()
    stream = _RangeStream(f, pending[cut + 1:], first, end)
    return first - mark, read_blocks(stream, block_bytes, depth, buffers, at_start=False)


def _no_blocks() -> Iterator[memoryview]:
    """No block (a generator, closed as ``read_blocks``' are)."""
    return
    yield


def _read_up_to(f, n: int) -> bytes:
    """Up to ``n`` bytes of ``f`` (fewer only at its end)."""
    data = b""
    while len(data) < n:
        more = f.read(n - len(data))
        if not more:
            break
        data += more
    return data


def _skip_to(f, offset: int, here: int) -> None:
    """Moves ``f`` (at offset ``here``) to ``offset``: a seek, or reads where it has none."""
    try:
        if f.seekable():
            f.seek(offset)
            return
    except (AttributeError, OSError, io.UnsupportedOperation):
        pass
    left = offset - here
    while left > 0:
        got = len(f.read(min(left, READ_CHUNK)))
        if not got:
            return
        left -= got


class _RangeStream:
    """A binary stream of a file from ``pos`` (its bytes read from ``f``, after the
    already read ``prefix``) up to the end of the line that holds byte ``end - 1``
    (``end`` None: to the end of the file): ``readinto`` and ``read`` for
    ``_read_into``."""

    def __init__(self, f, prefix: bytes, pos: int, end: Optional[int]):
        self._f, self._prefix, self._pos, self._end = f, prefix, pos, end
        self._done = False

    def readinto(self, view) -> int:
        view = memoryview(view).cast("B")
        if self._done or not len(view):
            return 0
        n = len(view)
        before = self._end is not None and self._pos < self._end
        if before:
            n = min(n, self._end - self._pos)
        got = self._fill(view[:n])
        if not got:
            self._done = True
            return 0
        if self._end is not None:
            if not before:  # past end: up to the first line end
                cut = bytes(view[:got]).find(b"\n")
                if cut >= 0:
                    got, self._done = cut + 1, True
            elif self._pos + got == self._end and view[got - 1] == 0x0A:
                self._done = True  # byte end - 1 ends the range's last line
        self._pos += got
        return got

    def read(self, n: int = -1) -> bytes:
        buf = bytearray(READ_CHUNK if n is None or n < 0 else n)
        got = self.readinto(buf)
        return bytes(buf[:got])

    def _fill(self, view) -> int:
        if self._prefix:
            k = min(len(view), len(self._prefix))
            view[:k] = self._prefix[:k]
            self._prefix = self._prefix[k:]
            return k
        return _read_into(self._f, view)


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
                    block_bytes: int = BLOCK_BYTES, file_index: Optional[int] = None,
                    opener: Optional[Callable[[str], Any]] = None
                    ) -> Iterator[Tuple[str, Any]]:
    """Reads one file; yields ``('user', (user_id, counts))`` and ``('malformed', (line, n))``.

    Users may be yielded more than once (after a flush); merge their counts.
    Each ``counts`` dict iterates in the order the user's items first occur
    in the part of the file it covers.

    With ``file_index`` (the file's place in the sorted list of input files)
    the value is ``(counts, positions)`` instead: ``positions[item]`` is an
    integer that orders the user's items by where they first occur in the
    whole input (file index, then place in the file); merge with
    ``MergeOrderedItemCountsFn``. ``opener``: ``path -> binary file`` (default
    ``open_local_binary``; the Beam reader passes one for any Beam filesystem).
    """
    for chunk, pending in enumerate(iter_line_counts(path, flush_pairs, block_bytes, opener)):
        yield from _drain(pending, file_index, chunk)


def iter_line_counts(path: str, flush_pairs: int = DEFAULT_FLUSH_PAIRS,
                     block_bytes: int = BLOCK_BYTES,
                     opener: Optional[Callable[[str], Any]] = None
                     ) -> Iterator[collections.Counter]:
    """The file's lines counted in chunks: a ``Counter`` of distinct lines each time
    it reaches ``flush_pairs`` entries, then the rest (always at least one)."""
    with (opener or open_local_binary)(path) as f:
        pending: collections.Counter = collections.Counter()
        for lines in iter_line_blocks(f, block_bytes):
            pending.update(lines)
            if len(pending) >= flush_pairs:
                yield pending
                pending = collections.Counter()
        yield pending


def _drain(pending: Dict[bytes, int], file_index: Optional[int] = None, chunk: int = 0):
    users: Dict[str, ItemCounts] = {}
    malformed = group_line_counts(pending, users)
    for line in malformed:
        yield "malformed", (line, pending[line])
    if file_index is None:
        for user, counts in users.items():
            yield "user", (user, counts)
        return
    # A user's dict is in first-occurrence order within this chunk (the
    # Counter keeps the order lines first appear); chunks follow each other.
    for value in with_positions(users, file_index, chunk).items():
        yield "user", value


def pack_user_groups(users: Dict[str, Any], groups: int) -> Iterator[Tuple[int, bytes]]:
    """``{user: value}`` → ``(group, pickled {user: value} of that group)`` per non-empty
    group: a reader's partial counts as a few opaque elements, which a runner's
    shuffle moves and groups without decoding the per-user dicts."""
    return pack_by(users, functools.partial(user_group, groups=groups))


def with_positions(users: Dict[str, ItemCounts], file_index: int, chunk: int
                   ) -> Dict[str, Tuple[ItemCounts, Dict[str, int]]]:
    """Each user's counts with the positions that order its items in the whole input
    (``file_index``, then ``chunk``, then first occurrence in the chunk): the
    partial value ``MergeOrderedItemCountsFn`` merges."""
    base = (file_index << 64) | (chunk << 32)
    return {user: (counts, {item: base | i for i, item in enumerate(counts)})
            for user, counts in users.items()}


# --------------------------------------------------------------------------
# The column checks the command lines make before reading (docs/guide.md, "Input").
# --------------------------------------------------------------------------

#: How much of the first input file the command lines read to check its columns.
SNIFF_BYTES = 1 << 20


def sniff_lines(path: str, size: int = SNIFF_BYTES) -> List[bytes]:
    """The complete lines among the first ``size`` bytes of a local file (decompressed;
    a byte-order mark at the start removed, carriage returns kept as the readers do)."""
    with open_local_binary(path) as f:
        data = f.read(size + 1)
    if data.startswith(UTF8_BOM):
        data = data[len(UTF8_BOM):]
    lines = data.split(b"\n")
    if len(data) > size:
        lines = lines[:-1]  # the last one may be cut
    return [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines if ln]


def sniff_head(path: str, size: int = SNIFF_BYTES) -> bytes:
    """The first ``size`` bytes of a local file as the readers see them (decompressed)."""
    with open_local_binary(path) as f:
        return f.read(size)


#: Signatures of compressed or binary formats: (a pattern of the leading bytes, what they
#: are). Each pattern holds a byte that text lines do not (a control byte, or bzip2's
#: whole block magic), so a text line that merely starts like one ("BZhang", "PAR1",
#: "%PDF") is not refused.
_SIGNATURES = tuple((re.compile(pattern, re.S), what) for pattern, what in (
    (rb"\x1f\x8b", "gzip-compressed (name it .gz)"),
    (rb"BZh[1-9]1AY&SY", "bzip2-compressed"), (rb"PK\x03\x04", "a zip archive"),
    (rb"\xfd7zXZ\x00", "xz-compressed"), (rb"\x28\xb5\x2f\xfd", "zstd-compressed"),
    (rb"PAR1[\x00-\x08\x0b\x0c\x0e-\x1f\x80-\xff]", "a Parquet file"),
    (rb"\x89PNG", "a PNG image"),
    (rb"%PDF-\d\.\d\s*[\r\n]+%[\x80-\xff]", "a PDF document")))


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def not_text_reason(head: bytes) -> Optional[str]:
    """Why the first bytes of an input (as the readers see them) cannot be UTF-8 text
    lines, or None: a known compressed or binary format's signature; a tenth of the
    bytes NUL (binary, or UTF-16); or most lines not UTF-8 (binary, or another
    encoding). A few odd lines are not refused: the readers skip them as malformed."""
    for signature, what in _SIGNATURES:
        if signature.match(head):
            return f"it is {what}"
    if not head:
        return None
    if head.count(0) * 10 > len(head):
        return "a tenth of its bytes are NUL: it is binary or UTF-16, not UTF-8 text"
    lines = head.split(b"\n")[:-1]                # the last one may be cut: not judged
    if lines:
        bad = sum(not _utf8(line) for line in lines)
        if bad * 2 > len(lines):
            return (f"{bad} of its first {len(lines)} lines are not UTF-8: it is binary, or "
                    f"text in another encoding (convert it, e.g. iconv -t utf-8)")
    elif not any(_utf8(head[:len(head) - cut]) for cut in range(4)):
        return "it is not UTF-8: binary, or text in another encoding"
    return None


def first_extra_column(lines: Sequence[bytes]) -> Optional[int]:
    """The index of the first line with more than two tab-separated fields, or None.
    Such a line's item would be everything after the first tab, tabs included."""
    for k, line in enumerate(lines):
        if line.count(b"\t") > 1:
            return k
    return None


def column_runs(lines: Sequence[bytes]) -> Tuple[float, float]:
    """The mean run length of each column's values in line order: (users, items).
    A user's lines usually come together (a run per user), an item's seldom."""
    users, items = [], []
    for line in lines:
        user, tab, item = line.partition(b"\t")
        if tab:
            users.append(user)
            items.append(item)
    if not users:
        return 1.0, 1.0

    def runs(values):
        changes = sum(1 for a, b in zip(values, values[1:]) if a != b)
        return len(values) / (changes + 1)

    return runs(users), runs(items)


#: ``looks_swapped`` needs at least this many runs of the second column to judge.
MIN_RUNS = 20


def looks_swapped(lines: Sequence[bytes]) -> bool:
    """Whether the columns look swapped: the second column comes in runs (at least
    ``MIN_RUNS`` of them, 3 lines long on average and twice the first column's) as a
    user's lines do, while the first changes from line to line. Measured on the five
    datasets of the project and the generator's data: the user column's mean run is 5 to
    165 lines and the item column's 1.0 to 1.02, so a file in user order is never taken
    for a swapped one; a file in no order gives no signal and passes. A file sorted by
    item looks the same as a swapped one: its owner says so with ``--trust-columns``."""
    user_runs, item_runs = column_runs(lines)
    runs = len(lines) / item_runs
    return runs >= MIN_RUNS and item_runs >= 3.0 and item_runs >= 2.0 * user_runs
