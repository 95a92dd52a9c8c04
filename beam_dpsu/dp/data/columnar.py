"""The histogram mechanisms' preparation on blocks of arrays, not Python objects per line.

A block of ``user<TAB>item`` text goes through four pure steps, each on
numpy and Arrow arrays (``pyarrow``, a dependency of Beam):

1. ``columnar_text.parse_block``: the lines of a block → where each well-formed
   line's user id and item lie in the block's bytes, and the malformed lines
   (``dp.data.columnar_text``).
2. ``pair_blocks``: the block's ``(user, item)`` pairs (a user's repeated lines
   mostly removed; the group stage removes the rest), split into
   ``PairBlock`` s by user group (``string_groups`` of the user id), each a
   few arrays that serialise to one compact Arrow IPC message
   (``PairBlock.to_bytes``). Every line of a user lands in the same group.
   A reader holds a group's blocks from block to block (``PairBuffer``) and
   sends them as one message (``merge_pair_blocks``) once it holds
   ``FLUSH_PAIRS`` pairs in all, or at the end of its file.
3. ``bounded_histogram``: all the pair blocks of one user group → each user's
   distinct items, at most Δ0 of them kept by ``contribution.sample_items``'s
   own rule (the same keyed scores, the same subset: ``dp.data.columnar_sampling``),
   each kept item weighted by ``weights.user_weight``; the group's partial histogram.
4. ``sum_histograms``: the partial histograms of one item shard (the shards
   split by ``string_groups`` of the item) → one weight per item, decided by a
   release rule's vectorised ``decide_bits`` (``release_shard``).

Identity is exact: users and items are compared as strings wherever they
meet, never through a hash. The hashes here are public and only place strings:
``string_groups`` chooses the group of a user or the shard of an item to spread
work, and ``mixed_fnv`` orders a block's lines so that a user's repeated lines are
neighbours, compared byte for byte (a collision only leaves a repeat for the group
stage).

The per-user data and the histogram equal those of the dict path
(``dp.data.lines`` → ``contribution.sample_items`` → ``weights``), so a seeded run
releases the same set on either path (up to the order in which floating-point
weights are summed, which the tests show does not change a release).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_dpsu.dp.randomness import compiled
from beam_dpsu.dp.randomness.buffers import Scratch, empty
from beam_dpsu.dp.privacy.calibration import check_positive_int
from beam_dpsu.dp.data.weights import check_weighting
from beam_dpsu.dp.data.columnar_sampling import presample_mask, sample_big_users
from beam_dpsu.dp.data.columnar_text import (ParsedBlock, concat_strings, encode_strings,
                                             gather_spans, string_groups, string_spans,
                                             users_by_group, work_array)

__all__ = ["COLUMNAR_USER_GROUPS", "BYTES_PER_USER_GROUP", "MIN_USER_GROUPS",
           "MAX_USER_GROUPS", "COLUMNAR_ITEM_SHARDS", "GROUPS_PER_ITEM_SHARD",
           "user_groups_for", "item_shards_for", "IPC_COMPRESSION", "PairBlock",
           "FLUSH_PAIRS", "merge_pair_blocks", "PairBuffer", "mixed_fnv", "pair_blocks",
           "presample", "counted_pair_blocks", "GroupHistogram", "GroupPairs",
           "group_pairs", "without_items", "item_users_of_pairs", "held_pairs",
           "read_held_pairs", "top_candidates", "pairs_histogram", "sampled_pairs",
           "bounded_histogram", "split_by_shard", "sum_histograms", "release_shard"]


#: Users are split into this many groups (one ``bounded_histogram`` call each).
COLUMNAR_USER_GROUPS = 64
#: ``user_groups_for``: one group per this many bytes of input (as stored), within
#: ``[MIN_USER_GROUPS, MAX_USER_GROUPS]``.
BYTES_PER_USER_GROUP = 8 << 20
MIN_USER_GROUPS, MAX_USER_GROUPS = 8, 512
#: The default number of item shards the histogram is split into (one ``release_shard``
#: call each), and the least ``item_shards_for`` gives.
COLUMNAR_ITEM_SHARDS = 16
#: ``item_shards_for``: one item shard per this many user groups, at least
#: ``COLUMNAR_ITEM_SHARDS``.
GROUPS_PER_ITEM_SHARD = 4


def user_groups_for(input_bytes: Optional[int]) -> int:
    """A number of user groups for an input of ``input_bytes`` (as stored; None:
    unknown): one per ``BYTES_PER_USER_GROUP``, at least ``MIN_USER_GROUPS`` and at
    most ``MAX_USER_GROUPS``; ``COLUMNAR_USER_GROUPS`` when the size is unknown. Few
    groups for a small input (each group costs a message per file and reader flush,
    and a shard message per shard), more for a large one (a worker holds one group's
    lines)."""
    if input_bytes is None:
        return COLUMNAR_USER_GROUPS
    return int(min(MAX_USER_GROUPS, max(MIN_USER_GROUPS, input_bytes // BYTES_PER_USER_GROUP)))


def item_shards_for(user_groups: int) -> int:
    """A number of item shards for ``user_groups`` user groups: one per
    ``GROUPS_PER_ITEM_SHARD`` groups, at least ``COLUMNAR_ITEM_SHARDS``. A shard sums
    one partial histogram from every group, so its size follows the number of groups
    over the number of shards; keeping that ratio keeps a shard's memory bounded as
    the input (and the number of groups) grows."""
    return max(COLUMNAR_ITEM_SHARDS, int(user_groups) // GROUPS_PER_ITEM_SHARD)


def _spans_equal(data: np.ndarray, a: np.ndarray, b: np.ndarray,
                 lengths: np.ndarray) -> np.ndarray:
    """Whether ``data[a[k]:a[k]+lengths[k]] == data[b[k]:b[k]+lengths[k]]`` for each k."""
    kernel = compiled.kernel("compare_spans", len(a))
    if kernel is not None:
        return kernel(data, a.astype(np.int64), b.astype(np.int64), lengths.astype(np.int64))
    total = int(lengths.sum())
    if total == 0:
        return np.ones(len(a), dtype=bool)
    offsets = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    rank = np.arange(total, dtype=np.int64) - np.repeat(offsets, lengths)
    differ = data[np.repeat(a, lengths) + rank] != data[np.repeat(b, lengths) + rank]
    owner = np.repeat(np.arange(len(a)), lengths)
    return np.bincount(owner[differ], minlength=len(a)) == 0


#: Compression of the pair blocks between stages, ``'zstd'`` (the default) or None
#: (``_to_ipc`` takes no other): zstd at level 1 over the whole Arrow IPC message
#: (``zstandard``, which Beam already depends on), so that a runner that keeps its
#: shuffles in memory (the FnApiRunner) holds less than half the bytes. One compressor
#: and one decompressor are kept per thread (``_codecs``). Arrow's own IPC compression
#: (zstd buffer by buffer) makes the messages about 10% smaller (the pair blocks of
#: 100,000 synthetic users: 28.1 MB against 31.2 MB, 4.7M pairs) but makes a new zstd
#: context, of up to about 1 MB, for every buffer it compresses, which a process whose
#: allocator returns freed memory to the system at once (Dask's workers, whose
#: ``MALLOC_TRIM_THRESHOLD_`` does that) must fault in page by page each time; a
#: message is written in half the time and read in a third of it this way
#: (benchmarks/RESULTS.md). Arrow itself compresses nothing, so its IPC writer and
#: reader have no work to hand to its thread pool.
IPC_COMPRESSION = "zstd"

#: The first bytes of a zstd frame (RFC 8878); an Arrow IPC stream starts with
#: 0xFFFFFFFF, so a message says itself whether it is compressed.
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_LEVEL = 1

_THREAD_CODECS = threading.local()


def _codecs():
    """This thread's ``(zstd compressor, decompressor)``, made once (neither is
    thread-safe; each keeps its context between messages)."""
    codecs = getattr(_THREAD_CODECS, "codecs", None)
    if codecs is None:
        import zstandard
        codecs = _THREAD_CODECS.codecs = (zstandard.ZstdCompressor(level=_ZSTD_LEVEL),
                                          zstandard.ZstdDecompressor())
    return codecs


def _to_ipc(batch: pa.RecordBatch, compression: Optional[str] = IPC_COMPRESSION) -> bytes:
    """``batch`` as one Arrow IPC stream message, zstd-compressed whole (``compression``
    ``'zstd'``) or not (None)."""
    if compression not in ("zstd", None):
        raise ValueError(f"compression must be 'zstd' or None, got {compression!r}")
    sink = pa.BufferOutputStream()
    # explicit options: the current format whatever ARROW_PRE_0_15_IPC_FORMAT says
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions()) as writer:
        writer.write_batch(batch)
    if compression is None:
        return sink.getvalue().to_pybytes()
    return _codecs()[0].compress(sink.getvalue())


def _from_ipc(blob: bytes) -> pa.RecordBatch:
    """The batch of a ``_to_ipc`` message, compressed or not."""
    if blob[:4] == _ZSTD_MAGIC:
        blob = _codecs()[1].decompress(blob)
    with pa.ipc.open_stream(pa.py_buffer(blob)) as reader:
        return reader.read_next_batch()


def _coded(codes: np.ndarray, values: pa.Array) -> pa.DictionaryArray:
    """``values[codes[k]]`` for each k, as an Arrow dictionary column (int32 codes)."""
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), values)


#: The optional columns of counted pairs (``counted_pair_blocks``).
_COUNTED = ("counts", "first")


def _pairs_message(user: pa.Array, item: pa.Array, pairs) -> bytes:
    """One Arrow IPC message of a user and an item column, with ``pairs``' counted
    columns (``_COUNTED``) where it has them."""
    columns, names = [user, item], ["user", "item"]
    for name in _COUNTED:
        if getattr(pairs, name) is not None:
            columns.append(pa.array(getattr(pairs, name), pa.int64()))
            names.append(name)
    return _to_ipc(pa.RecordBatch.from_arrays(columns, names=names))


def _counted_columns(batch: pa.RecordBatch) -> Dict[str, np.ndarray]:
    """The counted columns a message holds, as arrays by name."""
    return {name: batch.column(name).to_numpy() for name in _COUNTED
            if name in batch.schema.names}


@dataclass
class PairBlock:
    """``(user, item)`` pairs: pair k is ``(users[user_index[k]], items[k])``;
    ``users`` holds distinct user ids. A block made for the sequential policies
    (``counted_pair_blocks``) also holds each pair's number of lines
    (``counts[k]``) and, when the record order is kept, the position of its
    first line in the input (``first[k]``); both are None otherwise."""
    users: pa.Array
    items: pa.Array
    user_index: np.ndarray
    counts: Optional[np.ndarray] = None
    first: Optional[np.ndarray] = None

    def to_bytes(self) -> bytes:
        """One Arrow IPC message (the user column dictionary-encoded)."""
        return _pairs_message(_coded(self.user_index, self.users), self.items, self)

    @classmethod
    def from_bytes(cls, blob: bytes) -> "PairBlock":
        batch = _from_ipc(blob)
        user = batch.column(0)
        return cls(user.dictionary, batch.column(1),
                   user.indices.to_numpy(zero_copy_only=False), **_counted_columns(batch))


#: ``PairBuffer``: a reader sends its user groups' pairs once it holds this many (a few
#: tens of MB: 25-30 MB more peak at 1M users in one file). A message per group and
#: block cost about 0.2 ms to write and read back whatever its size; with a thousand
#: users a group and block, most of a message was that cost.
FLUSH_PAIRS = 1 << 20


def _users_of_pairs(blocks: List[PairBlock]) -> Tuple[pa.Array, np.ndarray]:
    """``(users, codes)``: the distinct users of ``blocks`` (exact strings) and the
    user code of each of their pairs, block after block (a new int64 array)."""
    users, code = encode_strings(concat_strings([b.users for b in blocks]))
    codes = empty(sum(len(b.user_index) for b in blocks), np.int64)
    user_off = pair_off = 0
    for b in blocks:
        np.take(code[user_off:user_off + len(b.users)], b.user_index,
                out=codes[pair_off:pair_off + len(b.user_index)])
        user_off += len(b.users)
        pair_off += len(b.user_index)
    return users, codes


def merge_pair_blocks(blocks: List[PairBlock]) -> PairBlock:
    """Pair blocks (of one user group) → one ``PairBlock`` of all their pairs, in
    their order, each user held once (exact strings); their counts and first
    positions concatenated when the blocks have them (all of them or none:
    ValueError otherwise). ``group_pairs`` gives the same group from either."""
    if not blocks:
        raise ValueError("merge_pair_blocks needs at least one block")
    if len(blocks) == 1:
        return blocks[0]
    users, index = _users_of_pairs(blocks)
    columns = {}
    for name in _COUNTED:
        parts = [getattr(b, name) for b in blocks]
        if any(p is None for p in parts) != all(p is None for p in parts):
            raise ValueError(f"merge_pair_blocks: some blocks have {name} and some do not")
        columns[name] = None if parts[0] is None else np.concatenate(parts)
    return PairBlock(users, concat_strings([b.items for b in blocks]), index, **columns)


class PairBuffer:
    """A reader's pair blocks by user group, held from block to block and sent as one
    message per group (``merge_pair_blocks``): ``add({group: PairBlock})`` returns
    ``{group: merged PairBlock}`` of everything held once it holds at least
    ``flush_pairs`` pairs (default ``FLUSH_PAIRS``, read when the buffer is made), else
    ``{}``; ``flush()`` returns what is held (the end of a file). A group's pairs
    are the same whichever way they are sent; fewer messages cost less to write,
    shuffle and read. Memory: the blocks held (their user ids and items)."""

    def __init__(self, flush_pairs: Optional[int] = None):
        self._flush_pairs = check_positive_int(
            FLUSH_PAIRS if flush_pairs is None else flush_pairs, "flush_pairs")
        self._held: Dict[int, List[PairBlock]] = {}
        self._pairs = 0

    def add(self, by_group: Dict[int, PairBlock]) -> Dict[int, PairBlock]:
        for group, block in by_group.items():
            self._held.setdefault(group, []).append(block)
            self._pairs += len(block.user_index)
        return self.flush() if self._pairs >= self._flush_pairs else {}

    def flush(self) -> Dict[int, PairBlock]:
        held, self._held, self._pairs = self._held, {}, 0
        return {group: merge_pair_blocks(blocks) for group, blocks in sorted(held.items())}


def _distinct_codes(codes: np.ndarray) -> np.ndarray:
    """The distinct values of an int64 array, sorted (``codes`` is sorted in place)."""
    codes.sort()
    if len(codes) < 2:
        return codes
    first = empty(len(codes), np.bool_)
    first[0] = True
    np.not_equal(codes[1:], codes[:-1], out=first[1:])
    return np.compress(first, codes, out=empty(np.count_nonzero(first), np.int64))


_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def mixed_fnv(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each byte string ``buf[starts[k]:starts[k] + lengths[k]]``:
    FNV-1a, then ``h ^= h >> 29; h *= 0xBF58476D1CE4E5B9; h ^= h >> 32``. Public
    and unkeyed: it only orders strings (``_drop_repeats``), whose bytes are
    compared wherever equality matters (the compiled ``encode_spans`` places them by
    the same hash from a per-process start, ``_TABLE_BASIS``).
    The numpy form of the compiled kernels' hash (the tests compare them)."""
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    h = np.full(len(starts), _FNV_OFFSET, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(lengths.max()) if len(lengths) else 0):
            on = np.flatnonzero(lengths > j)
            h[on] = (h[on] ^ buf[starts[on] + j].astype(np.uint64)) * _FNV_PRIME
        h ^= h >> np.uint64(29)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(32)
    return h


