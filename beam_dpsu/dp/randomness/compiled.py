"""Compiled array kernels, loaded once a process has enough work to repay their start-up.

The columnar path and the SipHash PRF have two implementations of their inner
loops: numpy operations (always available) and numba-compiled kernels
(``dp.randomness.array_kernels``, with the ``fast`` extra), which give the same results,
the tests check it, several times faster. Loading numba and its compiled code
costs about 1.5 s per process, more than the whole numpy work of a small input;
so ``kernel(name, work)`` counts the work a process has asked of each kernel
(messages hashed, strings compared) and returns the compiled kernel only once the
total passes ``WORK_BEFORE_COMPILING``, None before (the caller then runs its
numpy form). Which implementation runs never changes a result.

A Ctrl-C must not arrive inside numba: loading a kernel's machine code (on its
first call in a process, from numba's cache, or compiling it) runs Python
callbacks from LLVM, and a KeyboardInterrupt raised in one of them crashes the
process (a segmentation fault) or leaves the kernel unusable ("no compiled object
yet"). So a kernel's call in the main thread with argument types it has not been
called with before (the calls in which numba loads or compiles code) holds SIGINT
until it returns (``interrupts_held``) and then raises the held interrupt through
the handler that was in place: a Ctrl-C waits at most for one such call (a block's
worth of work, or numba's compilation on a machine's first run). Other calls run as
they are (holding costs two ``signal.signal`` calls, too much for every call of a
per-user path).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Callable, Dict, Iterator, Optional

import numpy as np

__all__ = ["WORK_BEFORE_COMPILING", "kernel", "interrupts_held", "first_compilation_ahead"]

#: Elements of work (per kernel, per process) after which the compiled kernel is used.
WORK_BEFORE_COMPILING = 5_000_000

_work: Dict[str, int] = {}
_module = None
_failed = False
_held: Dict[str, Callable] = {}


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Holds a SIGINT (Ctrl-C) that arrives inside the block and delivers it when the
    block ends, through the handler that was installed (the default one raises
    KeyboardInterrupt). Only the main thread receives Python's signals and may set
    their handlers: elsewhere, and where SIGINT is ignored, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # SIG_IGN, SIG_DFL or not set from Python: leave it
        yield
        return
    arrived = []
    signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if arrived:
            previous(signal.SIGINT, arrived[0])


def _type_key(value) -> Any:
    """What numba's dispatch tells apart in an argument (an array's dtype, number of
    dimensions, layout, writability and alignment; a scalar's type), or more."""
    if isinstance(value, np.ndarray):
        flags = value.flags
        return (value.dtype, value.ndim, flags.writeable, flags.c_contiguous,
                flags.f_contiguous, flags.aligned)
    return type(value)


class _Held:
    """A compiled kernel whose calls with argument types it has not returned from yet
    (the calls in which numba may load or compile code) hold SIGINT
    (``interrupts_held``); later calls with those types run directly."""

    def __init__(self, function: Callable):
        self._function = function
        self._seen: set = set()
        self.__name__ = self.__qualname__ = getattr(function, "__name__", "kernel")
        self.__doc__ = function.__doc__

    def __call__(self, *args):
        key = tuple([_type_key(a) for a in args])
        if key in self._seen:
            return self._function(*args)
        with interrupts_held():
            out = self._function(*args)
        self._seen.add(key)
        return out


def first_compilation_ahead(folders=None) -> bool:
    """Whether numba is installed and has not yet cached the compiled kernels of this
    installation (``dp/randomness/__pycache__/array_kernels.*.nbi``, or under ``NUMBA_CACHE_DIR``):
    then the first input large enough to use them (``WORK_BEFORE_COMPILING``) waits about
    40 s for numba to compile them, once. The command lines say so before reading.
    ``folders``: where to look for numba's cache (default: the two above)."""
    import importlib.util
    import glob
    import os
    if importlib.util.find_spec("numba") is None:
        return False
    if folders is None:
        folders = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")]
        if os.environ.get("NUMBA_CACHE_DIR"):
            folders.append(os.environ["NUMBA_CACHE_DIR"])
    return not any(glob.glob(os.path.join(folder, "**", "array_kernels.*.nbi"), recursive=True)
                   for folder in folders)


def kernel(name: str, work: int) -> Optional[Callable]:
    """The compiled kernel ``name`` of ``dp.randomness.array_kernels``, or None while this process
    has asked less than ``WORK_BEFORE_COMPILING`` elements of it (``work`` is this
    call's) or numba is not installed."""
    global _module, _failed
    if _module is None:
        if _failed:
            return None
        done = _work.get(name, 0) + work
        _work[name] = done
        if done < WORK_BEFORE_COMPILING:
            return None
        try:
            with interrupts_held():  # numba's import initialises LLVM
                from beam_dpsu.dp.randomness import array_kernels
        except ImportError:
            _failed = True
            return None
        _module = array_kernels
    held = _held.get(name)
    if held is None:
        held = _held[name] = _Held(getattr(_module, name))
    return held
