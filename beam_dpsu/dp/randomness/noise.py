"""Randomness: the per-run secret key, keyed hashes and noise samplers.

Every random choice that affects a release is derived from one secret
``RunKey`` through pseudo-random functions (HMAC-SHA256 for the purposes'
subkeys and the seeds of keyed generators, keyed BLAKE2b, and SipHash-2-4 in
``dp.randomness.siphash``; docs/mechanisms.md section 1.1):

* contribution-bounding samples (a uniformly random Δ0-subset of a user's
  items: the Δ0 smallest SipHash-2-4 scores under the user's own key,
  ``dp.data.contribution.sample_items``),
* the order of users for the sequential policies (keyed BLAKE2b),
* the noise added to each item's weight (``PRF(key, item)`` gives the uniform
  bits that an inverse-CDF sampler turns into Laplace, Gaussian or Gumbel
  noise: SipHash-2-4 in the release rules' ``ItemBits``, keyed BLAKE2b in
  ``KeyedNoise``), and the generators of grid and peeling noise
  (``keyed_generator``).

By default the key is 32 bytes from the operating system (``secrets``), fresh
for every ``RunKey.fresh()`` call. A seed exists only as an explicit test
option (``RunKey.from_test_seed``) and the key then says it was seeded.

Deriving every draw from the key, rather than from a generator's state, has
three consequences the library relies on: a runner that retries a bundle
recomputes exactly the same draws (a retry cannot leak a second draw); the
released set does not depend on how a runner splits or orders elements; and
with a test seed the DirectRunner, the portable runner and the Beam-free core
give identical results.

Precision: a draw's uniform is an unbounded string of keyed bits (its first 64 bits,
then further keyed blocks read only when needed), so no sampler has a smallest step or
a largest draw short of the smallest double: a release decision is a Bernoulli trial
whose success probability is the double it is given (``uniform_below``), and the
Laplace, Gaussian and Gumbel samplers have full relative precision in their tails
(``half_uniform``). docs/mechanisms.md section 1.2 has the argument.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from fractions import Fraction
from typing import Any, Optional

import numpy as np

from beam_dpsu.dp.privacy.calibration import check_flag, normal_isf

__all__ = ["encode_value", "RunKey", "DetachedKeyError", "test_seed_material", "keyed_hash64",
           "KeyedHash64", "keyed_seed", "keyed_generator", "block_key", "MAX_BLOCKS",
           "SMALLEST_DOUBLE", "uniform_below", "half_uniform", "half_uniform_many",
           "laplace_from_stream", "gaussian_from_stream", "gumbel_from_stream", "laplace_many",
           "gaussian_many", "gumbel_many", "keyed_gumbel_many", "KeyedNoise",
           "GRID_BITS", "grid_granularity", "round_to_grid", "two_sided_geometric",
           "exponential_from_stream", "discrete_laplace_on_grid", "KeyedGridLaplace", "STR_TAG", "canonical_spans",
           "ItemBits"]




def encode_value(value: Any) -> bytes:
    """Canonical bytes of a user id or an item, for keyed hashing.

    Distinct values of the common types never collide: strings are UTF-8
    (lone surrogates allowed), bytes pass through, and other values use their
    ``repr``; a one-byte type tag separates the three.

    For the ids the library accepts (``str``, ``bytes``, ``int`` and tuples of
    these: ``dp.data.contribution.canonical_id``) two values are equal in Python
    exactly when their encodings are equal. For other values they can disagree
    (``1 == True``, but ``b"rint:1" != b"rbool:True"``), which is why the
    transforms refuse them before grouping users or items.
    """
    if isinstance(value, str):
        return b"s" + value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bytes, bytearray)):
        return b"b" + bytes(value)
    return b"r" + type(value).__name__.encode() + b":" + repr(value).encode("utf-8", "surrogatepass")


class RunKey:
    """The secret of one run, from which every random draw is derived.

    Create it with ``RunKey.fresh()`` (OS randomness, the default everywhere)
    or, in tests only, ``RunKey.from_test_seed(seed)``.

    Where the secret lives
    ----------------------
    A fresh key draws its 32 bytes from the operating system the first time
    it is used *in the process that uses it*, and its bytes are never
    pickled: pickling a fresh key (or one built from explicit bytes) gives a
    detached copy that raises ``DetachedKeyError`` when used. So a fresh key
    passed to a Beam transform never reaches the job graph, the staging bucket
    or a runner's UI. Inside a pipeline the transforms do not use the key
    object at all: ``pipeline_key(pipeline, run_key)`` adds a step that draws
    the bytes on a worker, once per run, and every DoFn reads them from that
    singleton side input (see ``beam_dpsu.transforms.run_key``). Transforms given the same
    ``RunKey`` object in one pipeline share one drawn key; the Beam-free core
    (``dp.mechanisms.base.run_local``) draws its own bytes in the calling process.

    A test-seeded key pickles as its seed (the key is a public function of the
    seed; a seeded run is not private and says so).

    Args (of the constructor; use ``RunKey.fresh()`` for a release and
    ``RunKey.from_test_seed(n)`` for a test, rather than building one from bytes):
      key: the key material, at least 16 bytes (32 from ``secrets`` for a fresh key).
        Whoever knows these bytes can recompute every draw of the release: they must
        be secret and used for one release only.
      seeded: True marks the key as derived from a known seed (default False); the
        summaries of a run with such a key say ``seeded: true`` (NOT private).
    """

    __slots__ = ("_key", "seeded", "_subkeys", "_seed", "_handle")

    def __init__(self, key: bytes, seeded: bool = False):
        if not isinstance(key, (bytes, bytearray)) or len(key) < 16:
            raise ValueError("a RunKey needs at least 16 bytes of key material")
        self._key: Optional[bytes] = bytes(key)
        self.seeded = check_flag(seeded, "seeded")
        self._subkeys = {}
        self._seed: Optional[int] = None
        self._handle: Optional[str] = None

    @classmethod
    def fresh(cls) -> "RunKey":
        """A new key: 32 bytes from the operating system's CSPRNG, drawn on first use.

        The bytes are drawn lazily (in the process that first derives a subkey)
        and never pickled; in a pipeline they are drawn on a worker instead
        (see the class docstring).
        """
        key = cls.__new__(cls)
        key._key = None
        key.seeded = False
        key._subkeys = {}
        key._seed = None
        key._handle = "fresh:" + secrets.token_hex(16)  # names the key, reveals nothing
        return key

    @classmethod
    def from_test_seed(cls, seed: int) -> "RunKey":
        """A deterministic key for tests and reproducible experiments.

        Args:
          seed: an integer; the key is a public function of it.

        A seeded run is NOT private against anyone who knows the seed; outputs
        of seeded runs report ``seeded: true``.
        """
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"a test seed must be an integer, got {seed!r}")
        key = cls(test_seed_material(seed), seeded=True)
        key._seed = int(seed)
        return key

    @classmethod
    def resolve(cls, run_key: Optional["RunKey"]) -> "RunKey":
        """``run_key`` itself, or a fresh OS-random key when it is None."""
        if run_key is None:
            return cls.fresh()
        if not isinstance(run_key, RunKey):
            raise ValueError(f"run_key must be a beam_dpsu.dp.randomness.noise.RunKey or None, got {run_key!r}")
        return run_key

    @property
    def test_seed(self) -> Optional[int]:
        """The test seed this key was derived from, or None."""
        return self._seed

    @property
    def handle(self) -> Optional[str]:
        """A public name of a fresh key (None for seeded and explicit keys)."""
        return self._handle

    def _material(self) -> bytes:
        key = self._key
        if key is None:
            if self._handle is None:
                raise DetachedKeyError(
                    "this RunKey was unpickled from a copy that carries no secret: a key's "
                    "bytes never leave the process that drew them. Inside a pipeline, read "
                    "the key from beam_dpsu.transforms.run_key.pipeline_key's side input instead.")
            key = self._key = secrets.token_bytes(32)
        return key

    def subkey(self, purpose: str) -> bytes:
        """A key for one purpose (domain separation), e.g. ``'sample/0'``."""
        sub = self._subkeys.get(purpose)
        if sub is None:
            sub = hmac.digest(self._material(), b"beam_dpsu/" + purpose.encode(), "sha256")[:32]
            self._subkeys[purpose] = sub
        return sub

    def __reduce__(self):
        if self._seed is not None:
            return _seeded_key, (self._seed,)
        return _detached_key, (self.seeded,)

    def __repr__(self) -> str:  # never print the secret
        return f"RunKey(seeded={self.seeded})"

    def _identity(self):
        if self._seed is not None:
            return ("seed", self._seed)
        if self._handle is not None:
            return ("handle", self._handle)
        return ("material", hashlib.sha256(self._material()).digest())

    def __eq__(self, other) -> bool:
        return isinstance(other, RunKey) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())


class DetachedKeyError(RuntimeError):
    """A pickled copy of a fresh or explicit RunKey was used (it carries no secret)."""


def test_seed_material(seed: int) -> bytes:
    """The 32 key bytes of ``RunKey.from_test_seed(seed)`` (public: a seed is not a secret)."""
    return hashlib.sha256(b"beam_dpsu test seed:" + str(int(seed)).encode()).digest()


def _seeded_key(seed: int) -> "RunKey":
    return RunKey.from_test_seed(seed)


def _detached_key(seeded: bool) -> "RunKey":
    key = RunKey.__new__(RunKey)
    key._key = None
    key.seeded = seeded
    key._subkeys = {}
    key._seed = None
    key._handle = None
    return key


def keyed_hash64(key: bytes, message: bytes) -> int:
    """A 64-bit pseudo-random function of ``message`` under ``key``.

    Keyed BLAKE2b (RFC 7693's MAC mode), which plays the role of HMAC in the
    design (``docs/mechanisms.md`` section 1): a PRF whose outputs are
    independent uniform bits for distinct messages and unpredictable without
    the key. It is used
    instead of HMAC-SHA256 because it costs a third as much per call in CPython,
    and this function runs once per released candidate item.
    """
    return int.from_bytes(hashlib.blake2b(message, key=key, digest_size=8).digest(), "big")


class KeyedHash64:
    """``keyed_hash64(key, prefix + ·)`` with the key (and prefix) set up once: the
    same values, cheaper.

    Keyed BLAKE2b compresses the (padded) key as a first block; this object
    does that once, absorbs ``prefix`` (default none), and copies that state
    for each message (about a third less time per call in CPython), for the
    loops that hash one item after another (the release rules, the item ids).
    Pickles as its key and prefix, like the objects holding it.
    """

    __slots__ = ("_key", "_prefix", "_base")

    def __init__(self, key: bytes, prefix: bytes = b""):
        self._key = bytes(key)
        self._prefix = bytes(prefix)
        self._base = hashlib.blake2b(key=self._key, digest_size=8)
        if self._prefix:
            self._base.update(self._prefix)

    def __call__(self, message: bytes) -> int:
        h = self._base.copy()
        h.update(message)
        return int.from_bytes(h.digest(), "big")

    def fresh(self):
        """A new hashlib state that has absorbed the key and the prefix: after
        ``.update(message)``, its 8-byte big-endian ``digest()`` is ``self(message)``.
        For loops that cannot afford a call per message."""
        return self._base.copy()

    def __getstate__(self):
        return (self._key, self._prefix)

    def __setstate__(self, state):
        self.__init__(*state)


def keyed_seed(key: bytes, message: bytes) -> int:
    """A 256-bit seed for a numpy generator: HMAC-SHA256(key, message) as an int."""
    return int.from_bytes(hmac.digest(key, message, "sha256"), "big")


def keyed_generator(key: bytes, message: bytes) -> np.random.Generator:
    """A numpy generator seeded with ``keyed_seed(key, message)``.

    The seed is a PRF of a secret, OS-random run key, so the stream is fresh
    for every run and every message, yet the same on a retry.
    """
    return np.random.Generator(np.random.PCG64(keyed_seed(key, message)))


# --------------------------------------------------------------------------
# Samplers with no floor: a uniform is an unbounded string of keyed bits.
# --------------------------------------------------------------------------
#
# Turning 64 bits into a double would give every sampler a smallest positive
# probability (2^-64, or 2^-52 after rounding) and cut every tail there: a keep
# probability below it would round to 0 or to one step, and a noise draw could never
# pass some distance, while the library accepts a δ smaller than either. Here the
# uniform U of a draw is the binary fraction 0.b1 b2 b3 ... whose first 64 bits are
# the draw's keyed bits and whose further bits come, 64 at a time and only when a
# draw needs them, from independent keyed blocks (``ItemBits.block``; a ``more``
# callable gives block j >= 1 of the draws it is asked for). Two operations are exact:
#
# * ``uniform_below``: the decision U < q for a double q, a Bernoulli trial whose
#   success probability is q itself, down to the smallest double: a tie on the
#   first bits (probability 2^-63 or 2^-64) reads the next block, and so on; q is a
#   dyadic rational, so at most 18 blocks are ever read.
# * ``half_uniform``: a double p uniform in (0, 1/2) with a relative error of at most
#   2^-53 however small p is (a floating exponent: more blocks are read while the
#   leading bits are zeros), bounded below only by the smallest positive double.
#
# The release rules decide U < P(noise > gap) with the tail probability computed in
# closed form (no inverse CDF, no largest draw); the Gumbel samplers use
# ``half_uniform`` in both tails. Read docs/mechanisms.md section 1.2.

_LOW63 = np.uint64(0x7FFFFFFFFFFFFFFF)
_TWO_POW_M64 = 2.0 ** -64

#: The number of 64-bit blocks a dyadic double q (a multiple of 2^-1074) can need
#: beyond the head: after them the remainder of q is 0.
MAX_BLOCKS = 18
#: The smallest positive double, the floor of ``half_uniform`` (reached with probability
#: below 2^-1074).
SMALLEST_DOUBLE = 5e-324


def uniform_below(head: np.ndarray, width: int, q: np.ndarray, more) -> np.ndarray:
    """U < q for each draw, exactly: a Bernoulli trial of success probability ``q``.

    U = 0.h₁…h_width b₁ b₂ … : the low ``width`` bits (63 or 64) of ``head``, then
    the bits of the 64-bit blocks ``more(indices, j)`` (j = 1, 2, …) of the draws at
    ``indices``, read only where the head ties with q (probability 2^-width each).
    q ≤ 0 (or NaN) is never below, q ≥ 1 always.

    Args:
      head: uint64 array, the draws' first bits.
      width: how many low bits of ``head`` start U (63: the top bit serves as a sign).
      q: float64 array of the same length, the probabilities.
      more: ``more(indices, j) -> uint64 array``, block j of the draws at ``indices``.
    """
    head = np.asarray(head, dtype=np.uint64)
    q = np.asarray(q, dtype=np.float64)
    if width == 63:
        head = head & _LOW63
    elif width != 64:
        raise ValueError(f"width must be 63 or 64, got {width!r}")
    out = q >= 1.0
    inside = np.flatnonzero((q > 0.0) & (q < 1.0))
    if inside.size:
        scaled = q[inside] * (2.0 ** width)  # exact: a power of two, below 2^width
        whole = np.floor(scaled)
        bound = whole.astype(np.uint64)  # exact: an integer-valued double below 2^64
        h = head[inside]
        out[inside] = h < bound
        tied = np.flatnonzero((h == bound) & (scaled != whole))
        for t in tied.tolist():
            i = int(inside[t])
            rest = Fraction(float(q[i])) * (1 << width) - int(bound[t])
            out[i] = _rest_below(rest, lambda j, i=i: int(more(np.array([i]), j)[0]))
    return out


def _rest_below(rest: Fraction, block) -> bool:
    """0.b₁b₂… < ``rest`` (0 < rest < 1, dyadic) for the bits of ``block(1)``, ``block(2)``, …"""
    for j in range(1, MAX_BLOCKS + 2):
        rest *= 1 << 64
        bound = rest.numerator // rest.denominator
        bits = block(j)
        if bits != bound:
            return bits < bound
        rest -= bound
        if rest == 0:
            return False  # U ≥ q once every bit of q is matched (U = q has probability 0)
    raise AssertionError("a double has no more than 1074 fractional bits")


def half_uniform(tail: int, block) -> float:
    """p = 0.0 t₁…t₆₃ b₁ b₂ … in (0, 1/2) as a double, relative error ≤ 2^-53.

    ``tail``: the 63 bits t (an int below 2^63); ``block(j)``: the 64-bit block j ≥ 1,
    read while the bits so far hold fewer than 54 significant bits (probability 2^-10
    for the first block, 2^-64 for each further one). The value is the midpoint of the
    bits read, rounded to nearest; below the smallest positive double it is that double.
    """
    acc, shift = int(tail), 64
    j = 0
    while acc < (1 << 53):
        j += 1
        if j > MAX_BLOCKS:
            return SMALLEST_DOUBLE
        acc = (acc << 64) | int(block(j))
        shift += 64
    return max(math.ldexp(float(2 * acc + 1), -shift - 1), SMALLEST_DOUBLE)


def half_uniform_many(tails: np.ndarray, more) -> np.ndarray:
    """``half_uniform`` of each draw: ``tails`` a uint64 array of 63-bit tails,
    ``more(indices, j)`` the blocks of the draws that need them (the same values)."""
    tails = np.asarray(tails, dtype=np.uint64) & _LOW63
    # (t + 1/2)·2^-64 rounded once, as half_uniform: the high bits times 2^11 are exact
    # doubles, the low 11 bits plus 1/2 too, and their sum is rounded to nearest
    high = (tails >> np.uint64(11)).astype(np.float64) * 2048.0
    low = (tails & np.uint64(2047)).astype(np.float64) + 0.5
    p = (high + low) * _TWO_POW_M64
    for i in np.flatnonzero(tails < np.uint64(1 << 53)).tolist():
        p[i] = half_uniform(int(tails[i]), lambda j, i=i: int(more(np.array([i]), j)[0]))
    return p


def gumbel_from_stream(bits: int, block, scale: float) -> float:
    """Gumbel(0, scale) = −scale·log(−log U) with U = 0.b₁b₂… (``bits`` first, then
    ``block(j)``), computed from whichever of U and 1 − U is below 1/2 with full
    precision (``half_uniform``), so both tails reach the smallest double's reach:
    draws lie in [−6.62, 744.4] scales."""
    tail = bits & 0x7FFFFFFFFFFFFFFF
    if bits >> 63:  # U ≥ 1/2: 1 − U = 0.0 c₁c₂… with c the complement of U's bits
        v = half_uniform(tail ^ 0x7FFFFFFFFFFFFFFF, lambda j: block(j) ^ 0xFFFFFFFFFFFFFFFF)
        return -scale * math.log(-math.log1p(-v))
    return -scale * math.log(-math.log(half_uniform(tail, block)))


def gumbel_many(bits: np.ndarray, more, scale: float) -> np.ndarray:
    """``gumbel_from_stream`` of each draw of a uint64 array (blocks from ``more``)."""
    bits = np.asarray(bits, dtype=np.uint64)
    upper = (bits >> np.uint64(63)).astype(bool)
    tails = np.where(upper, ~bits, bits) & _LOW63

    def blocks(indices, j):
        got = np.asarray(more(indices, j), dtype=np.uint64)
        return np.where(upper[indices], ~got, got)

    p = half_uniform_many(tails, blocks)
    log_u = np.where(upper, np.log1p(-p), np.log(p))
    return -scale * np.log(-log_u)


def keyed_gumbel_many(key: bytes, message: bytes, size: int, scale: float) -> np.ndarray:
    """``size`` Gumbel(0, scale) draws keyed by (``key``, ``message``): the raw
    outputs of ``keyed_generator(key, message)`` as U's complement (the draws of that
    generator's ``gumbel``, up to its 53-bit rounding), further bits from keyed BLAKE2b
    of (message, index, block)."""
    raw = keyed_generator(key, message).bit_generator.random_raw(size)
    extra = KeyedHash64(key, b"gumbel blocks/" + message + b"/")

    def more(indices, j):
        return np.fromiter((extra(b"%d/%d" % (i, j)) for i in indices.tolist()),
                           np.uint64, len(indices))

    return gumbel_many(~np.asarray(raw, dtype=np.uint64), more, scale)



def block_key(key: bytes, j: int) -> bytes:
    """The key of block ``j`` ≥ 1 of the draws made under ``key``: HMAC-SHA256 of
    ``key`` and the block's number (a PRF of a secret key, so every block is fresh)."""
    return hmac.digest(key, b"beam_dpsu/block/%d" % j, "sha256")


def _sign_and_half(bits: int, block):
    """The sign (top bit) and ``half_uniform`` of the rest of a draw's stream."""
    return bool(bits >> 63), half_uniform(bits & 0x7FFFFFFFFFFFFFFF, block)


def laplace_from_stream(bits: int, block, scale: float) -> float:
    """Lap(scale) by inverse CDF: sign from the top bit, magnitude −scale·log(2p) with
    p = ``half_uniform`` of the rest (no largest draw short of 744 scales)."""
    negative, p = _sign_and_half(bits, block)
    magnitude = -scale * math.log(2.0 * p)  # P(|X| > x) = exp(-x/scale)
    return -magnitude if negative else magnitude


def gaussian_from_stream(bits: int, block, sigma: float) -> float:
    """N(0, sigma²) by inverse CDF: sign from the top bit, magnitude σ·Φ⁻¹(1 − p)."""
    negative, p = _sign_and_half(bits, block)
    magnitude = sigma * normal_isf(p)  # P(X > x) = p for x = Φ⁻¹(1 − p)
    return -magnitude if negative else magnitude


def laplace_many(bits: np.ndarray, more, scale: float) -> np.ndarray:
    """``laplace_from_stream`` of each draw of a uint64 array (blocks from ``more``)."""
    bits = np.asarray(bits, dtype=np.uint64)
    magnitude = -scale * np.log(2.0 * half_uniform_many(bits, more))
    return np.where((bits >> np.uint64(63)).astype(bool), -magnitude, magnitude)


def gaussian_many(bits: np.ndarray, more, sigma: float) -> np.ndarray:
    """``gaussian_from_stream`` of each draw of a uint64 array (blocks from ``more``)."""
    bits = np.asarray(bits, dtype=np.uint64)
    magnitude = sigma * np.asarray(normal_isf(half_uniform_many(bits, more)), dtype=np.float64)
    return np.where((bits >> np.uint64(63)).astype(bool), -magnitude, magnitude)


_SAMPLERS = {
    "laplace": laplace_from_stream,
    "gaussian": gaussian_from_stream,
    "gumbel": gumbel_from_stream,
}


#: The type tag that starts a string's canonical bytes (``encode_value``).
STR_TAG = b"s"[0]


def canonical_spans(values):
    """The canonical bytes (``encode_value``) of ``values``, laid out for the vectorised
    keyed hashes (``dp.randomness.siphash.siphash24_many``): ``(data, starts, lengths, prefix,
    encoded)``, value ``i``'s bytes being ``prefix`` (when not None) followed by
    ``data[starts[i]:starts[i] + lengths[i]]``, which is ``encoded[i]``. When every
    value is a ``str`` that is its UTF-8 behind the type tag ``STR_TAG`` (no call of
    ``encode_value`` per value); otherwise each value's whole encoding, no prefix."""
    if all(type(v) is str for v in values):
        encoded = [v.encode("utf-8", "surrogatepass") for v in values]
        prefix = STR_TAG
    else:
        encoded = [encode_value(v) for v in values]
        prefix = None
    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    starts = np.zeros(len(encoded), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return b"".join(encoded), starts, lengths, prefix, encoded


class ItemBits:
    """64 pseudo-random bits per item: SipHash-2-4 of the item's canonical bytes
    (``encode_value``) under a 16-byte key taken from a run key's subkey.

    Distinct items get independent uniform bits (SipHash-2-4 is a PRF,
    ``dp.randomness.siphash``), the same item always the same bits under the same key, and
    nothing else enters: an item's bits never depend on the other items of a
    batch, on its position or on how a runner split the work. ``many`` takes
    Python values, ``many_str`` strings held as UTF-8 in one buffer (Arrow's
    layout, no copy); both give the values ``one`` gives.
    """

    def __init__(self, run_key: "RunKey", purpose: str):
        self._key = run_key.subkey(purpose)[:16]
        self._blocks = {}

    @classmethod
    def _from_key(cls, key: bytes) -> "ItemBits":
        out = cls.__new__(cls)
        out.__setstate__(key)
        return out

    def block(self, j: int) -> "ItemBits":
        """The bits of block ``j`` ≥ 1 of every item's uniform (``uniform_below``): the
        same function under the key ``block_key(key, j)``, independent of the first
        64 bits and of every other block."""
        got = self._blocks.get(j)
        if got is None:
            got = self._blocks[j] = ItemBits._from_key(block_key(self._key, j)[:16])
        return got

    def __getstate__(self):
        return self._key

    def __setstate__(self, state):
        self._key = state
        self._blocks = {}

    def one(self, item: Any) -> int:
        return int(self.many([item])[0])

    def many(self, items) -> np.ndarray:
        from beam_dpsu.dp.randomness.siphash import siphash24_many
        data, starts, lengths, prefix, _ = canonical_spans(items)
        return siphash24_many(self._key, data, starts, lengths, prefix)

    def many_str(self, data, starts, lengths) -> np.ndarray:
        """The bits of the strings ``data[starts[i]:starts[i] + lengths[i]]`` (UTF-8)."""
        from beam_dpsu.dp.randomness.siphash import siphash24_many
        return siphash24_many(self._key, data, starts, lengths, prefix=STR_TAG)


class KeyedNoise:
    """Noise for each item, derived from a run key and a purpose.

    ``KeyedNoise(run_key, 'laplace', scale=λ, purpose='noise/0')(item_bytes)``
    returns the noise of that item; the same item always gets the same value
    under the same key and purpose, and different items get independent
    draws (keyed BLAKE2b of the item under the purpose's subkey is a
    pseudo-random function). The draw's uniform continues, where the sampler
    needs it, with keyed BLAKE2b of the item under ``block_key(subkey, j)``, so
    its tails have no floor (``half_uniform``).
    """

    def __init__(self, run_key: RunKey, kind: str, scale: float, purpose: str):
        if kind not in _SAMPLERS:
            raise ValueError(f"noise kind must be one of {sorted(_SAMPLERS)}, got {kind!r}")
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"noise scale must be a finite number > 0, got {scale!r}")
        self.kind = kind
        self.scale = float(scale)
        self.purpose = purpose
        self._key = run_key.subkey(purpose)
        self._hash = KeyedHash64(self._key)  # keyed_hash64(self._key, ·)
        self._blocks = {}
        self._sampler = _SAMPLERS[kind]

    def _block(self, j: int) -> KeyedHash64:
        got = self._blocks.get(j)
        if got is None:
            got = self._blocks[j] = KeyedHash64(block_key(self._key, j))
        return got

    def __call__(self, item: bytes) -> float:
        return self._sampler(self._hash(item), lambda j: self._block(j)(item), self.scale)


# --------------------------------------------------------------------------
# Released numbers: noise on a discrete grid (docs/mechanisms.md section 7).
# --------------------------------------------------------------------------
#
# A released number (a noisy count or weight) must not carry the low bits of a
# floating-point noise sample, which can reveal the unnoised value (Mironov
# 2012). As Google's differential-privacy library does, the value is rounded
# to a grid of granularity g (a power of two at or below scale / 2^40), and the
# noise is an integer multiple of g drawn from a discrete distribution, so the
# output is (n + Z)·g with integers n (the rounded value) and Z (the noise).

GRID_BITS = 40


def grid_granularity(scale: float) -> float:
    """The largest power of two at or below ``scale / 2^40`` (exact, via frexp).

    Args:
      scale: the noise scale (e.g. the Laplace scale b), a finite number > 0.
    Returns:
      g = 2^e with g ≤ scale·2^-40 < 2g.
    """
    if not (isinstance(scale, (int, float, np.integer, np.floating))
            and not isinstance(scale, bool) and scale > 0 and math.isfinite(scale)):
        raise ValueError(f"noise scale must be a finite number > 0, got {scale!r}")
    mantissa, exponent = math.frexp(float(scale))  # scale = m·2^e, 1/2 ≤ m < 1
    return math.ldexp(1.0, exponent - 1 - GRID_BITS)


def round_to_grid(value: float, granularity: float) -> int:
    """The grid index n of ``value``: the integer nearest ``value / granularity``.

    ``granularity`` is a power of two, so the division is exact; halves round
    to even. The grid value is ``n · granularity``.
    """
    if not math.isfinite(value):
        raise ValueError(f"a released value must be finite, got {value!r}")
    return int(round(float(value) / granularity))


def exponential_from_stream(bits: int, block) -> float:
    """A standard exponential E = −log U with U = 0.b₁b₂… (``bits`` first, then
    ``block(j)``), from whichever of U and 1 − U is below 1/2 with full precision
    (``half_uniform``): no largest draw short of 744.4 (the smallest double's)."""
    tail = bits & 0x7FFFFFFFFFFFFFFF
    if bits >> 63:  # U ≥ 1/2: 1 − U from the complement of U's bits
        return -math.log1p(-half_uniform(tail ^ 0x7FFFFFFFFFFFFFFF,
                                         lambda j: block(j) ^ 0xFFFFFFFFFFFFFFFF))
    return -math.log(half_uniform(tail, block))


def _generator_exponential(rng: np.random.Generator) -> float:
    """``exponential_from_stream`` on the raw 64-bit outputs of ``rng`` (blocks read in
    order, so the draw is a function of the generator's state)."""
    raw = rng.bit_generator.random_raw
    return exponential_from_stream(int(raw()), lambda j: int(raw()))


def two_sided_geometric(rng: np.random.Generator, t: float) -> int:
    """An integer Z with P(Z = z) ∝ exp(−|z|/t) (the discrete Laplace, t > 0).

    Drawn as the difference of two geometric variables on {1, 2, ...} with
    P(G ≥ n) = exp(−(n − 1)/t), each obtained as ``ceil(t·E)`` with E a
    standard exponential drawn from ``rng``'s raw bits with full precision in its
    tail (``exponential_from_stream``: no largest draw short of 744 scales).
    E|Z| ≈ t and Var Z ≈ 2t² for large t.
    """
    g1 = math.ceil(t * _generator_exponential(rng))
    g2 = math.ceil(t * _generator_exponential(rng))
    return int(g1) - int(g2)


def discrete_laplace_on_grid(value: float, scale: float, rng: np.random.Generator) -> float:
    """``value`` plus Laplace-like noise of scale ``scale``, on the grid.

    The value is rounded to the grid of ``g = grid_granularity(scale)`` and an
    integer multiple ``Z·g`` of the granularity is added, with Z two-sided
    geometric of parameter ``t = scale / g`` (so the noise has
    P(Z·g = x) ∝ exp(−|x|/scale) on the grid: the discrete analogue of
    Lap(scale), with E|noise| = scale up to a relative 2^-40).

    Privacy: for integer-valued statistics with ℓ1-sensitivity Δ and
    ``scale = Δ/ε`` this is exactly ε-DP (g divides 1); the output's bits are
    a function of (n + Z) alone, so no floating-point artefact leaks. The
    returned float is (n + Z)·g, an exact multiple of g (when |n + Z| > 2^53
    the float conversion rounds to a coarser multiple of g: post-processing).

    Args:
      value: the unnoised number (finite).
      scale: the Laplace scale b (> 0).
      rng: the generator; draw it with ``keyed_generator(key, message)`` so the
        noise is derived from the run key (see ``KeyedGridLaplace``).
    """
    g = grid_granularity(scale)
    n = round_to_grid(value, g)
    z = two_sided_geometric(rng, scale / g)
    return float(n + z) * g


class KeyedGridLaplace:
    """Discrete-grid Laplace noise for released numbers, derived from a run key.

    ``KeyedGridLaplace(run_key, scale=b, purpose='counts/0')(value, item_bytes)``
    returns ``value`` rounded to the grid plus grid noise for that item: the
    generator is ``keyed_generator(run_key.subkey(purpose), item_bytes)``, so
    the same item gets the same noise on a retry and different items (or
    purposes) get independent draws.

    Attributes:
      scale: the Laplace scale b; E|noise| = b.
      granularity: the grid g = ``grid_granularity(b)``; every output is an
        integer multiple of g.
    """

    def __init__(self, run_key: RunKey, scale: float, purpose: str):
        self.granularity = grid_granularity(scale)
        self.scale = float(scale)
        self.purpose = purpose
        self._key = run_key.subkey(purpose)

    def __call__(self, value: float, item: bytes) -> float:
        return discrete_laplace_on_grid(value, self.scale, keyed_generator(self._key, item))

    def index(self, value: float, item: bytes) -> int:
        """The grid index ``n + Z`` of ``self(value, item)`` (which is ``index·g``), as an
        exact integer: decisions made on indices have no floating-point rounding."""
        rng = keyed_generator(self._key, item)
        return round_to_grid(value, self.granularity) + two_sided_geometric(
            rng, self.scale / self.granularity)