def _item_keys(buf, starts, lengths, line_code, bits: int, index_bits: int = 0,
               scratch: Optional[Scratch] = None) -> np.ndarray:
    """Each line's sort key: its user code in the high ``bits`` bits, the high bits
    of its item's ``mixed_fnv`` below, and, with ``index_bits``, the line's index
    k in the low ``index_bits`` bits (in place of the hash's lowest bits)."""
    kernel = compiled.kernel("item_keys", len(starts))
    if kernel is not None:
        return kernel(buf, starts, lengths, line_code, bits, index_bits,
                      work_array(scratch, "item_keys", len(starts), np.uint64))
    keys = ((line_code.astype(np.uint64) << np.uint64(64 - bits))
            | (mixed_fnv(buf, starts, lengths) >> np.uint64(bits)))
    if index_bits:
        keys >>= np.uint64(index_bits)
        keys <<= np.uint64(index_bits)
        keys |= np.arange(len(keys), dtype=np.uint64)
    return keys


def _sorted_repeats(buf, starts, lengths, keys) -> np.ndarray:
    """Whether string k repeats string k - 1 (equal keys, equal bytes)."""
    kernel = compiled.kernel("sorted_repeats", len(starts))
    if kernel is not None:
        return kernel(buf, starts, lengths, keys)
    repeat = np.zeros(len(starts), dtype=bool)
    same = np.flatnonzero((keys[1:] == keys[:-1]) & (lengths[1:] == lengths[:-1]))
    repeat[same + 1] = _spans_equal(buf, starts[same], starts[same + 1], lengths[same])
    return repeat


