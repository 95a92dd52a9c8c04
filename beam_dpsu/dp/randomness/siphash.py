"""SipHash-2-4, the keyed pseudo-random function of the release rules' noise.

SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF",
INDOCRYPT 2012) maps a 128-bit secret key and a message of any length to 64
bits. Its designers built it as a pseudo-random function for short inputs and
claim PRF security up to about 2^64 queries per key; no attack better than
generic is known. It replaces keyed BLAKE2b where the library must draw one
noise value per item for millions of items: it vectorises over an array of
messages with a few dozen integer operations on uint64 arrays
(``siphash24_many``), where BLAKE2b would need a call per item from Python.

``siphash24`` is SipHash-2-4 itself (the published test vectors hold for it,
``tests/test_siphash.py``). ``prf64`` is the keyed function the library uses: SipHash-2-4
of messages up to ``LEAF_BYTES`` bytes, and a tree of SipHash-2-4 calls above
(``prf64``'s docstring). ``siphash24_many`` computes ``prf64`` for many messages at once
and is tested against it: compiled by numba when it is installed and the process has
enough work for it (``dp.randomness.compiled``; about 30 ns a message), otherwise as numpy
operations on uint64 arrays (about 0.5 µs a message).

Why a tree for long messages: SipHash absorbs a message one 8-byte word after the
other, so numpy can only work across messages, never along one; a 1 MB item took
131,072 sequential steps of a dozen numpy calls each (tens of seconds). The tree cuts
a long message into ``LEAF_BYTES`` pieces hashed side by side, so hashing costs about
the same per byte at every length, on the base install too.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from beam_dpsu.dp.randomness import compiled
from beam_dpsu.dp.randomness.buffers import empty
from beam_dpsu.dp.randomness.sip_state import C0 as _C0, C1 as _C1, C2 as _C2, C3 as _C3

__all__ = ["LEAF_BYTES", "siphash24", "prf64", "siphash24_many", "siphash24_many_keys",
           "split_key"]

_MASK = (1 << 64) - 1


def split_key(key: bytes):
    """The two little-endian 64-bit halves of a 16-byte SipHash key."""
    if len(key) != 16:
        raise ValueError(f"a SipHash key has 16 bytes, got {len(key)}")
    return int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def _rounds(v0, v1, v2, v3, n):
    for _ in range(n):
        v0 = (v0 + v1) & _MASK
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = (v2 + v3) & _MASK
        v3 = _rotl(v3, 16) ^ v2
        v0 = (v0 + v3) & _MASK
        v3 = _rotl(v3, 21) ^ v0
        v2 = (v2 + v1) & _MASK
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24(key: bytes, message: bytes) -> int:
    """SipHash-2-4 of ``message`` under the 16-byte ``key``, as an int in [0, 2^64)."""
    k0, k1 = split_key(key)
    v0, v1, v2, v3 = k0 ^ _C0, k1 ^ _C1, k0 ^ _C2, k1 ^ _C3
    n = len(message)
    full = n - n % 8
    for i in range(0, full, 8):
        m = int.from_bytes(message[i:i + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _rounds(v0, v1, v2, v3, 2)
        v0 ^= m
    b = ((n & 0xFF) << 56) | int.from_bytes(message[full:], "little")
    v3 ^= b
    v0, v1, v2, v3 = _rounds(v0, v1, v2, v3, 2)
    v0 ^= b
    v2 ^= 0xFF
    v0, v1, v2, v3 = _rounds(v0, v1, v2, v3, 4)
    return v0 ^ v1 ^ v2 ^ v3


#: Messages up to this many bytes are hashed by SipHash-2-4 itself; longer ones by the
#: tree of ``prf64``, whose nodes are LEAF_BYTES + 16 bytes long (never a direct message).
LEAF_BYTES = 1024
_NODE_WORDS = LEAF_BYTES // 8 + 2


def _node(piece: bytes, index: int, level: int, level_length: int) -> bytes:
    """A tree node's message: the piece zero-padded to LEAF_BYTES, then the little-endian
    64-bit words ``index`` and ``level·2^56 + level_length``."""
    return (piece.ljust(LEAF_BYTES, b"\0") + index.to_bytes(8, "little")
            + ((level << 56) | level_length).to_bytes(8, "little"))


def prf64(key: bytes, message: bytes) -> int:
    """The library's keyed 64-bit PRF of ``message`` under the 16-byte ``key``.

    Up to ``LEAF_BYTES`` bytes: ``siphash24(key, message)``. Longer: a tree. Level 1
    cuts the message into LEAF_BYTES pieces; piece i becomes the node message
    ``piece ‖ 0-padding ‖ le64(i) ‖ le64(1·2^56 + n)`` (n the message's length) and
    its value is ``siphash24`` of that node. Level ℓ + 1 does the same to the
    concatenated 8-byte little-endian values of level ℓ (with ℓ + 1 and that
    concatenation's length), until a level has one node: its value is the result.

    Security (the proofs need a PRF, ``docs/mechanisms.md`` section 1.1): every node
    message is LEAF_BYTES + 16 bytes long, so it is never a short message hashed
    directly, and it names its position (index, level, length of its level), so two
    positions never share a node message unless their contents are equal. With
    SipHash-2-4 replaced by a random function, two distinct long messages get the same
    value only if, at some level, all their differing nodes' values collide:
    probability at most (levels)·2^-64 for the pair (messages of different lengths
    differ in their top node's length field), the order of a random 64-bit function's
    own collisions (2^-64 a pair). So ``prf64`` is a PRF with advantage at most
    SipHash-2-4's on the node queries plus C(q, 2)·(levels)·2^-64 over q messages. The
    length field holds 56 bits: messages of 2^56 bytes or more are out of reach.
    """
    if len(message) <= LEAF_BYTES:
        return siphash24(key, message)
    data, level = bytes(message), 0
    while True:
        level += 1
        values = [siphash24(key, _node(data[at:at + LEAF_BYTES], i, level, len(data)))
                  for i, at in enumerate(range(0, len(data), LEAF_BYTES))]
        if len(values) == 1:
            return values[0]
        data = b"".join(v.to_bytes(8, "little") for v in values)


_U = np.uint64


def _rounds_many(v, n, tmp):
    """``n`` SipRounds on the state arrays ``v`` in place (``tmp``: scratch of their size)."""
    v0, v1, v2, v3 = v
    shl, shr, xor = np.left_shift, np.right_shift, np.bitwise_xor
    for _ in range(n):
        for a, b, r, s in ((v0, v1, 13, 32), (v2, v3, 16, None), (v0, v3, 21, None),
                           (v2, v1, 17, 32)):
            a += b
            shr(b, _S[r][1], out=tmp)  # b = rotl(b, r) ^ a
            shl(b, _S[r][0], out=b)
            b |= tmp
            xor(b, a, out=b)
            if s is not None:  # a = rotl(a, 32)
                shr(a, _S[32][1], out=tmp)
                shl(a, _S[32][0], out=a)
                a |= tmp


_S = {b: (_U(b), _U(64 - b)) for b in (13, 16, 17, 21, 32)}


def siphash24_many(key: bytes, data, starts, lengths, prefix: Optional[int] = None
                   ) -> np.ndarray:
    """SipHash-2-4 under ``key`` of many messages held in one byte buffer.

    Message ``i`` is ``data[starts[i]:starts[i] + lengths[i]]``, preceded by the
    single byte ``prefix`` when it is given (e.g. the type tag of
    ``noise.encode_value``, so that the message is an item's canonical bytes
    without copying them). Returns a uint64 array of the values ``prf64`` gives
    for each message (``siphash24``'s up to ``LEAF_BYTES`` bytes).

    Args:
      key: 16 bytes.
      data: the bytes (``bytes``, ``memoryview`` or a uint8 array).
      starts, lengths: integer arrays of equal length (lengths >= 0, each
        message within ``data``).
      prefix: None or a byte value 0..255.
    """
    k0, k1 = split_key(key)
    n = len(starts)
    if _any_long(lengths, prefix):
        return siphash24_many_keys(np.array([k0], np.uint64), np.array([k1], np.uint64), data,
                                   starts, lengths, prefix, owner=np.zeros(n, np.int64))
    kernel = compiled.kernel("siphash24_key", n)
    if kernel is not None:  # the key once, not copied per message
        return kernel(np.uint64(k0), np.uint64(k1), _bytes_array(data),
                      np.asarray(starts, dtype=np.int64),
                      np.asarray(lengths, dtype=np.int64),
                      -1 if prefix is None else int(prefix), empty(n, np.uint64))
    return siphash24_many_keys(np.full(n, k0, np.uint64), np.full(n, k1, np.uint64), data,
                               starts, lengths, prefix)


def siphash24_many_keys(k0, k1, data, starts, lengths, prefix: Optional[int] = None,
                        owner: Optional[np.ndarray] = None, out: Optional[np.ndarray] = None
                        ) -> np.ndarray:
    """``siphash24_many`` with a key per message: message ``i`` under the key whose
    little-endian halves are ``k0[i]`` and ``k1[i]`` (uint64 arrays), or, with
    ``owner`` (an integer array, one element per message), ``k0[owner[i]]`` and
    ``k1[owner[i]]`` (a key per owner, not gathered per message). ``out``: a uint64
    array of one element per message to write the values to (then returned). Values
    are ``prf64``'s: messages longer than ``LEAF_BYTES`` go through its tree."""
    if _any_long(lengths, prefix):
        return _with_tree(k0, k1, data, starts, lengths, prefix, owner, out)
    return _plain_many_keys(k0, k1, data, starts, lengths, prefix, owner, out)


def _plain_many_keys(k0, k1, data, starts, lengths, prefix=None, owner=None, out=None):
    """``siphash24_many_keys`` by SipHash-2-4 itself, whatever the messages' lengths."""
    buf = _bytes_array(data)
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    k0 = np.asarray(k0, dtype=np.uint64)
    k1 = np.asarray(k1, dtype=np.uint64)
    code = -1 if prefix is None else int(prefix)
    n = len(starts)
    if len(lengths) != n or (out is not None and (out.dtype != np.uint64 or len(out) != n)):
        raise ValueError("one length per message, and out (when given) a uint64 array "
                         "of one element per message")
    if owner is not None:
        owner = np.asarray(owner, dtype=np.int64)
        if len(owner) != n:
            raise ValueError("one owner per message")
        kernel = compiled.kernel("siphash24_owned", n)
        if kernel is not None:  # it checks every owner itself, in its one pass
            if out is None:
                out = np.empty(n, np.uint64)
            return kernel(k0, k1, owner, buf, starts, lengths, code, out)
        if n and (owner.min() < 0 or owner.max() >= min(len(k0), len(k1))):
            raise ValueError("an owner outside the key arrays")
        k0, k1 = k0[owner], k1[owner]
        values = _numpy_many(k0, k1, buf, starts, lengths, prefix)
    else:
        if len(k0) != n or len(k1) != n:
            raise ValueError("one key (k0, k1) per message")
        kernel = compiled.kernel("siphash24_many", n)
        values = (kernel(k0, k1, buf, starts, lengths, code) if kernel is not None
                  else _numpy_many(k0, k1, buf, starts, lengths, prefix))
    if out is None:
        return values
    out[:] = values
    return out


def _any_long(lengths, prefix) -> bool:
    lengths = np.asarray(lengths, dtype=np.int64)
    return bool(lengths.size) and int(lengths.max()) + (prefix is not None) > LEAF_BYTES


def _with_tree(k0, k1, data, starts, lengths, prefix, owner, out):
    """``siphash24_many_keys`` of a batch holding messages longer than LEAF_BYTES: the
    short ones directly, the long ones by ``prf64``'s tree, every level at once."""
    buf = _bytes_array(data)
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    k0 = np.asarray(k0, dtype=np.uint64)
    k1 = np.asarray(k1, dtype=np.uint64)
    n = len(starts)
    if len(lengths) != n or (out is not None and (out.dtype != np.uint64 or len(out) != n)):
        raise ValueError("one length per message, and out (when given) a uint64 array "
                         "of one element per message")
    if owner is None:
        if len(k0) != n or len(k1) != n:
            raise ValueError("one key (k0, k1) per message")
        owner = np.arange(n, dtype=np.int64)
    else:
        owner = np.asarray(owner, dtype=np.int64)
        if len(owner) != n:
            raise ValueError("one owner per message")
        if n and (owner.min() < 0 or owner.max() >= min(len(k0), len(k1))):
            raise ValueError("an owner outside the key arrays")
    if out is None:
        out = np.empty(n, np.uint64)
    pre = 0 if prefix is None else 1
    long = lengths + pre > LEAF_BYTES
    short = np.flatnonzero(~long)
    if short.size:
        out[short] = _plain_many_keys(k0, k1, buf, starts[short], lengths[short], prefix,
                                      owner=owner[short])
    at = np.flatnonzero(long)
    out[at] = _tree_many(k0, k1, owner[at], buf, starts[at] - pre, lengths[at] + pre,
                         prefix)
    return out


def _tree_many(k0, k1, owner, buf, starts, lengths, prefix, level=1):
    """``prf64``'s tree from ``level`` up, of the messages ``buf[starts[i]:starts[i] +
    lengths[i]]``, message i under the key of ``owner[i]``. With ``prefix`` (level 1
    only) a message's first byte is ``prefix`` (its span then starts one byte before
    its data, possibly at -1). Every node of a level is hashed in one batch."""
    pieces = -(-lengths // LEAF_BYTES)                      # ceil, at least 1
    first = np.zeros(len(lengths), np.int64)
    np.cumsum(pieces[:-1], out=first[1:])
    total = int(pieces.sum())
    message = np.repeat(np.arange(len(lengths)), pieces)
    index = np.arange(total, dtype=np.int64) - first[message]
    nodes = np.zeros((total, _NODE_WORDS), dtype="<u8")
    node_bytes = nodes.view(np.uint8)
    begin = starts[message] + index * LEAF_BYTES
    size = np.minimum(lengths[message] - index * LEAF_BYTES, LEAF_BYTES)
    # The pieces as rows of LEAF_BYTES-wide windows of the bytes the messages span (padded by a
    # byte before, for a prefix at -1, and a piece's width after): one row copy each.
    lo_at = int(starts.min())
    hi_at = int((starts + lengths).max())
    span = np.zeros(hi_at - lo_at + LEAF_BYTES, np.uint8)
    have = slice(max(lo_at, 0), min(hi_at, len(buf)))
    span[have.start - lo_at:have.stop - lo_at] = buf[have]
    windows = np.lib.stride_tricks.as_strided(
        span, shape=(len(span) - LEAF_BYTES + 1, LEAF_BYTES), strides=(1, 1), writeable=False)
    cols = np.arange(LEAF_BYTES, dtype=np.int64)
    step = max(1, (1 << 24) // LEAF_BYTES)                  # bounded temporaries
    for lo in range(0, total, step):
        hi = min(total, lo + step)
        rows = windows[begin[lo:hi] - lo_at]
        rows[cols[None, :] >= size[lo:hi, None]] = 0        # past the message: zero
        node_bytes[lo:hi, :LEAF_BYTES] = rows
    if prefix is not None:
        node_bytes[first, 0] = prefix
    nodes[:, _NODE_WORDS - 2] = index.astype(np.uint64)
    nodes[:, _NODE_WORDS - 1] = (_U(level) << _U(56)) | lengths[message].astype(np.uint64)
    node_len = LEAF_BYTES + 16
    hashed = _plain_many_keys(k0, k1, node_bytes.reshape(-1),
                              np.arange(total, dtype=np.int64) * node_len,
                              np.full(total, node_len, np.int64), None,
                              owner=owner[message]).astype("<u8", copy=False)
    result = hashed[first]
    rest = np.flatnonzero(pieces > 1)
    if rest.size:  # their values, contiguous per message, are the next level's messages
        result[rest] = _tree_many(k0, k1, owner[rest], hashed.view(np.uint8),
                                  first[rest] * 8, pieces[rest] * 8, None, level + 1)
    return result


def _bytes_array(data) -> np.ndarray:
    """``data`` (bytes, a memoryview or a uint8 array) as a uint8 array, not copied."""
    return data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)


def _numpy_many(k0, k1, buf, starts, lengths, prefix):
    n = len(starts)
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    pre = 0 if prefix is None else 1
    total = lengths + pre
    nfull = total // 8
    # Longest messages first: the messages still absorbing word j are a prefix.
    order = np.argsort(-nfull, kind="stable")
    s, t, f = starts[order] - pre, total[order], nfull[order]
    # 8 zero bytes before (a prefix of the first message sits at -1) and after;
    # the buffer read as aligned little-endian words.
    size = (len(buf) + 31) // 8 * 8
    padded = np.zeros(size, np.uint8)
    padded[8:8 + len(buf)] = buf
    aligned = padded.view("<u8")
    one, s63 = _U(1), _U(63)

    def word_at(p, width=None):
        # the 8 bytes at positions p (little-endian), of which the first ``width``
        # are kept; the prefix byte where p is a message's position -1
        q = p + 8
        i = q >> 3
        sh = ((q & 7) << 3).astype(np.uint64)
        w = (aligned[i] >> sh) | ((aligned[i + 1] << one) << (s63 - sh))
        if width is not None:
            w &= (one << (width.astype(np.uint64) << _U(3))) - one
        return w

    k0, k1 = k0[order], k1[order]
    v = [k0 ^ _U(_C0), k1 ^ _U(_C1), k0 ^ _U(_C2), k1 ^ _U(_C3)]
    neg_f = -f  # ascending
    tmp = np.empty(n, np.uint64)
    for j in range(int(f[0])):
        count = int(np.searchsorted(neg_f, -j, side="left"))  # messages with f > j
        m = word_at(s[:count] + 8 * j)
        if pre and j == 0:
            m &= ~_U(0xFF)
            m |= _U(prefix)
        sub = [x[:count] for x in v]  # views: updated in place
        sub[3] ^= m
        _rounds_many(sub, 2, tmp[:count])
        sub[0] ^= m
    rest = t - 8 * f
    b = word_at(s + 8 * f, rest)
    if pre:
        first = f == 0  # the prefix is in the last block
        b[first] = (b[first] & ~_U(0xFF)) | _U(prefix)
    b |= (t & 0xFF).astype(np.uint64) << _U(56)
    v[3] ^= b
    _rounds_many(v, 2, tmp)
    v[0] ^= b
    v[2] ^= np.uint64(0xFF)
    _rounds_many(v, 4, tmp)
    out[order] = v[0] ^ v[1] ^ v[2] ^ v[3]
    return out


