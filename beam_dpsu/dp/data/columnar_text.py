"""A block of ``user<TAB>item`` text as arrays, and strings as byte spans.

The first step of the columnar path (``dp.data.columnar``), on numpy and Arrow arrays
(``pyarrow``, a dependency of Beam), never Python objects per line:

* ``parse_block``: the lines of a block → where each well-formed line's user id
  and item lie in the block's bytes (``ParsedBlock``; on demand, two Arrow string
  arrays), and the malformed lines, with exactly the semantics of
  ``dp.data.lines.parse_line`` (split at the FIRST tab, one trailing ``\\r``
  removed, an empty user id, no tab or invalid UTF-8 is malformed);
* strings as spans of bytes: their exact dictionary encoding (``encode_spans``,
  ``encode_strings``), gathered into Arrow (``gather_spans``), read back as spans
  (``string_spans``) and spread over groups by a public hash (``string_groups``);
  a block's users by group (``users_by_group``);
* ids that are not plain strings, as strings with the same identities
  (``id_strings``, ``from_id_string``), and pairs given as two string arrays
  (``arrays_block``);
* the position of a line in the whole input, the record order (``line_position``).

Identity is exact: users and items are compared as strings wherever they meet
(Arrow's dictionary encoding, or ``encode_spans`` on a block's bytes), never through
a hash. ``string_groups`` only chooses the group of a user or the shard of an item
to spread work (a collision there only puts two users in one group). The compiled
``encode_spans`` places strings by FNV-1a started from a per-process random value
(``_TABLE_BASIS``), so that crafted user ids cannot pile up in one probe chain.
"""
from __future__ import annotations

import ast
import collections
import functools
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_dpsu.dp.randomness import compiled
from beam_dpsu.dp.randomness.buffers import Scratch, empty
from beam_dpsu.dp.data.contribution import canonical_id
from beam_dpsu.dp.randomness.noise import encode_value
from beam_dpsu.dp.randomness.siphash import siphash24_many

__all__ = ["work_array", "ParsedBlock", "count_byte", "parse_block", "encode_spans",
           "gather_spans", "string_spans", "string_groups", "encode_strings", "ID_ESCAPE",
           "id_strings", "from_id_string", "arrays_block", "users_by_group", "FILE_SHIFT",
           "MAX_FILES", "line_position", "concat_strings"]


_NL, _TAB, _CR = 10, 9, 13


def work_array(scratch: Optional[Scratch], name: str, n: int, dtype) -> np.ndarray:
    """An array of ``n`` ``dtype`` for the work of a call: ``scratch``'s array ``name``
    (reused from call to call), or a new one from Arrow's pool (``buffers.empty``)."""
    return empty(n, dtype) if scratch is None else scratch.take(name, n, dtype)


@dataclass
class ParsedBlock:
    """The well-formed lines of a block, in line order: line k's user id is
    ``buf[offsets[k]:user_ends[k]]`` and its item ``buf[item_starts[k]:item_ends[k]]``
    (``buf``: the block's bytes; ``offsets[k]``, where the line starts, is where its
    user id starts), and the malformed lines: ``{raw line: occurrences}``.
    ``users`` and ``items`` are the same as two Arrow string arrays (made on first
    use)."""
    buf: np.ndarray
    offsets: np.ndarray
    user_ends: np.ndarray
    item_starts: np.ndarray
    item_ends: np.ndarray
    malformed: Dict[bytes, int]

    def __len__(self) -> int:
        return len(self.offsets)

    @functools.cached_property
    def users(self) -> pa.Array:
        return _gather(self.buf, self.offsets, self.user_ends)

    @functools.cached_property
    def items(self) -> pa.Array:
        return _gather(self.buf, self.item_starts, self.item_ends)


