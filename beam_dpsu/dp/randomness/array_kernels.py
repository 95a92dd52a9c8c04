"""numba kernels of the columnar path and of SipHash-2-4 (needs numba: the ``fast`` extra).

Each has a numpy twin that gives the same results (``dp.randomness.siphash._numpy_many``,
``dp.data.columnar_text.count_byte``, ``dp.data.columnar_text._line_spans``,
``dp.data.columnar_text.encode_spans``, ``dp.data.columnar_text.gather_spans``,
``dp.data.columnar._spans_equal``, ``dp.data.columnar._item_keys`` (``mixed_fnv``),
``dp.data.columnar._sorted_repeats``, ``dp.data.columnar_sampling._smallest_distinct``;
the tests compare them; ``without_repeats`` applies ``sorted_repeats`` and also finds a
repeat a few lines back within a run of equal keys, so it may leave fewer repeats than
its numpy form (never another set of distinct lines); the columnar path itself
runs the last two only with the kernels). The kernels release the GIL
(``nogil``), so a reader thread (``dp.data.lines.read_ahead``) runs beside them.
Import this module only through ``dp.randomness.compiled.kernel``, which loads it once a
process has enough work to repay numba's start-up.
"""
import numpy as np
from numba import njit

from beam_dpsu.dp.randomness.sip_state import C0 as _C0, C1 as _C1, C2 as _C2, C3 as _C3

__all__ = ["siphash24_many", "siphash24_key", "siphash24_owned", "compare_spans", "count_byte",
           "line_spans", "encode_spans", "gather_spans", "item_keys", "sorted_repeats",
           "without_repeats", "is_sorted", "smallest_distinct"]


@njit(cache=True, inline="always")
def _rotl_one(x, b):
    return (x << np.uint64(b)) | (x >> np.uint64(64 - b))


@njit(cache=True, inline="always")
def _round_one(v0, v1, v2, v3):
    v0 += v1
    v1 = _rotl_one(v1, 13)
    v1 ^= v0
    v0 = _rotl_one(v0, 32)
    v2 += v3
    v3 = _rotl_one(v3, 16)
    v3 ^= v2
    v0 += v3
    v3 = _rotl_one(v3, 21)
    v3 ^= v0
    v2 += v1
    v1 = _rotl_one(v1, 17)
    v1 ^= v2
    v2 = _rotl_one(v2, 32)
    return v0, v1, v2, v3