def _drop_repeats(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                  line_code: np.ndarray, users: int, scratch: Optional[Scratch] = None):
    """The lines ordered by user (``line_code``), then by a hash of the item (line k's
    item: ``data[starts[k]:starts[k] + lengths[k]]``), without a user's repeated
    lines: ``(line_code, starts, lengths)`` in that order. Repeats share a key and are
    compared byte for byte, so a hash collision never merges two items (at most it
    leaves a repeat for ``bounded_histogram``).

    Each key (``_item_keys``) carries its line's index in its lowest bits, so one
    sort of the keys in place gives the order (no index array of an argsort, and
    faster); equal items keep equal keys above the index, and the lines of items
    whose truncated hashes collide may interleave: the compiled ``without_repeats``
    compares a line with the lines kept in its run of equal keys (up to
    ``RUN_CHECKS``), the numpy form with its neighbour only."""
    n = len(starts)
    bits = max(1, int(users - 1).bit_length())
    index_bits = max(1, int(n - 1).bit_length())
    if bits + index_bits > 64:
        raise ValueError(f"a block of {n} lines of {users} users is too large to sort "
                         f"by packed keys: read in smaller blocks")
    keys = _item_keys(data, starts, lengths, line_code, bits, index_bits, scratch)
    keys.sort()
    kernel = compiled.kernel("without_repeats", n)
    if kernel is not None:
        out = (work_array(scratch, "kept_codes", n, line_code.dtype),
               work_array(scratch, "kept_starts", n, starts.dtype),
               work_array(scratch, "kept_lengths", n, lengths.dtype))
        m = kernel(data, starts, lengths, keys, index_bits, line_code, *out)
        return tuple(a[:m] for a in out)
    order = (keys & np.uint64((1 << index_bits) - 1)).astype(np.int64)
    starts, lengths = starts[order], lengths[order]
    kept = np.flatnonzero(~_sorted_repeats(data, starts, lengths, keys >> np.uint64(index_bits)))
    return line_code[order[kept]], starts[kept], lengths[kept]


