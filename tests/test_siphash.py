"""SipHash-2-4 (dp.randomness.siphash), the keyed bits of the release rules (noise.ItemBits) and the
vectorised samplers: each against an independent computation."""
import importlib.util
import math
import os

import numpy as np
import pytest

from beam_dpsu.dp.randomness import compiled, siphash
from beam_dpsu.dp.randomness.noise import (ItemBits, RunKey, encode_value, gaussian_from_stream,
                                gaussian_many, gumbel_from_stream, gumbel_many,
                                laplace_from_stream, laplace_many)

KEY = bytes(range(16))
NUMBA = importlib.util.find_spec("numba") is not None


def test_published_test_vectors():
    # Aumasson and Bernstein, SipHash paper, appendix A (key 00..0f, message 00..0e),
    # and the first entry of the reference implementation's vectors.h (empty message).
    assert siphash.siphash24(KEY, bytes(range(15))) == 0xA129CA6149BE45E5
    assert siphash.siphash24(KEY, b"") == 0x726FDB47DD0E0E31


def _messages(count, seed):
    rng = np.random.default_rng(seed)
    return [os.urandom(int(rng.integers(0, 40))) for _ in range(count)]


def _spans(messages):
    lengths = np.array([len(m) for m in messages], np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return b"".join(messages), starts, lengths


@pytest.mark.parametrize("prefix", [None, 115])
def test_many_equals_the_scalar_reference(monkeypatch, prefix):
    messages = _messages(2000, 1)
    data, starts, lengths = _spans(messages)
    head = b"" if prefix is None else bytes([prefix])
    expected = [siphash.siphash24(KEY, head + m) for m in messages]
    assert siphash.siphash24_many(KEY, data, starts, lengths, prefix).tolist() == expected
    with monkeypatch.context() as patched:  # the numpy form, then the kernels if installed
        patched.setattr(compiled, "kernel", lambda name, work: None)
        assert siphash.siphash24_many(KEY, data, starts, lengths, prefix).tolist() == expected
    monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
    assert siphash.siphash24_many(KEY, data, starts, lengths, prefix).tolist() == expected
    # both implementations: numpy, and the numba kernel when numba is installed
    n = len(messages)
    k0, k1 = siphash.split_key(KEY)
    k0, k1 = np.full(n, k0, np.uint64), np.full(n, k1, np.uint64)
    buf = np.frombuffer(data, np.uint8)
    assert siphash._numpy_many(k0, k1, buf, starts, lengths, prefix).tolist() == expected
    if NUMBA:
        from beam_dpsu.dp.randomness import array_kernels
        code = -1 if prefix is None else prefix
        assert array_kernels.siphash24_many(k0, k1, buf, starts, lengths,
                                            code).tolist() == expected
        # the one-key kernel (``siphash24_many`` once the kernels are loaded)
        out = np.empty(len(starts), np.uint64)
        assert array_kernels.siphash24_key(k0[0], k1[0], buf, starts, lengths,
                                           code, out) is out
        assert out.tolist() == expected


def test_a_key_per_message():
    messages = _messages(500, 2)
    data, starts, lengths = _spans(messages)
    keys = [os.urandom(16) for _ in messages]
    k0 = np.array([siphash.split_key(k)[0] for k in keys], np.uint64)
    k1 = np.array([siphash.split_key(k)[1] for k in keys], np.uint64)
    expected = [siphash.siphash24(k, m) for k, m in zip(keys, messages)]
    assert siphash.siphash24_many_keys(k0, k1, data, starts, lengths).tolist() == expected
    assert siphash._numpy_many(k0, k1, np.frombuffer(data, np.uint8), starts, lengths,
                               None).tolist() == expected
    if NUMBA:
        from beam_dpsu.dp.randomness import array_kernels
        assert array_kernels.siphash24_many(k0, k1, np.frombuffer(data, np.uint8), starts,
                                            lengths, -1).tolist() == expected


def test_a_key_has_16_bytes():
    with pytest.raises(ValueError, match="16 bytes"):
        siphash.siphash24(b"short", b"x")


def test_item_bits_are_siphash_of_the_canonical_bytes_whatever_the_batch():
    rk = RunKey.from_test_seed(3)
    bits = ItemBits(rk, "noise/0")
    items = ["a", "é", "", "tab\there", 7, -3, b"\x00", ("t", 1)]
    key = rk.subkey("noise/0")[:16]
    expected = [siphash.siphash24(key, encode_value(x)) for x in items]
    assert bits.many(items).tolist() == expected
    assert [bits.one(x) for x in items] == expected
    assert bits.many(items[::-1]).tolist() == expected[::-1]  # no dependence on the others
    strings = [x for x in items if isinstance(x, str)]
    data, starts, lengths = _spans([s.encode() for s in strings])
    assert bits.many_str(data, starts, lengths).tolist() == [
        expected[items.index(s)] for s in strings]
    assert ItemBits(rk, "noise/1").many(items).tolist() != expected


def test_vectorised_samplers_match_the_scalar_ones():
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2 ** 64, size=5000, dtype=np.uint64)
    # the extremes, and heads whose first block leaves fewer than 54 significant bits
    edge = np.array([0, 1, 2 ** 53, 2 ** 63 - 1, 2 ** 63, 2 ** 63 + 5, 2 ** 64 - 1], np.uint64)
    bits = np.concatenate([bits, edge, rng.integers(0, 2 ** 40, size=50, dtype=np.uint64)])
    extra = rng.integers(0, 2 ** 64, size=(len(bits), 20), dtype=np.uint64)

    def more(indices, j):
        return extra[indices, j - 1]

    lap = laplace_many(bits, more, 2.5)
    gau = gaussian_many(bits, more, 0.7)
    gum = gumbel_many(bits, more, 1.3)
    for k, b in enumerate(bits.tolist()):
        def block(j, k=k):
            return int(extra[k, j - 1])
        assert math.isclose(lap[k], laplace_from_stream(b, block, 2.5), rel_tol=1e-12,
                            abs_tol=1e-300)
        assert math.isclose(gau[k], gaussian_from_stream(b, block, 0.7), rel_tol=1e-12)
        assert math.isclose(gum[k], gumbel_from_stream(b, block, 1.3), rel_tol=1e-12,
                            abs_tol=1e-300)


