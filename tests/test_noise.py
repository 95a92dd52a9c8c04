"""Keyed randomness: determinism, key separation and the noise distributions."""
import math
import pickle

import numpy as np
import pytest
from scipy import stats

from beam_dpsu.dp.randomness import noise
from beam_dpsu.dp.randomness.noise import KeyedNoise, RunKey, encode_value

# Each KS test below fails falsely with probability 1e-7.
KS_ALPHA = 1e-7
N = 20000


def test_fresh_keys_differ_and_seeded_keys_repeat():
    assert RunKey.fresh() != RunKey.fresh()
    assert RunKey.from_test_seed(3) == RunKey.from_test_seed(3)
    assert RunKey.from_test_seed(3) != RunKey.from_test_seed(4)
    assert RunKey.from_test_seed(3).seeded and not RunKey.fresh().seeded


def test_key_is_not_printed_and_its_secret_is_never_pickled():
    from beam_dpsu.dp.randomness.noise import DetachedKeyError
    for k in (RunKey.fresh(), RunKey(b"explicit key bytes, 32 of them!!")):
        material = k.subkey("a") and k._material()   # drawn (fresh) before pickling
        assert "seeded=False" in repr(k) and len(repr(k)) < 40
        blob = pickle.dumps(k)
        assert material not in blob and k.subkey("a") not in blob
        k2 = pickle.loads(blob)
        assert not k2.seeded
        with pytest.raises(DetachedKeyError, match="never leave the process"):
            k2.subkey("a")


def test_a_test_seeded_key_pickles_as_its_seed():
    k = RunKey.from_test_seed(7)
    blob = pickle.dumps(k)
    assert k._material() not in blob
    k2 = pickle.loads(blob)
    assert k2 == k and k2.seeded and k2.test_seed == 7 and k2.subkey("a") == k.subkey("a")


def test_a_fresh_key_is_drawn_once_per_process_and_fresh_keys_differ():
    k = RunKey.fresh()
    assert k.subkey("a") == k.subkey("a") and k._material() == k._material()
    assert RunKey.fresh().subkey("a") != k.subkey("a")


def test_subkeys_are_separated():
    k = RunKey.from_test_seed(0)
    purposes = ["noise/0", "noise/1", "sample/0", "sample/1", "order"]
    assert len({k.subkey(p) for p in purposes}) == len(purposes)


def test_resolve():
    k = RunKey.from_test_seed(1)
    assert RunKey.resolve(k) is k
    assert not RunKey.resolve(None).seeded
    with pytest.raises(ValueError):
        RunKey.resolve(7)
    with pytest.raises(ValueError):
        RunKey.from_test_seed("7")


def test_encode_value_separates_types():
    values = ["1", b"1", 1, 1.0, ("1",), None, "", b"", "\udcff", "é"]
    encoded = [encode_value(v) for v in values]
    assert len(set(encoded)) == len(values)


def _items(n):
    return [f"item{i}".encode() for i in range(n)]


def test_keyed_noise_is_deterministic_per_key_and_purpose():
    k = RunKey.from_test_seed(0)
    a = KeyedNoise(k, "gaussian", 1.0, "noise/0")
    b = KeyedNoise(pickle.loads(pickle.dumps(k)), "gaussian", 1.0, "noise/0")
    c = KeyedNoise(k, "gaussian", 1.0, "noise/1")
    xs = _items(50)
    assert [a(x) for x in xs] == [b(x) for x in xs]
    assert [a(x) for x in xs] != [c(x) for x in xs]


def test_keyed_hash64_object_equals_the_function_and_pickles():
    key = RunKey.from_test_seed(3).subkey("noise/0")
    h = noise.KeyedHash64(key)
    h2 = pickle.loads(pickle.dumps(h))
    messages = [b"", b"s", b"sitem", bytes(range(256)) * 3]
    for m in messages:
        assert h(m) == h2(m) == noise.keyed_hash64(key, m)
    for m in messages:  # a fresh state, updated and digested, is the same hash
        state = h.fresh()
        state.update(m)
        assert int.from_bytes(state.digest(), "big") == h(m)