def _gather(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """The disjoint byte ranges ``buf[starts[k]:ends[k]]`` (in increasing order) as one
    Arrow string array, copied into one contiguous buffer.

    ``buf`` is viewed, without a copy, as an Arrow binary array whose elements are the
    ranges and the gaps between them (offsets ``starts[0], ends[0], starts[1], ...``),
    and Arrow's ``take`` of the even elements copies the ranges. The gaps (which may
    hold malformed lines) are never read; the ranges are valid UTF-8 (``parse_block``
    checked every line it keeps), so the result is viewed as strings."""
    n = len(starts)
    large = len(buf) >= 1 << 31
    offsets = np.empty(2 * n + 1, np.int64 if large else np.int32)
    offsets[0:-1:2] = starts
    offsets[1:-1:2] = ends
    offsets[-1] = len(buf)
    kind = pa.large_binary() if large else pa.binary()
    spans = pa.Array.from_buffers(kind, 2 * n, [None, pa.py_buffer(offsets),
                                                pa.py_buffer(buf)])
    picked = spans.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))
    return picked.view(pa.large_string() if large else pa.string())


def _line_spans(buf: np.ndarray, lines: int, scratch: Optional[Scratch] = None):
    """``(starts, ends, tabs, high)`` of a block of ``lines`` lines: where each
    starts, where it ends (its ``\\n``, or the block's end, before a ``\\r`` just
    before it), its first tab (``len(buf) + 1`` when it has none) and whether any
    byte of the block is >= 0x80. The compiled kernel ``line_spans`` (one pass, into
    ``scratch``'s arrays when given) once the process has enough work, else numpy."""
    n = len(buf)
    kernel = compiled.kernel("line_spans", n)
    if kernel is not None:
        starts = work_array(scratch, "line_starts", lines, np.int64)
        ends = work_array(scratch, "line_ends", lines, np.int64)
        tabs = work_array(scratch, "line_tabs", lines, np.int64)
        return starts, ends, tabs, bool(kernel(buf, starts, ends, tabs))
    newlines = np.flatnonzero(buf == _NL)
    starts = np.empty(len(newlines) + 1, np.int64)
    starts[0] = 0
    starts[1:] = newlines + 1
    ends = np.empty_like(starts)
    ends[:-1] = newlines
    ends[-1] = n
    nonempty = ends > starts
    ends[nonempty] -= buf[ends[nonempty] - 1] == _CR
    tabs = np.flatnonzero(buf == _TAB)
    if len(tabs):
        tab = np.append(tabs, n + 1)[np.searchsorted(tabs, starts)]  # first at or after start
        tab[tab > ends] = n + 1  # in a later line: none in this one
    else:
        tab = np.full(len(starts), n + 1, np.int64)
    return starts, ends, tab, bool((buf >= 0x80).any())


def count_byte(buf: np.ndarray, byte: int) -> int:
    """How many elements of the uint8 array ``buf`` equal ``byte``: the compiled
    kernel once the process has enough work (a tenth of ``bytes.count``'s time),
    else numpy."""
    kernel = compiled.kernel("count_byte", len(buf))
    if kernel is not None:
        return int(kernel(buf, byte))
    return int(np.count_nonzero(buf == byte))