def test_compiled_kernels_wait_for_enough_work(monkeypatch):
    monkeypatch.setattr(compiled, "_work", {})
    monkeypatch.setattr(compiled, "_module", None)
    monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 100)
    assert compiled.kernel("compare_spans", 60) is None
    got = compiled.kernel("compare_spans", 60)
    assert (got is not None) == NUMBA


def test_a_ctrl_c_inside_a_kernel_call_is_raised_when_the_call_returns():
    # numba runs Python callbacks from LLVM while it loads a kernel; an interrupt raised
    # there crashed the process, so a kernel's first call with given argument types
    # holds SIGINT until it returns
    import signal
    import threading
    assert threading.current_thread() is threading.main_thread()
    steps = []

    def body(*args):
        if steps == []:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # Python code that would see the interrupt
                pass
        steps.append("body finished")
        return len(args)

    held = compiled._Held(body)
    array = np.zeros(3, np.int64)
    # Python's own handler (a process started with SIGINT ignored, e.g. a background
    # job of a shell, inherits SIG_IGN instead)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    calls = []
    try:
        with pytest.raises(KeyboardInterrupt):
            held(array, 1)
        assert steps == ["body finished"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        # the handler that was in place receives the held signal; no signal: the result
        signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
        steps.clear()
        assert held(array, 1) == 2 and calls == [signal.SIGINT]
        # types seen: the call runs without touching the handler
        signal.signal(signal.SIGINT, signal.default_int_handler)
        seen = compiled._Held(lambda *args: signal.getsignal(signal.SIGINT))
        assert seen(array) is not signal.default_int_handler  # the first: held
        assert seen(np.ones(5, np.int64)) is signal.default_int_handler  # same types
        assert seen(np.ones(5, np.int32)) is not signal.default_int_handler  # new types
        assert seen(np.ones(5, np.int64)[::2]) is not signal.default_int_handler  # layout
    finally:
        signal.signal(signal.SIGINT, inherited)
    # outside the main thread the call runs as it is
    out = []
    worker = threading.Thread(target=lambda: out.append(compiled._Held(lambda: 5)()))
    worker.start()
    worker.join()
    assert out == [5]


@pytest.mark.parametrize("prefix", [None, 115])
def test_keys_by_owner_equal_the_gathered_keys(monkeypatch, prefix):
    # owner[i] picks message i's key from per-owner tables: the values of the keys
    # gathered per message, with and without the compiled kernel, into ``out`` or not
    messages = _messages(3000, 3)
    data, starts, lengths = _spans(messages)
    rng = np.random.default_rng(8)
    owners = 40
    keys = [os.urandom(16) for _ in range(owners)]
    k0 = np.array([siphash.split_key(k)[0] for k in keys], np.uint64)
    k1 = np.array([siphash.split_key(k)[1] for k in keys], np.uint64)
    owner = rng.integers(0, owners, len(messages))
    head = b"" if prefix is None else bytes([prefix])
    expected = [siphash.siphash24(keys[o], head + m) for o, m in zip(owner.tolist(), messages)]
    for numpy_form in (True, False):  # then the kernel, when numba is installed
        monkeypatch.undo()
        if numpy_form:
            monkeypatch.setattr(compiled, "kernel", lambda name, work: None)
        else:
            monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
        assert siphash.siphash24_many_keys(k0, k1, data, starts, lengths, prefix,
                                           owner=owner).tolist() == expected
        out = np.zeros(len(messages), np.uint64)
        got = siphash.siphash24_many_keys(k0, k1, data, starts, lengths, prefix, owner=owner,
                                          out=out)
        assert got is out and out.tolist() == expected
        out[:] = 0
        gathered = siphash.siphash24_many_keys(k0[owner], k1[owner], data, starts, lengths,
                                               prefix, out=out)
        assert gathered is out and out.tolist() == expected


def test_the_owner_kernel_refuses_owners_outside_the_tables():
    # numba does no bounds checks: the kernel checks the owners and the array lengths
    pytest.importorskip("numba")
    from beam_dpsu.dp.randomness import array_kernels
    data, starts, lengths = _spans([b"ab", b"c"])
    buf = np.frombuffer(data, np.uint8)
    k = np.ones(2, np.uint64)
    out = np.empty(2, np.uint64)
    for owner in ([0, 2], [-1, 0]):
        with pytest.raises(ValueError, match="owner"):
            array_kernels.siphash24_owned(k, k, np.array(owner, np.int64), buf, starts,
                                          lengths, -1, out)
    with pytest.raises(ValueError, match="per message"):
        array_kernels.siphash24_owned(k, k, np.zeros(1, np.int64), buf, starts, lengths, -1,
                                      out)


def test_keys_by_owner_and_out_are_checked_in_both_forms(monkeypatch):
    data, starts, lengths = _spans([b"ab", b"c", b""])
    k = np.ones(2, np.uint64)
    for numpy_form in (True, False):
        monkeypatch.undo()
        if numpy_form:
            monkeypatch.setattr(compiled, "kernel", lambda name, work: None)
        else:
            monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
        for owner in ([0, 1, 2], [0, -1, 0], [0, 1]):
            with pytest.raises(ValueError, match="owner"):
                siphash.siphash24_many_keys(k, k, data, starts, lengths, owner=owner)
        for out in (np.zeros(4, np.uint64), np.zeros(3, np.float64)):
            with pytest.raises(ValueError, match="out"):
                siphash.siphash24_many_keys(k, k, data, starts, lengths, owner=[0, 1, 0],
                                            out=out)
        with pytest.raises(ValueError, match="per message"):
            siphash.siphash24_many_keys(k, k, data, starts, lengths)  # 2 keys, 3 messages


# ---- long messages: prf64's tree -----------------------------------------------------

def _tree_reference(key, message):
    """prf64 written out from its definition, independently of dp.randomness.siphash's code: level
    by level, pieces of 1,024 bytes zero-padded, each followed by le64(index) and
    le64(level·2^56 + the level's length), hashed by SipHash-2-4."""
    if len(message) <= 1024:
        return siphash.siphash24(key, message)
    level, data = 1, message
    while True:
        values = []
        for i in range(0, len(data), 1024):
            piece = data[i:i + 1024]
            node = piece + bytes(1024 - len(piece)) + (i // 1024).to_bytes(8, "little")
            node += (level * 2 ** 56 + len(data)).to_bytes(8, "little")
            values.append(siphash.siphash24(key, node))
        if len(values) == 1:
            return values[0]
        data, level = b"".join(v.to_bytes(8, "little") for v in values), level + 1


LONG_LENGTHS = [0, 7, 256, 1022, 1023, 1024, 1025, 2047, 2048, 2049, 8193, 65535, 65536,
                131073, 1024 * 128 * 2 + 9]


@pytest.mark.parametrize("prefix", [None, 115])
def test_long_messages_are_hashed_by_the_tree_in_every_form(monkeypatch, prefix):
    rng = np.random.default_rng(11)
    messages = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in LONG_LENGTHS]
    messages.append(bytes(70000))                    # zeros: padding must not alias
    data, starts, lengths = _spans(messages)
    head = b"" if prefix is None else bytes([prefix])
    expected = [_tree_reference(KEY, head + m) for m in messages]
    assert [siphash.prf64(KEY, head + m) for m in messages] == expected
    # short messages keep SipHash-2-4's own value
    assert all(e == siphash.siphash24(KEY, head + m)
               for e, m in zip(expected, messages) if len(head + m) <= siphash.LEAF_BYTES)
    with monkeypatch.context() as patched:          # the numpy form
        patched.setattr(compiled, "kernel", lambda name, work: None)
        assert siphash.siphash24_many(KEY, data, starts, lengths, prefix).tolist() == expected
        keys = [bytes([i]) * 16 for i in range(len(messages))]
        k0 = np.array([siphash.split_key(k)[0] for k in keys], np.uint64)
        k1 = np.array([siphash.split_key(k)[1] for k in keys], np.uint64)
        assert siphash.siphash24_many_keys(k0, k1, data, starts, lengths, prefix).tolist() == [
            _tree_reference(k, head + m) for k, m in zip(keys, messages)]
        owner = np.arange(len(messages))[::-1].copy()
        assert siphash.siphash24_many_keys(k0, k1, data, starts, lengths, prefix,
                                           owner=owner).tolist() == [
            _tree_reference(keys[o], head + m) for o, m in zip(owner, messages)]
    if NUMBA:                                       # the compiled kernels: the same values
        monkeypatch.setattr(compiled, "WORK_BEFORE_COMPILING", 0)
        assert siphash.siphash24_many(KEY, data, starts, lengths, prefix).tolist() == expected


def test_the_tree_tells_apart_lengths_and_positions():
    # a message, its zero-padded extension and its pieces reordered all differ
    m = np.random.default_rng(12).integers(0, 256, 3072, dtype=np.uint8).tobytes()
    values = {siphash.prf64(KEY, x) for x in
              (m, m + b"\0", m[:-1], m[1024:2048] + m[:1024] + m[2048:], m[:1024])}
    assert len(values) == 5


def test_hashing_a_long_item_takes_a_number_of_steps_independent_of_its_length(monkeypatch):
    # SipHash absorbs one word after the other: word by word in numpy, a 1 MB item took
    # 131,072 steps of a dozen numpy calls. The tree hashes its pieces side by side.
    calls = []
    real = siphash._rounds_many
    monkeypatch.setattr(siphash, "_rounds_many", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(compiled, "kernel", lambda name, work: None)
    steps = {}
    for size in (1 << 12, 1 << 20):
        calls.clear()
        bits = ItemBits(RunKey.from_test_seed(1), "noise/0")
        got = bits.many(["x" * size, "y"])
        assert got[0] == siphash.prf64(bits._key, encode_value("x" * size))
        steps[size] = len(calls)
    # a level's pieces side by side (about 130 steps), levels growing as log_128 of the
    # length: 2 levels at 4 KB, 3 at 1 MB (word by word: 131,072 steps at 1 MB)
    assert steps[1 << 20] <= 1.6 * steps[1 << 12] < 600, steps
