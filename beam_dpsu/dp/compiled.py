"""Compiled array kernels, loaded once a process has enough work to repay their start-up.

The columnar path and the SipHash PRF have two implementations of their inner
loops: numpy operations (always available) and numba-compiled kernels
(``dp.array_kernels``, with the ``fast`` extra), which give the same results,
the tests check it, several times faster. Loading numba and its compiled code
costs about 1.5 s per process, more than the whole numpy work of a small input;
so ``kernel(name, work)`` counts the work a process has asked of each kernel
(messages hashed, strings compared) and returns the compiled kernel only once the
total passes ``WORK_BEFORE_COMPILING``, None before (the caller then runs its
numpy form). Which implementation runs never changes a result.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

__all__ = ["WORK_BEFORE_COMPILING", "kernel"]

#: Elements of work (per kernel, per process) after which the compiled kernel is used.
WORK_BEFORE_COMPILING = 5_000_000

_work: Dict[str, int] = {}
_module = None
_failed = False


def kernel(name: str, work: int) -> Optional[Callable]:
    """The compiled kernel ``name`` of ``dp.array_kernels``, or None while this process
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
            from beam_dpsu.dp import array_kernels
        except ImportError:
            _failed = True
            return None
        _module = array_kernels
    return getattr(_module, name)