def parse_block(block, scratch: Optional[Scratch] = None) -> ParsedBlock:
    """Parses a block of lines (``\\n``-separated, as ``dp.data.lines.iter_raw_blocks``
    and ``dp.data.lines.read_blocks`` yield them: no final newline; bytes or a
    ``memoryview``) into user ids and items.

    Exactly ``dp.data.lines.parse_line`` on each line: a trailing ``\\r`` is removed,
    the user id is everything before the first tab and must be non-empty, the
    item everything after it (further tabs included), and a line that is not
    valid UTF-8 (strict: no surrogates) is malformed, as is an empty line.
    ``scratch``: the arrays of the result are ``scratch``'s (valid until it parses
    the next block), else new. The result's ``buf`` views ``block`` (no copy).
    """
    buf = np.frombuffer(block, dtype=np.uint8)
    starts, ends, tab, high = _line_spans(buf, count_byte(buf, _NL) + 1, scratch)
    ok = np.greater(tab, starts, out=work_array(scratch, "line_ok", len(starts), np.bool_))
    ok &= np.less(tab, ends, out=work_array(scratch, "line_in", len(starts), np.bool_))
    if high:  # check the UTF-8 of the lines that hold a non-ASCII byte
        try:
            str(block, "utf-8")
        except UnicodeDecodeError:
            non_ascii = np.flatnonzero(buf >= 0x80)
            lines = np.unique(np.searchsorted(starts, non_ascii, side="right") - 1)
            for k in lines[ok[lines]].tolist():
                try:
                    str(block[starts[k]:ends[k]], "utf-8")
                except UnicodeDecodeError:
                    ok[k] = False
    bad = np.zeros(0, np.int64) if ok.all() else np.flatnonzero(~ok)
    malformed: Dict[bytes, int] = {}
    if len(bad):
        # a line's raw end (its \r kept) is where the next line starts, less its \n
        last = len(starts) - 1
        malformed = dict(collections.Counter(
            bytes(block[starts[k]:(starts[k + 1] - 1 if k < last else len(block))])
            for k in bad.tolist()))
        keep = np.flatnonzero(ok)
        starts, ends, tab = starts[keep], ends[keep], tab[keep]
    item_starts = np.add(tab, 1, out=work_array(scratch, "item_starts", len(tab), np.int64))
    return ParsedBlock(buf, starts, tab, item_starts, ends, malformed)


#: The compiled dictionary encoding's hash start, drawn once per process: input
#: crafted to collide in a public hash (user ids all in one slot chain) would make
#: the encoding quadratic; an unknown start places strings anew in every process.
#: The codes do not depend on it (they number strings in order of appearance).
_TABLE_BASIS = np.uint64(int.from_bytes(os.urandom(8), "little"))


def encode_spans(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                 scratch: Optional[Scratch] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Exact dictionary encoding of the byte strings ``buf[starts[k]:starts[k] +
    lengths[k]]``: ``(codes, firsts)``, string k's code (int64; 0, 1, ... in order of
    first appearance) and the index of the first string of each code. Two strings
    get one code exactly when their bytes are equal. The compiled kernel once the
    process has enough work (its hash table starts from ``_TABLE_BASIS``; its
    results in ``scratch``'s arrays when given), else Arrow's ``dictionary_encode``
    (the same codes)."""
    kernel = compiled.kernel("encode_spans", len(starts))
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    if kernel is not None:
        codes = work_array(scratch, "codes", len(starts), np.int64)
        firsts = work_array(scratch, "firsts", len(starts), np.int64)
        distinct = kernel(buf, starts, lengths, _TABLE_BASIS, codes, firsts)
        return codes, (firsts[:distinct] if scratch is not None
                       else firsts[:distinct].copy())
    encoded = pc.dictionary_encode(
        gather_spans(buf, starts, lengths).cast(pa.large_binary()))
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    firsts = np.full(len(encoded.dictionary), len(codes), np.int64)
    np.minimum.at(firsts, codes, np.arange(len(codes), dtype=np.int64))
    return codes, firsts


def gather_spans(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """The byte strings ``buf[starts[k]:starts[k] + lengths[k]]`` (valid UTF-8, not
    overlapping, in any order) as one Arrow string array, copied into one buffer.
    The compiled kernel once the process has enough work, else Arrow (``_gather``
    of the spans in increasing order, then ``take`` back to the order asked)."""
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    kernel = compiled.kernel("gather_spans", len(starts))
    total = int(lengths.sum())
    if kernel is None or total >= 1 << 31:
        order = np.argsort(starts, kind="stable")
        picked = _gather(buf, starts[order], starts[order] + lengths[order])
        if len(order) and (order[1:] < order[:-1]).any():
            inverse = np.empty_like(order)
            inverse[order] = np.arange(len(order))
            picked = picked.take(pa.array(inverse))
        return picked
    offsets = empty(len(starts) + 1, np.int32)
    data = kernel(buf, starts, lengths, offsets, empty(total, np.uint8))
    return pa.Array.from_buffers(pa.string(), len(starts),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def string_spans(array: pa.Array) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(data, starts, lengths)`` of an Arrow string array without nulls: element k
    is ``data[starts[k]:starts[k] + lengths[k]]`` (no copy of the bytes)."""
    if array.null_count:
        raise ValueError("string arrays of user ids and items hold no nulls")
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64 if large else np.int32)
    offsets = offsets[array.offset:array.offset + len(array) + 1]
    data = (np.frombuffer(data_buf, np.uint8) if data_buf is not None
            else np.zeros(0, np.uint8))
    starts = _int64(offsets[:-1])
    return data, starts, np.subtract(offsets[1:], offsets[:-1],
                                     out=empty(len(array), np.int64))


