"""Randomness: the per-run secret key, keyed hashes and noise samplers.

Every random choice that affects a release is derived from one secret
``RunKey`` through pseudo-random functions (HMAC-SHA256 for the purposes'
subkeys and the seeds of keyed generators, keyed BLAKE2b, and SipHash-2-4 in
``dp.siphash``; docs/mechanisms.md section 1.1):

* contribution-bounding samples (a uniformly random Δ0-subset of a user's
  items: the Δ0 smallest SipHash-2-4 scores under the user's own key,
  ``dp.contribution.sample_items``),
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

Precision: the samplers use 63 uniform bits per draw, so a noise value is
never beyond about 44.4 scales (Laplace) or 9.2 standard deviations
(Gaussian). This truncation changes the distribution on an event of
probability below 2^-62, which is far below any δ the library accepts.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from statistics import NormalDist
from typing import Any, Optional

import numpy as np

from beam_dpsu.dp.calibration import check_flag

__all__ = ["encode_value", "RunKey", "DetachedKeyError", "test_seed_material", "keyed_hash64",
           "KeyedHash64", "keyed_seed", "keyed_generator", "laplace_from_bits",
           "gaussian_from_bits", "uniform_from_bits", "gumbel_from_bits", "KeyedNoise",
           "GRID_BITS", "grid_granularity", "round_to_grid", "two_sided_geometric",
           "discrete_laplace_on_grid", "KeyedGridLaplace", "STR_TAG", "canonical_spans",
           "ItemBits",
           "laplace_from_bits_many", "normal_quantile_many", "gaussian_from_bits_many",
           "uniform_from_bits_many"]


_NORMAL = NormalDist()
_TWO_POW_M64 = 2.0 ** -64


def encode_value(value: Any) -> bytes:
    """Canonical bytes of a user id or an item, for keyed hashing.

    Distinct values of the common types never collide: strings are UTF-8
    (lone surrogates allowed), bytes pass through, and other values use their
    ``repr``; a one-byte type tag separates the three.

    For the ids the library accepts (``str``, ``bytes``, ``int`` and tuples of
    these: ``dp.contribution.canonical_id``) two values are equal in Python
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
            raise ValueError(f"run_key must be a beam_dpsu.noise.RunKey or None, got {run_key!r}")
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
                    "the key from beam_dpsu.keys.pipeline_key's side input instead.")
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


def _sign_and_tail(bits: int):
    """Split 64 bits into a sign and p uniform in (0, 1/2) with 63-bit resolution."""
    negative = bool(bits >> 63)
    p = ((bits & 0x7FFFFFFFFFFFFFFF) + 0.5) * _TWO_POW_M64
    return negative, p


def laplace_from_bits(bits: int, scale: float) -> float:
    """Lap(scale) by inverse CDF from 64 uniform bits."""
    negative, p = _sign_and_tail(bits)
    magnitude = -scale * math.log(2.0 * p)  # P(|X| > x) = exp(-x/scale)
    return -magnitude if negative else magnitude


def gaussian_from_bits(bits: int, sigma: float) -> float:
    """N(0, sigma²) by inverse CDF from 64 uniform bits."""
    negative, p = _sign_and_tail(bits)
    magnitude = -sigma * _NORMAL.inv_cdf(p)  # P(X > x) = p for x = -Φ⁻¹(p)
    return -magnitude if negative else magnitude


def uniform_from_bits(bits: int) -> float:
    """A uniform draw in (0, 1) with 52-bit resolution: (k + 1/2)/2^52.

    52 bits, not 53, so that the largest value 1 − 2^-53 is exactly
    representable and never rounds to 1.
    """
    return ((bits >> 12) + 0.5) * 2.0 ** -52


def gumbel_from_bits(bits: int, scale: float) -> float:
    """Gumbel(0, scale) by inverse CDF: −scale·log(−log U)."""
    return -scale * math.log(-math.log(uniform_from_bits(bits)))