def pair_blocks(parsed: ParsedBlock, groups: int, sample: Optional[Tuple[int, bytes]] = None,
                scratch: Optional[Scratch] = None, within: Optional[pa.Array] = None
                ) -> Dict[int, PairBlock]:
    """The block's ``(user, item)`` pairs by user group (``string_groups`` of the user
    id, in [0, groups)): ``{group: PairBlock}`` for the non-empty groups; a group's
    users are held once (``PairBlock.users``), and, once the process uses the
    compiled kernels (a large input), a user's repeated lines in the block once
    (``_drop_repeats``; ``bounded_histogram`` removes every other repeat).
    ``sample``: ``(Δ0, sampling key)`` to ``presample`` the block (None: all pairs).
    ``scratch``: the arrays of the work are ``scratch``'s (the blocks returned hold
    none of them). ``within``: only the pairs whose item is in it (a string array;
    exact string equality), e.g. a discovered domain; None: every item."""
    if len(parsed) == 0:
        return {}
    users, group, line_code = users_by_group(parsed, groups, scratch)
    starts = parsed.item_starts
    lengths = np.subtract(parsed.item_ends, starts,
                          out=work_array(scratch, "item_lengths", len(starts), np.int64))
    if compiled.kernel("item_keys", len(line_code)) is not None:
        line_code, starts, lengths = _drop_repeats(parsed.buf, starts, lengths, line_code,
                                                   len(users), scratch)
    else:  # without compiled kernels the repeats are cheaper to leave to bounded_histogram
        order = np.argsort(line_code, kind="stable")
        line_code, starts, lengths = line_code[order], starts[order], lengths[order]
    if sample is not None:
        keep = presample_mask(users, (parsed.buf, starts, lengths), line_code, *sample,
                              scratch=scratch)
        if keep is not None:
            m = int(np.count_nonzero(keep))
            starts, lengths, line_code = (
                np.compress(keep, a, out=work_array(scratch, name, m, a.dtype)) for a, name in (
                    (starts, "sampled_starts"), (lengths, "sampled_lengths"),
                    (line_code, "sampled_codes")))
    block = PairBlock(users, gather_spans(parsed.buf, starts, lengths), line_code)
    if within is not None:
        inside = pc.is_in(block.items, value_set=within).to_numpy(zero_copy_only=False)
        block = PairBlock(users, block.items.filter(pa.array(inside)),
                          np.compress(inside, block.user_index))
    return _split_groups(block, group)