def _int64(a: np.ndarray) -> np.ndarray:
    """``a`` as a new int64 array (its memory from Arrow's pool, ``buffers.empty``)."""
    out = empty(len(a), np.int64)
    out[:] = a
    return out


# A public, fixed key: ``string_groups`` spreads work and has no privacy role.
_GROUP_KEY = b"beam_dpsu/groups"


def string_groups(array: pa.Array, groups: int) -> np.ndarray:
    """The group in [0, groups) of every string of an Arrow string array: SipHash-2-4
    of its UTF-8 bytes under a fixed public key, modulo ``groups``. It only spreads
    users over groups and items over shards (no privacy role)."""
    data, starts, lengths = string_spans(array)
    h = siphash24_many(_GROUP_KEY, data, starts, lengths)
    return np.remainder(h, np.uint64(groups), out=h).view(np.int64)  # < groups: int64 as is


def encode_strings(array: pa.Array) -> Tuple[pa.Array, np.ndarray]:
    """``(distinct strings, index of each element in them)`` (exact string equality)."""
    encoded = pc.dictionary_encode(array)
    return encoded.dictionary, _int64(encoded.indices.to_numpy(zero_copy_only=False))


#: The first character of the string that stands for a user id or item that is not a
#: plain UTF-8 ``str`` (``id_strings``), followed by the hex of its canonical bytes.
ID_ESCAPE = "\x00"


def id_strings(values: List[Any], what: str = "user id") -> pa.Array:
    """User ids or items (``dp.data.contribution.canonical_id``'s types) as an Arrow string
    array with the same identities: two values get one string exactly when they are
    one id. ``str`` values are themselves (one pass in Arrow when they all are);
    any other id (``bytes``, ``int``, tuples, a ``str`` with a lone surrogate or
    starting with ``ID_ESCAPE``) is ``ID_ESCAPE`` and the hex of its canonical
    bytes (``noise.encode_value``), read back by ``from_id_string``. A type the
    library refuses raises ``IdTypeError`` (naming the type, never the value)."""
    try:
        array = pa.array(values)
    except Exception:  # not all str (an int of 2**64, a lone surrogate, ...): one by one
        array = None
    if (array is not None and array.type == pa.string() and not array.null_count
            and not pc.any(pc.starts_with(array, ID_ESCAPE)).as_py()):
        return array
    return pa.array([_id_string(v, what) for v in values], pa.string())


def _id_string(value: Any, what: str) -> str:
    value = canonical_id(value, what)
    if type(value) is str and not value.startswith(ID_ESCAPE):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:  # a lone surrogate: not a valid Arrow string
            pass
    return ID_ESCAPE + encode_value(value).hex()