_SAMPLERS = {
    "laplace": laplace_from_bits,
    "gaussian": gaussian_from_bits,
    "gumbel": gumbel_from_bits,
}


_LOW63 = np.uint64(0x7FFFFFFFFFFFFFFF)


def _sign_and_tail_many(bits: np.ndarray):
    """``_sign_and_tail`` of every element of a uint64 array."""
    negative = (bits >> np.uint64(63)).astype(bool)
    p = ((bits & _LOW63).astype(np.float64) + 0.5) * _TWO_POW_M64
    return negative, p


def laplace_from_bits_many(bits: np.ndarray, scale: float) -> np.ndarray:
    """``laplace_from_bits`` of every element of a uint64 array (float64 array)."""
    negative, p = _sign_and_tail_many(bits)
    magnitude = -scale * np.log(2.0 * p)
    return np.where(negative, -magnitude, magnitude)


# Wichura's algorithm AS241 (PPND16, Applied Statistics 37(3), 1988): the standard
# normal quantile as rational functions of q = p - 1/2 (central region) or of
# r = sqrt(-log(min(p, 1 - p))) (tails), relative error about 1e-16. Coefficients
# from highest degree to the constant term; the denominators' constant term is 1.
_AS241 = {
    "central": ([2.5090809287301226727e+3, 3.3430575583588128105e+4,
                 6.7265770927008700853e+4, 4.5921953931549871457e+4,
                 1.3731693765509461125e+4, 1.9715909503065514427e+3,
                 1.3314166789178437745e+2, 3.3871328727963666080e+0],
                [5.2264952788528545610e+3, 2.8729085735721942674e+4,
                 3.9307895800092710610e+4, 2.1213794301586595867e+4,
                 5.3941960214247511077e+3, 6.8718700749205790830e+2,
                 4.2313330701600911252e+1, 1.0]),
    "near": ([7.7454501427834140764e-4, 2.2723844989269184583e-2,
              2.4178072517745061177e-1, 1.2704582524523683826e+0,
              3.6478483247632046050e+0, 5.7694972214606914055e+0,
              4.6303378461565452959e+0, 1.4234371107496835773e+0],
             [1.0507500716444168432e-9, 5.4759380849953449460e-4,
              1.5198666563616457197e-2, 1.4810397642748007459e-1,
              6.8976733498510000455e-1, 1.6763848301838038494e+0,
              2.0531916266377588219e+0, 1.0]),
    "far": ([2.0103343992922881327e-7, 2.7115555687434875782e-5,
             1.2426609473880784386e-3, 2.6532189526576123093e-2,
             2.9656057182850489123e-1, 1.7848265399172913358e+0,
             5.4637849111641143699e+0, 6.6579046435011037772e+0],
            [2.0442631033899397856e-15, 1.4215117583164458887e-7,
             1.8463183175100546818e-5, 7.8686913114561329059e-4,
             1.4875361290850614852e-2, 1.3692988092273580531e-1,
             5.9983220655588793769e-1, 1.0]),
}


def _horner(coefficients, x):
    out = np.full_like(x, coefficients[0])
    for c in coefficients[1:]:  # in place: (out * x) + c, each rounded as before
        out *= x
        out += c
    return out


def normal_quantile_many(p: np.ndarray) -> np.ndarray:
    """Φ⁻¹(p) for every p in (0, 1) of a float64 array: Wichura's AS241, the algorithm
    of ``statistics.NormalDist.inv_cdf`` (the scalar samplers' quantile), in numpy."""
    p = np.asarray(p, dtype=np.float64)
    q = p - 0.5
    out = np.empty_like(p)
    central = np.abs(q) <= 0.425
    if central.any():
        qc = q[central]
        r = 0.180625 - qc * qc
        num, den = _AS241["central"]
        out[central] = _horner(num, r) * qc / _horner(den, r)
    tail = ~central
    if tail.any():
        qt = q[tail]
        r = np.sqrt(-np.log(np.where(qt <= 0.0, p[tail], 1.0 - p[tail])))
        x = np.empty_like(r)
        near = r <= 5.0
        for region, where, shift in (("near", near, 1.6), ("far", ~near, 5.0)):
            if where.any():
                rr = r[where] - shift
                num, den = _AS241[region]
                x[where] = _horner(num, rr) / _horner(den, rr)
        out[tail] = np.where(qt < 0.0, -x, x)
    return out