def _split_groups(block: PairBlock, group: np.ndarray) -> Dict[int, PairBlock]:
    """A block's pairs (``user_index`` sorted, users numbered group by group, ``group``
    each user's) → ``{group: PairBlock}`` for the non-empty groups."""
    user_bounds = np.r_[0, np.flatnonzero(group[1:] != group[:-1]) + 1, len(group)]
    pair_bounds = np.searchsorted(block.user_index, user_bounds)
    out: Dict[int, PairBlock] = {}
    for k in range(len(user_bounds) - 1):
        a, b = int(user_bounds[k]), int(user_bounds[k + 1])
        la, lb = int(pair_bounds[k]), int(pair_bounds[k + 1])
        if la == lb:
            continue
        out[int(group[a])] = PairBlock(
            block.users.slice(a, b - a), block.items.slice(la, lb - la),
            (block.user_index[la:lb] - a).astype(np.int32),
            None if block.counts is None else block.counts[la:lb],
            None if block.first is None else block.first[la:lb])
    return out


def presample(block: PairBlock, max_items: int, sample_key: bytes) -> PairBlock:
    """``block`` without the pairs that cannot be among their user's Δ0 sampled items.

    The sampler (``contribution.sample_items``) keeps a user's ``max_items``
    (Δ0) distinct items of smallest keyed score, the score a function of the
    key, the user and the item alone. A user's items in one block are a subset of
    all their items, so an item whose score is above the Δ0-th smallest distinct
    score of the block cannot be kept: it is dropped here. Every item of score at
    most that (ties included) stays, so the user's whole set of kept items (and
    every item tied at the cut) survives in some block, a user with more than Δ0
    distinct items keeps more than Δ0 here too, and ``bounded_histogram`` on the
    presampled blocks equals it on the full ones (the tests check it). A user
    with at most Δ0 distinct items in the block keeps all of them. Cuts the
    pairs that cross the shuffle to at most Δ0 per user and block.

    Only for a one-round sample with ``sample_key``: DP-SIPS's later rounds
    sample again under other keys from all the pairs."""
    keep = presample_mask(block.users, string_spans(block.items), block.user_index,
                          max_items, sample_key)
    if keep is None:
        return block
    chosen = pa.array(np.flatnonzero(keep))
    return PairBlock(block.users, block.items.take(chosen), block.user_index[keep],
                     None if block.counts is None else block.counts[keep],
                     None if block.first is None else block.first[keep])