def from_id_string(text: str) -> Any:
    """The id ``id_strings`` wrote as ``text``."""
    if not text.startswith(ID_ESCAPE):
        return text
    raw = bytes.fromhex(text[len(ID_ESCAPE):])
    kind, body = raw[:1], raw[1:]
    if kind == b"s":
        return body.decode("utf-8", "surrogatepass")
    if kind == b"b":
        return body
    name, _, shown = body.decode("utf-8", "surrogatepass").partition(":")
    value = ast.literal_eval(shown)
    if type(value).__name__ != name:
        raise ValueError(f"not an id string: a {name} that reads back as a "
                         f"{type(value).__name__}")
    return value


def arrays_block(users: pa.Array, items: pa.Array) -> ParsedBlock:
    """Pairs given as two string arrays (pair k is ``(users[k], items[k])``) as a
    ``ParsedBlock`` of well-formed lines, for ``pair_blocks``: the same pairs as a
    block of the text ``users[k]<TAB>items[k]`` lines would give (the bytes of both
    arrays copied into one buffer)."""
    if len(users) != len(items):
        raise ValueError(f"{len(users)} users for {len(items)} items")
    udata, ustarts, ulengths = string_spans(users)
    idata, istarts, ilengths = string_spans(items)
    buf = np.concatenate([udata, idata])
    istarts = istarts + len(udata)
    return ParsedBlock(buf, ustarts, ustarts + ulengths, istarts, istarts + ilengths, {})


def users_by_group(parsed: ParsedBlock, groups: int, scratch: Optional[Scratch] = None):
    """``(users, group, line_code)``: the block's distinct users numbered group by group
    (a group's users are one range of codes), each one's group, each line's user code."""
    offsets = parsed.offsets
    lengths = np.subtract(parsed.user_ends, offsets,
                          out=work_array(scratch, "user_lengths", len(offsets), np.int64))
    u, firsts = encode_spans(parsed.buf, offsets, lengths, scratch)
    users = _gather(parsed.buf, offsets[firsts], parsed.user_ends[firsts])
    group = string_groups(users, groups)
    by_group = np.argsort(group, kind="stable")
    code = np.empty(len(users), np.int64)
    code[by_group] = np.arange(len(users))
    return (users.take(pa.array(by_group)), group[by_group],
            # (mode="clip": the codes are all in range, and "raise" copies through a
            # temporary of the whole length)
            np.take(code, u, out=work_array(scratch, "line_code", len(u), np.int64), mode="clip"))


#: ``counted_pair_blocks``: a file's first line is at position ``file_index << FILE_SHIFT``;
#: a file's text may be up to 2^44 bytes (16 TiB) long.
FILE_SHIFT = 44


#: ``line_position``: at most this many input files (the positions fit in an int64).
MAX_FILES = 1 << (63 - FILE_SHIFT)


def line_position(file_index: int, offset: int, length: int = 0) -> int:
    """The position in the whole input of the line at byte ``offset`` of the text of
    the ``file_index``-th input file (files sorted by path): positions order lines by
    file, then by place in the file (the record order). ``length``: the bytes from
    ``offset`` that must stay within the file's range (a block's length), so that
    no position of the block reaches the next file's. ValueError beyond
    ``MAX_FILES`` files or 2^``FILE_SHIFT`` bytes of text in one file."""
    if not 0 <= file_index < MAX_FILES:
        raise ValueError(f"the record order covers at most {MAX_FILES} input files; "
                         f"got file number {file_index}")
    if not (0 <= offset and offset + length < 1 << FILE_SHIFT):
        raise ValueError(f"the record order covers at most 2^{FILE_SHIFT} bytes of text "
                         f"per input file; file {file_index} is longer")
    return (file_index << FILE_SHIFT) + offset


def concat_strings(arrays: List[pa.Array]) -> pa.Array:
    """String arrays as one (large strings when their types differ or they hold 1 GiB
    or more)."""
    if len(arrays) == 1:
        return arrays[0]
    kinds = {a.type for a in arrays}
    if len(kinds) > 1 or sum(a.nbytes for a in arrays) >= 1 << 30:
        arrays = [a.cast(pa.large_string()) for a in arrays]
    return pa.concat_arrays(arrays)