@njit(cache=True, inline="always")
def _siphash_one(k0, k1, buf, start, length, prefix):
    """SipHash-2-4 under ``(k0, k1)`` of ``buf[start:start + length]``, preceded by
    the byte ``prefix`` when ``prefix >= 0``."""
    v0 = k0 ^ np.uint64(_C0)
    v1 = k1 ^ np.uint64(_C1)
    v2 = k0 ^ np.uint64(_C2)
    v3 = k1 ^ np.uint64(_C3)
    pre = 0 if prefix < 0 else 1
    total = length + pre
    base = start - pre
    m = np.uint64(0)
    k = 0
    for pos in range(total):
        if pos == 0 and pre == 1:
            byte = np.uint64(prefix)
        else:
            byte = np.uint64(buf[base + pos])
        m |= byte << np.uint64(8 * k)
        k += 1
        if k == 8:
            v3 ^= m
            v0, v1, v2, v3 = _round_one(v0, v1, v2, v3)
            v0, v1, v2, v3 = _round_one(v0, v1, v2, v3)
            v0 ^= m
            m = np.uint64(0)
            k = 0
    m |= np.uint64(total & 0xFF) << np.uint64(56)
    v3 ^= m
    v0, v1, v2, v3 = _round_one(v0, v1, v2, v3)
    v0, v1, v2, v3 = _round_one(v0, v1, v2, v3)
    v0 ^= m
    v2 ^= np.uint64(0xFF)
    for _ in range(4):
        v0, v1, v2, v3 = _round_one(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


@njit(cache=True, nogil=True)
def siphash24_many(k0, k1, buf, starts, lengths, prefix):
    if k0.size != starts.size or k1.size != starts.size or lengths.size != starts.size:
        raise ValueError("siphash24_many needs one key and one length per message")
    out = np.empty(starts.size, np.uint64)
    for i in range(starts.size):
        out[i] = _siphash_one(k0[i], k1[i], buf, starts[i], lengths[i], prefix)
    return out


@njit(cache=True, nogil=True)
def siphash24_key(k0, k1, buf, starts, lengths, prefix, out):
    """``siphash24_many`` with every message under the one key ``(k0, k1)``, written
    to ``out``."""
    if lengths.size != starts.size or out.size != starts.size:
        raise ValueError("siphash24_key needs one length and output per message")
    for i in range(starts.size):
        out[i] = _siphash_one(k0, k1, buf, starts[i], lengths[i], prefix)
    return out


@njit(cache=True, nogil=True)
def siphash24_owned(k0, k1, owner, buf, starts, lengths, prefix, out):
    """``siphash24_many`` with message i under the key ``(k0[owner[i]],
    k1[owner[i]])``, written to ``out``."""
    if owner.size != starts.size or lengths.size != starts.size or out.size != starts.size:
        raise ValueError("siphash24_owned needs one owner, length and output per message")
    for i in range(starts.size):
        j = owner[i]
        if j < 0 or j >= k0.size or j >= k1.size:
            raise ValueError("an owner outside the key arrays")
        out[i] = _siphash_one(k0[j], k1[j], buf, starts[i], lengths[i], prefix)
    return out


@njit(cache=True, nogil=True)
def compare_spans(data, a, b, lengths):
    out = np.empty(a.size, np.bool_)
    for k in range(a.size):
        out[k] = _same_bytes(data, a[k], b[k], lengths[k])
    return out


@njit(cache=True, nogil=True)
def count_byte(buf, byte):
    count = 0
    for k in range(buf.size):
        if buf[k] == byte:
            count += 1
    return count


@njit(cache=True, nogil=True)
def line_spans(buf, starts, ends, tabs):
    """One pass over a block of ``starts.size`` lines, writing each line's start, its
    end (its ``\\n`` or the block's end, before a ``\\r`` just before it) and its
    first tab (``buf.size + 1`` when none); returns whether any byte is >= 0x80."""
    n = buf.size
    if starts.size < 1 or ends.size != starts.size or tabs.size != starts.size:
        raise ValueError("line_spans needs three arrays of one element per line")
    high = False
    line = 0
    starts[0] = 0
    tab = n + 1
    for k in range(n):
        c = buf[k]
        if c == 10:
            if line + 1 >= starts.size:
                raise ValueError("the block has more lines than line_spans was given")
            end = k
            if end > starts[line] and buf[end - 1] == 13:
                end -= 1
            ends[line] = end
            tabs[line] = tab
            line += 1
            starts[line] = k + 1
            tab = n + 1
        elif c == 9:
            if tab > n:
                tab = k
        elif c >= 128:
            high = True
    end = n
    if end > starts[line] and buf[end - 1] == 13:
        end -= 1
    ends[line] = end
    tabs[line] = tab
    return high


@njit(cache=True, inline="always")
def _same_bytes(buf, a, b, length):
    for j in range(length):
        if buf[a + j] != buf[b + j]:
            return False
    return True


@njit(cache=True, inline="always")
def _mixed_fnv(buf, s, length):
    return _mixed_fnv_from(buf, s, length, np.uint64(0xCBF29CE484222325))


@njit(cache=True, inline="always")
def _mixed_fnv_from(buf, s, length, h):
    for j in range(length):
        h = (h ^ np.uint64(buf[s + j])) * np.uint64(0x100000001B3)
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(32)
    return h


@njit(cache=True, nogil=True)
def encode_spans(buf, starts, lengths, basis, codes, firsts):
    """Exact dictionary encoding of the byte strings ``buf[starts[k]:starts[k] +
    lengths[k]]``, written to ``codes`` and ``firsts`` (each of ``starts.size``):
    each string's code (0, 1, ... in order of first appearance, as Arrow's
    ``dictionary_encode``) and the index of each code's first string; returns the
    number of codes. An open-addressing table on a 64-bit FNV-1a hash started from ``basis``
    (uint64; the hash only places strings, so the codes do not depend on it, and
    equal codes always mean equal bytes); a string equal to the one before it reuses
    its code without a lookup (a file's lines come grouped by user). The table
    holds at most half as many codes as slots and doubles when it would hold more,
    so its size follows the distinct strings, not the strings (a block of lines has
    many fewer users than lines)."""
    n = starts.size
    cap = 1024
    mask = cap - 1
    table = np.full(cap, -1, np.int64)
    distinct = 0
    for k in range(n):
        s = starts[k]
        length = lengths[k]
        if k > 0 and lengths[k - 1] == length and _same_bytes(buf, starts[k - 1], s, length):
            codes[k] = codes[k - 1]
            continue
        slot = np.int64(_mixed_fnv_from(buf, s, length, basis) & np.uint64(mask))
        while True:
            code = table[slot]
            if code < 0:
                table[slot] = distinct
                firsts[distinct] = k
                codes[k] = distinct
                distinct += 1
                if 2 * distinct > cap:  # rehash every code into a table twice as large
                    cap *= 2
                    mask = cap - 1
                    table = np.full(cap, -1, np.int64)
                    for c in range(distinct):
                        f = firsts[c]
                        at = np.int64(_mixed_fnv_from(buf, starts[f], lengths[f], basis)
                                      & np.uint64(mask))
                        while table[at] >= 0:
                            at = (at + 1) & mask
                        table[at] = c
                break
            f = firsts[code]
            if lengths[f] == length and _same_bytes(buf, starts[f], s, length):
                codes[k] = code
                break
            slot = (slot + 1) & mask
    return distinct


@njit(cache=True, nogil=True)
def gather_spans(buf, starts, lengths, offsets, out):
    """The byte strings ``buf[starts[k]:starts[k] + lengths[k]]`` (any order) copied
    one after another into ``out`` (their total length); ``offsets`` (n + 1
    entries) is filled with where each begins. Returns ``out``."""
    n = starts.size
    if lengths.size != n or offsets.size != n + 1:
        raise ValueError("gather_spans needs one length per string and n + 1 offsets")
    total = 0
    offsets[0] = 0
    for k in range(n):
        if lengths[k] < 0 or starts[k] < 0 or starts[k] + lengths[k] > buf.size:
            raise ValueError("gather_spans needs spans within the buffer")
        total += lengths[k]
        offsets[k + 1] = total
    if out.size != total:
        raise ValueError("gather_spans' output must hold the strings' total length")
    for k in range(n):
        o = offsets[k]
        s = starts[k]
        for j in range(lengths[k]):
            out[o + j] = buf[s + j]
    return out


@njit(cache=True, nogil=True)
def item_keys(buf, starts, lengths, line_code, bits, index_bits, out):
    """``out[k] = (line_code[k] << (64 - bits)) | (h(item k) >> bits)``, ``h`` the 64-bit
    FNV-1a of the item's bytes with a final mix (``dp.data.columnar.mixed_fnv``'s value),
    its lowest ``index_bits`` bits then replaced by k; returns ``out``."""
    n = starts.size
    if lengths.size != n or line_code.size != n or out.size != n:
        raise ValueError("item_keys needs one length, code and output per string")
    if bits < 1 or bits > 63 or index_bits < 0 or bits + index_bits > 64 or (
            index_bits > 0 and index_bits < 63 and n > (1 << index_bits)):
        raise ValueError("item_keys needs 1 to 63 user bits, and index bits for every line "
                         "within the 64")
    high = np.uint64(64 - bits)
    low = np.uint64(bits)
    index = np.uint64(index_bits)
    for k in range(n):
        key = (np.uint64(line_code[k]) << high) | (_mixed_fnv(buf, starts[k], lengths[k]) >> low)
        if index_bits:
            key = ((key >> index) << index) | np.uint64(k)
        out[k] = key
    return out


@njit(cache=True, nogil=True)
def sorted_repeats(buf, starts, lengths, keys):
    """Whether string k (``buf[starts[k]:starts[k] + lengths[k]]``) repeats string
    k - 1: equal ``keys`` and equal bytes."""
    n = starts.size
    out = np.zeros(n, np.bool_)
    for k in range(1, n):
        if (keys[k] == keys[k - 1] and lengths[k] == lengths[k - 1]
                and _same_bytes(buf, starts[k - 1], starts[k], lengths[k])):
            out[k] = True
    return out


@njit(cache=True, nogil=True)
def is_sorted(a):
    """Whether ``a`` is in non-decreasing order."""
    for k in range(1, a.size):
        if a[k] < a[k - 1]:
            return False
    return True


@njit(cache=True, nogil=True)
def smallest_distinct(owner, scores, max_items, keep):
    """For ``owner`` sorted: whether element k's score is among the ``max_items``
    smallest distinct scores of its owner's elements (equal scores share a rank),
    written to ``keep`` (returned). One small sort per owner with more than
    ``max_items`` elements."""
    n = owner.size
    if scores.size != n or keep.size != n:
        raise ValueError("smallest_distinct needs one score and output per element")
    keep[:] = True
    a = 0
    while a < n:
        b = a + 1
        while b < n and owner[b] == owner[a]:
            b += 1
        if b - a > max_items:
            ordered = np.sort(scores[a:b])
            distinct = 1
            cut = ordered[0]  # the largest of the first ``distinct`` distinct scores
            for j in range(1, b - a):
                if ordered[j] != ordered[j - 1]:
                    if distinct == max_items:
                        break
                    distinct += 1
                    cut = ordered[j]
            for k in range(a, b):
                keep[k] = scores[k] <= cut
        a = b
    return keep


#: ``without_repeats``: a line is compared with at most this many kept lines of its run
#: of equal keys (distinct items share a key only by a collision of their truncated
#: hash; a longer run, which crafted items could make, leaves repeats, never merges).
RUN_CHECKS = 8


@njit(cache=True, nogil=True)
def without_repeats(buf, starts, lengths, keys, index_bits, line_code, codes, out_starts,
                    out_lengths):
    """For ``keys`` sorted, each holding a line's index in its lowest ``index_bits``
    bits (1 to 63): ``(line_code, starts, lengths)`` of the lines in that order,
    without each string equal (same bytes) to one kept before it in its run of
    equal keys above the index (among the last ``RUN_CHECKS`` kept of the run: a
    collision of two items' truncated hashes interleaves their lines), written to
    the first m elements of ``codes``, ``out_starts`` and ``out_lengths`` (each of
    ``keys.size``) in one pass; returns m."""
    n = keys.size
    if codes.size < n or out_starts.size < n or out_lengths.size < n:
        raise ValueError("without_repeats needs an output of each array per line")
    if index_bits < 1 or index_bits > 63:
        raise ValueError("without_repeats needs 1 to 63 index bits")
    shift = np.uint64(index_bits)
    mask = (np.uint64(1) << shift) - np.uint64(1)
    m = 0
    run = 0  # the kept lines of the current run of equal keys: the last ``run`` of the output
    for j in range(n):
        k = np.int64(keys[j] & mask)
        if k < 0 or k >= starts.size or k >= lengths.size or k >= line_code.size:
            raise ValueError("a key's index outside the lines")
        if j > 0 and (keys[j] >> shift) == (keys[j - 1] >> shift):
            repeat = False
            for q in range(m - 1, m - 1 - min(run, RUN_CHECKS), -1):
                if out_lengths[q] == lengths[k] and _same_bytes(buf, out_starts[q], starts[k],
                                                                 lengths[k]):
                    repeat = True
                    break
            if repeat:
                continue
        else:
            run = 0
        codes[m] = line_code[k]
        out_starts[m] = starts[k]
        out_lengths[m] = lengths[k]
        m += 1
        run += 1
    return m