def _merge_pairs(codes: np.ndarray, counts: np.ndarray, first: Optional[np.ndarray]):
    """Pair codes with counts (and first positions, or None) → the distinct codes,
    sorted, each with the sum of its counts and the smallest of its positions."""
    if len(codes) == 0:
        return codes, counts.astype(np.int64), first
    order = np.argsort(codes)
    codes = codes[order]
    head = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    return (codes[head], np.add.reduceat(counts[order], head).astype(np.int64),
            None if first is None else np.minimum.reduceat(first[order], head))


def counted_pair_blocks(parsed: ParsedBlock, groups: int, base: Optional[int] = None,
                        sample: Optional[Tuple[int, bytes]] = None) -> Dict[int, PairBlock]:
    """The block's distinct ``(user, item)`` pairs by user group, as ``pair_blocks``,
    each with its number of lines in the block (``PairBlock.counts``) and, given
    ``base`` (``line_position`` of the block's first byte), the position of its
    first line (``PairBlock.first``): what the sequential policies need of a user
    (``{item: count}`` in record order). Users and items are compared as exact
    strings (``encode_spans`` and Arrow's dictionary encoding). ``sample``: as for
    ``pair_blocks``."""
    if len(parsed) == 0:
        return {}
    users, group, code = users_by_group(parsed, groups)
    items, i = encode_strings(parsed.items)
    width = max(len(items), 1)
    key, counts, first = _merge_pairs(code * width + i, np.ones(len(i), np.int64),
                                      None if base is None else base + parsed.offsets)
    block = PairBlock(users, items.take(pa.array(key % width)), key // width, counts, first)
    return _split_groups(block if sample is None else presample(block, *sample), group)


@dataclass
class GroupHistogram:
    """A user group's partial histogram: ``weights[k]`` of ``items[k]`` (distinct
    items, each with weight > 0) and the number of distinct users of the group."""
    items: pa.Array
    weights: np.ndarray
    num_users: int


def _user_weights(num_items: np.ndarray, weighting: str) -> np.ndarray:
    """``weights.user_weight`` of each count (counts >= 1): the same float values."""
    n = num_items.astype(np.float64)
    if weighting == "count":
        return np.ones_like(n)
    if weighting == "l1":
        return 1.0 / n
    return 1.0 / np.sqrt(n)


@dataclass
class GroupPairs:
    """A user group's distinct ``(user, item)`` pairs: pair k is ``(users[u[k]],
    items[i[k]])``, sorted by user code, then item code. ``users`` and ``items``
    hold distinct strings (an item no pair refers to any more, after
    ``without_items``, may stay in ``items``). From counted pair blocks
    (``counted_pair_blocks``), ``counts[k]`` is the pair's number of lines and
    ``first[k]`` (when the blocks kept it) the position of its first line;
    both are None otherwise."""
    users: pa.Array
    items: pa.Array
    u: np.ndarray
    i: np.ndarray
    counts: Optional[np.ndarray] = None
    first: Optional[np.ndarray] = None

    def to_bytes(self) -> bytes:
        """One Arrow IPC message (user and item dictionary-encoded)."""
        return _pairs_message(_coded(self.u, self.users), _coded(self.i, self.items), self)

    @classmethod
    def from_bytes(cls, blob: bytes) -> "GroupPairs":
        batch = _from_ipc(blob)
        user, item = batch.column(0), batch.column(1)
        return cls(user.dictionary, item.dictionary,
                   user.indices.to_numpy(zero_copy_only=False).astype(np.int64),
                   item.indices.to_numpy(zero_copy_only=False).astype(np.int64),
                   **_counted_columns(batch))

    def __len__(self) -> int:
        return len(self.u)


def group_pairs(blocks: Iterable[PairBlock]) -> GroupPairs:
    """All the pair blocks of one user group → the group's distinct ``(user, item)``
    pairs (each user's lines gathered across the blocks, repeats removed; users
    and items compared as exact strings). Counted blocks (``counted_pair_blocks``)
    give counted pairs: the counts summed, the first positions' minimum."""
    blocks = list(blocks)
    if not blocks:
        none = pa.array([], pa.string())
        return GroupPairs(none, none, np.zeros(0, np.int64), np.zeros(0, np.int64))
    users, u = _users_of_pairs(blocks)  # each pair's user code
    items, i = encode_strings(concat_strings([b.items for b in blocks]))
    width = max(len(items), 1)
    u *= width  # the pair's code: user code * width + item code
    u += i
    if any(b.counts is None for b in blocks):
        codes = _distinct_codes(u)  # sorted: by user, then item code
        return GroupPairs(users, items, *np.divmod(
            codes, width, out=(empty(len(codes), np.int64), empty(len(codes), np.int64))))
    codes, counts, first = _merge_pairs(
        u, np.concatenate([b.counts for b in blocks]),
        np.concatenate([b.first for b in blocks])
        if all(b.first is not None for b in blocks) else None)
    return GroupPairs(users, items, codes // width, codes % width, counts, first)


def without_items(pairs: GroupPairs, removed: pa.Array) -> GroupPairs:
    """``pairs`` without every pair whose item is in ``removed`` (a string array;
    exact string equality): DP-SIPS's removal of the items earlier rounds
    released. A user left without pairs no longer appears in any pair."""
    if len(removed) == 0 or len(pairs) == 0:
        return pairs
    gone = pc.is_in(pairs.items, value_set=removed).to_numpy(zero_copy_only=False)
    if not gone.any():
        return pairs
    return _pairs_where(pairs, ~gone[pairs.i])


def _pairs_where(pairs: GroupPairs, keep: np.ndarray) -> GroupPairs:
    return GroupPairs(pairs.users, pairs.items, pairs.u[keep], pairs.i[keep],
                      None if pairs.counts is None else pairs.counts[keep],
                      None if pairs.first is None else pairs.first[keep])


def item_users_of_pairs(pairs: GroupPairs) -> Tuple[List[str], List[int]]:
    """``(items, numbers of users)`` of a group's distinct pairs: each item some pair
    holds, with the number of the group's users who hold it."""
    counts = np.bincount(pairs.i, minlength=len(pairs.items))
    present = np.flatnonzero(counts)
    return pairs.items.take(pa.array(present)).to_pylist(), counts[present].tolist()


def held_pairs(pairs: GroupPairs) -> bytes:
    """A group's distinct pairs as one Arrow IPC message for the user peeling's one
    worker (``read_held_pairs``): each pair's user numbered 0, 1, ... in the group
    (int32) and its item, dictionary-encoded over the items some pair holds."""
    _, user_of = np.unique(pairs.u, return_inverse=True)
    present, item_of = np.unique(pairs.i, return_inverse=True)
    return _to_ipc(pa.RecordBatch.from_arrays(
        [pa.array(user_of.astype(np.int32).reshape(-1)),
         pa.DictionaryArray.from_arrays(pa.array(item_of.astype(np.int32).reshape(-1)),
                                        pairs.items.take(pa.array(present)))],
        names=["user", "item"]))


def read_held_pairs(blob: bytes) -> Tuple[List[str], np.ndarray, np.ndarray]:
    """``held_pairs``'s message → ``(items, user_of, item_of)``: pair j is (user
    ``user_of[j]``, ``items[item_of[j]]``), int32 arrays."""
    batch = _from_ipc(blob)
    user, item = batch.column(0), batch.column(1)
    return (item.dictionary.to_pylist(), user.to_numpy(zero_copy_only=False),
            item.indices.to_numpy(zero_copy_only=False))


def top_candidates(items: pa.Array, weights: np.ndarray, n: int) -> List[Tuple[str, float]]:
    """The ``(item, weight)`` pairs of a summed shard that can be among its ``n``
    largest whatever the tie-break: every item whose weight is at least the n-th
    largest weight (all of them when there are at most n)."""
    if len(weights) > n:
        cut = np.partition(weights, len(weights) - n)[len(weights) - n]
        chosen = np.flatnonzero(weights >= cut)
    else:
        chosen = np.arange(len(weights))
    if not len(chosen):
        return []
    return list(zip(items.take(pa.array(chosen)).to_pylist(), weights[chosen].tolist()))


def pairs_histogram(pairs: GroupPairs, max_items: Optional[int], weighting: str,
                    sample_key: Optional[bytes]) -> GroupHistogram:
    """The partial histogram of a group's distinct pairs.

    A user with more than ``max_items`` (Δ0) distinct items keeps the subset
    ``contribution.sample_items(user, ..., max_items, sample_key)`` keeps (the
    Δ0 items of smallest keyed score under the user's own key); every kept
    item gets the user's weight (``weighting``: ``'count'``, ``'l1'`` or
    ``'l2'`` of the number kept). ``max_items`` None keeps all. ``num_users``
    is the number of distinct users of ``pairs.users``.
    """
    check_weighting(weighting)
    items, u, i = pairs.items, pairs.u, pairs.i
    num = np.bincount(u, minlength=len(pairs.users))
    keep = _sampled_mask(pairs, max_items, sample_key, num)
    if max_items is not None:
        np.minimum(num, max_items, out=num)
    w = _user_weights(np.maximum(num, 1), weighting)
    if keep is not None:
        m = int(np.count_nonzero(keep))
        u, i = (np.compress(keep, a, out=empty(m, a.dtype)) for a in (u, i))
    # every weight is > 0, so an item's sum is > 0 exactly when a kept pair holds it
    hist = np.bincount(i, weights=np.take(w, u, out=empty(len(u), np.float64)),
                       minlength=len(items))
    present = np.flatnonzero(np.greater(hist, 0, out=empty(len(hist), np.bool_)))
    return GroupHistogram(items.take(pa.array(present)),
                          np.take(hist, present, out=empty(len(present), np.float64)),
                          len(pairs.users))


def sampled_pairs(pairs: GroupPairs, max_items: Optional[int], sample_key: Optional[bytes],
                  num: Optional[np.ndarray] = None) -> np.ndarray:
    """Which of a group's distinct pairs the Δ0 sampler keeps (a boolean mask): all of
    a user with at most ``max_items`` (Δ0) distinct items (all of everyone when it
    is None), else the subset ``contribution.sample_items(user, ..., max_items,
    sample_key)`` keeps. ``num``: each user's number of pairs, if known."""
    keep = _sampled_mask(pairs, max_items, sample_key, num)
    return np.ones(len(pairs.u), dtype=bool) if keep is None else keep


def _sampled_mask(pairs: GroupPairs, max_items: Optional[int], sample_key: Optional[bytes],
                  num: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
    """``sampled_pairs``, or None when it keeps every pair."""
    if max_items is None:
        return None
    if num is None:
        num = np.bincount(pairs.u, minlength=len(pairs.users))
    big = np.flatnonzero(num > max_items)
    if not len(big):
        return None
    return sample_big_users(pairs.users, pairs.items, pairs.u, pairs.i, big, max_items,
                            sample_key, np.ones(len(pairs.u), dtype=bool))


def bounded_histogram(blocks: Iterable[PairBlock], max_items: Optional[int], weighting: str,
                      sample_key: Optional[bytes]) -> GroupHistogram:
    """The partial histogram of the users in ``blocks`` (all pair blocks of their
    group): ``pairs_histogram(group_pairs(blocks), ...)``."""
    check_weighting(weighting)
    return pairs_histogram(group_pairs(blocks), max_items, weighting, sample_key)


def split_by_shard(hist: GroupHistogram, shards: int) -> Dict[int, bytes]:
    """A partial histogram split by item shard (``string_groups`` of the item):
    ``{shard: Arrow IPC message of (item, weight)}`` for the non-empty shards."""
    if len(hist.items) == 0:
        return {}
    shard = string_groups(hist.items, shards)
    order = np.argsort(shard, kind="stable")
    bounds = np.flatnonzero(np.diff(shard[order])) + 1
    out = {}
    for part in np.split(order, bounds):
        idx = pa.array(part)
        out[int(shard[part[0]])] = _to_ipc(pa.RecordBatch.from_arrays(
            [hist.items.take(idx), pa.array(hist.weights[part], pa.float64())],
            names=["item", "weight"]), compression=None)  # small, many: not worth it
    return out


def sum_histograms(blobs: Iterable[bytes]) -> Tuple[pa.Array, np.ndarray]:
    """Partial histograms (``split_by_shard``'s messages of one shard) → ``(items,
    weights)``: each distinct item once, with the sum of its partial weights."""
    batches = [_from_ipc(b) for b in blobs]
    if not batches:
        return pa.array([], pa.string()), np.zeros(0)
    items, code = encode_strings(concat_strings([b.column(0) for b in batches]))
    weights = np.concatenate([b.column(1).to_numpy() for b in batches],
                             out=empty(len(code), np.float64))
    return items, np.bincount(code, weights=weights, minlength=len(items))


def release_shard(rule, items: pa.Array, weights: np.ndarray) -> List[str]:
    """The items of a summed shard that ``rule`` releases (its vectorised
    ``decide_spans`` on the items' UTF-8 bytes, as Arrow holds them)."""
    if len(items) == 0:
        return []
    data, starts, lengths = string_spans(items)
    chosen = np.flatnonzero(rule.decide_spans(data, starts, lengths, weights))
    return items.take(pa.array(chosen)).to_pylist() if len(chosen) else []