def test_keyed_hash64_prefix_is_absorbed_before_each_message():
    key = RunKey.from_test_seed(3).subkey("item-order")
    h = noise.KeyedHash64(key, prefix=b"s")
    h2 = pickle.loads(pickle.dumps(h))
    messages = [b"", b"item", "\u00e9t\u00e9".encode(), bytes(range(256)) * 3]
    for m in messages:
        assert h(m) == h2(m) == noise.keyed_hash64(key, b"s" + m)
        state = h.fresh()
        state.update(m)
        assert int.from_bytes(state.digest(), "big") == noise.keyed_hash64(key, b"s" + m)
    assert h(b"x") != noise.KeyedHash64(key)(b"x")


@pytest.mark.parametrize("kind,scale,dist", [
    ("laplace", 2.5, stats.laplace(scale=2.5)),
    ("gaussian", 1.7, stats.norm(scale=1.7)),
    ("gumbel", 0.5, stats.gumbel_r(scale=0.5)),
])
def test_noise_distribution(kind, scale, dist):
    gen = KeyedNoise(RunKey.fresh(), kind, scale, "noise/0")
    sample = np.array([gen(x) for x in _items(N)])
    assert stats.kstest(sample, dist.cdf).pvalue > KS_ALPHA


def test_half_uniform_distribution():
    # p = half_uniform(...) is uniform on (0, 1/2): 2p against the uniform CDF
    gen = noise.KeyedHash64(RunKey.fresh().subkey("u"))
    sample = np.array([2 * noise.half_uniform(gen(x) >> 1, lambda j: 0) for x in _items(N)])
    assert sample.min() > 0 and sample.max() < 1
    assert stats.kstest(sample, "uniform").pvalue > KS_ALPHA


def test_tails_reach_the_smallest_double():
    # all-zero bits (after the sign) continue into further blocks: the draw's tail is not
    # cut at 2^-64; the extremes are the smallest double's (docs/mechanisms.md 1.2)
    zeros, ones = (lambda j: 0), (lambda j: 2 ** 64 - 1)
    sign = 1 << 63
    assert noise.laplace_from_stream(0, zeros, 1.0) == pytest.approx(-math.log(2 * 5e-324))
    assert noise.gaussian_from_stream(sign, zeros, 1.0) < -38.0
    assert noise.gumbel_from_stream(sign | (2 ** 63 - 1), ones, 1.0) == pytest.approx(
        -math.log(5e-324))                     # U = 1 − 2^-1074: 744.4 scales
    assert noise.gumbel_from_stream(0, zeros, 1.0) == pytest.approx(
        -math.log(-math.log(5e-324)))          # U = 2^-1074: −6.61 scales
    for bits in (0, 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1):
        for f in (noise.laplace_from_stream, noise.gaussian_from_stream,
                  noise.gumbel_from_stream):
            for more in (zeros, ones):
                assert math.isfinite(f(bits, more, 1.0))


def test_keyed_generator_is_deterministic():
    k = RunKey.from_test_seed(5).subkey("sample/0")
    a = noise.keyed_generator(k, b"user").integers(0, 2 ** 62, 4)
    b = noise.keyed_generator(k, b"user").integers(0, 2 ** 62, 4)
    c = noise.keyed_generator(k, b"other").integers(0, 2 ** 62, 4)
    assert list(a) == list(b) and list(a) != list(c)


def test_bad_noise_parameters():
    with pytest.raises(ValueError):
        KeyedNoise(RunKey.fresh(), "cauchy", 1.0, "p")
    with pytest.raises(ValueError):
        KeyedNoise(RunKey.fresh(), "laplace", 0.0, "p")