def gaussian_from_bits_many(bits: np.ndarray, sigma: float) -> np.ndarray:
    """``gaussian_from_bits`` of every element of a uint64 array: N(0, sigma²) by
    inverse CDF (``normal_quantile_many``, the quantile of the scalar sampler)."""
    negative, p = _sign_and_tail_many(bits)
    magnitude = -sigma * normal_quantile_many(p)
    return np.where(negative, -magnitude, magnitude)


def uniform_from_bits_many(bits: np.ndarray) -> np.ndarray:
    """``uniform_from_bits`` of every element of a uint64 array (the same values)."""
    return ((bits >> np.uint64(12)).astype(np.float64) + 0.5) * 2.0 ** -52


#: The type tag that starts a string's canonical bytes (``encode_value``).
STR_TAG = b"s"[0]


def canonical_spans(values):
    """The canonical bytes (``encode_value``) of ``values``, laid out for the vectorised
    keyed hashes (``dp.siphash.siphash24_many``): ``(data, starts, lengths, prefix,
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
    ``dp.siphash``), the same item always the same bits under the same key, and
    nothing else enters: an item's bits never depend on the other items of a
    batch, on its position or on how a runner split the work. ``many`` takes
    Python values, ``many_str`` strings held as UTF-8 in one buffer (Arrow's
    layout, no copy); both give the values ``one`` gives.
    """

    def __init__(self, run_key: "RunKey", purpose: str):
        self._key = run_key.subkey(purpose)[:16]

    def __getstate__(self):
        return self._key

    def __setstate__(self, state):
        self._key = state

    def one(self, item: Any) -> int:
        return int(self.many([item])[0])

    def many(self, items) -> np.ndarray:
        from beam_dpsu.dp.siphash import siphash24_many
        data, starts, lengths, prefix, _ = canonical_spans(items)
        return siphash24_many(self._key, data, starts, lengths, prefix)

    def many_str(self, data, starts, lengths) -> np.ndarray:
        """The bits of the strings ``data[starts[i]:starts[i] + lengths[i]]`` (UTF-8)."""
        from beam_dpsu.dp.siphash import siphash24_many
        return siphash24_many(self._key, data, starts, lengths, prefix=STR_TAG)


class KeyedNoise:
    """Noise for each item, derived from a run key and a purpose.

    ``KeyedNoise(run_key, 'laplace', scale=λ, purpose='noise/0')(item_bytes)``
    returns the noise of that item; the same item always gets the same value
    under the same key and purpose, and different items get independent
    draws (keyed BLAKE2b of the item under the purpose's subkey is a
    pseudo-random function).
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
        self._sampler = _SAMPLERS[kind]

    def __call__(self, item: bytes) -> float:
        return self._sampler(self._hash(item), self.scale)

    def uniform(self, item: bytes) -> float:
        """A uniform (0, 1) draw for ``item`` (e.g. for a keep probability)."""
        return uniform_from_bits(self._hash(item))


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


def two_sided_geometric(rng: np.random.Generator, t: float) -> int:
    """An integer Z with P(Z = z) ∝ exp(−|z|/t) (the discrete Laplace, t > 0).

    Drawn as the difference of two geometric variables on {1, 2, ...} with
    P(G ≥ n) = exp(−(n − 1)/t), each obtained as ``ceil(t·E)`` with E a
    standard exponential from ``rng``. E|Z| ≈ t and Var Z ≈ 2t² for large t.
    """
    g1 = math.ceil(t * rng.standard_exponential())
    g2 = math.ceil(t * rng.standard_exponential())
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
