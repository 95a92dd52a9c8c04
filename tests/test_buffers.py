"""``dp.randomness.buffers``: arrays from Arrow's memory pool, and a reader's reused arrays."""
import numpy as np
import pyarrow as pa
import pytest

from beam_dpsu.dp.randomness import buffers


@pytest.mark.parametrize("dtype", [np.uint8, np.bool_, np.int32, np.int64, np.uint64,
                                   np.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 100_000])
def test_empty_is_a_writable_array_from_arrows_pool(dtype, n):
    before = pa.total_allocated_bytes()
    a = buffers.empty(n, dtype)
    assert a.dtype == np.dtype(dtype) and a.shape == (n,) and a.flags.writeable
    assert a.flags.c_contiguous and a.ctypes.data % 64 == 0
    held = pa.total_allocated_bytes() - before
    assert held >= n * np.dtype(dtype).itemsize  # Arrow's pool holds it...
    a[:] = 1
    assert (a == 1).all()
    del a
    assert pa.total_allocated_bytes() - before < max(held, 1)  # ...until it is dropped


def test_empty_refuses_a_negative_size():
    with pytest.raises(ValueError, match="at least 0 elements; got -1"):
        buffers.empty(-1, np.int64)


def test_scratch_gives_the_held_array_while_it_is_large_enough():
    s = buffers.Scratch()
    a = s.take("x", 100, np.int64)
    assert a.shape == (100,)
    assert s.take("x", 50, np.int64).ctypes.data == a.ctypes.data  # the same memory
    b = s.take("x", 101, np.int64)  # grown by a quarter
    assert b.shape == (101,) and b.base is not a.base
    assert s.take("x", 125, np.int64).ctypes.data == b.ctypes.data
    assert s.take("x", 10, np.float64).dtype == np.float64  # another dtype: a new array
    assert s.take("y", 10, np.int64).ctypes.data != s.take("x", 10, np.int64).ctypes.data
