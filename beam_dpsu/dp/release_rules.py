"""Release rules: decide, item by item, whether a weighted item is released.

The rules are small picklable callables, ``rule(item, weight) -> bool``,
shared by the Beam transforms (``beam_dpsu.transforms.release``) and the
Beam-free runs:

* ``NoisyThresholdRule``: add Laplace or Gaussian noise to a positive weight
  and release when the noisy weight is strictly above ``T``;
* ``TruncatedGeometricRule``: keep an item held by ``n`` users with the
  truncated geometric probability ``p(n)``.

An item with weight ≤ 0 is never noised and never released: a key that no
user gave weight to must not leak (``docs/mechanisms.md`` section 3).
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from beam_dpsu.dp import calibration
from beam_dpsu.dp.noise import KeyedNoise, RunKey, encode_value


__all__ = ["NOISE_KINDS", "check_noisy_threshold", "NoisyThresholdRule", "TruncatedGeometricRule"]


NOISE_KINDS = ("laplace", "gaussian")


_SIGN_BIT = 1 << 63


def check_noisy_threshold(noise: str, scale: float, threshold: float) -> None:
    """ValueError unless ``noise`` is a kind we sample, ``scale`` > 0 and ``threshold`` finite."""
    if noise not in NOISE_KINDS:
        raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
    calibration.check_sensitivity(scale, "noise scale")
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")


class NoisyThresholdRule:
    """Release ``item`` iff ``weight > 0`` and ``weight + noise(item) > threshold``.

    Args:
      noise: ``'laplace'`` (scale λ) or ``'gaussian'`` (standard deviation σ).
      scale: λ or σ, > 0.
      threshold: T, finite.
      run_key: the run's ``RunKey``; the noise of each item is derived from it.
      purpose: separates independent noise draws (``'noise/<round>'``).
    """

    def __init__(self, noise: str, scale: float, threshold: float, run_key: RunKey,
                 purpose: str = "noise/0"):
        check_noisy_threshold(noise, scale, threshold)
        self.threshold = float(threshold)
        self._noise = KeyedNoise(run_key, noise, scale, purpose)
        self._hash = self._noise._hash  # keyed_hash64(run_key.subkey(purpose), ·)

    def __call__(self, item: Any, weight: float) -> bool:
        if not weight > 0:
            return False
        # The same decision as ``weight + noise(item) > threshold``, with the
        # noise's inverse CDF skipped where its sign alone decides: the noise
        # is ``-m`` or ``+m`` with magnitude m >= 0 by the top bit of the item's
        # keyed hash (``noise._sign_and_tail``), so a negative draw can never lift
        # a weight <= T above T, and a positive one always keeps a weight > T.
        # Both shortcuts are exact (no rounding is involved); everything else
        # is the full computation.
        encoded = (b"s" + item.encode("utf-8", "surrogatepass") if type(item) is str
                   else encode_value(item))
        bits = self._hash(encoded)
        if weight <= self.threshold:
            if bits & _SIGN_BIT:
                return False
        elif not bits & _SIGN_BIT:
            return True
        return weight + self._noise._sampler(bits, self._noise.scale) > self.threshold


class TruncatedGeometricRule:
    """Keep an item with ``n ≥ 1`` users with probability ``p(n)`` (truncated geometric).

    ``weight`` must be the item's number of distinct users after Δ0 sampling.
    The keep probabilities are computed once, lazily, up to the largest count
    seen (they reach 1 after about log(1/δ')/ε' users).
    """

    def __init__(self, epsilon: float, delta: float, max_items: int, run_key: RunKey,
                 purpose: str = "noise/0"):
        self._params = (calibration.check_epsilon(epsilon), calibration.check_delta(delta),
                        calibration.check_max_items(max_items))
        self._uniform = KeyedNoise(run_key, "laplace", 1.0, purpose).uniform
        self._table: Optional[np.ndarray] = None

    def probability(self, n: int) -> float:
        if n <= 0:
            return 0.0
        table = self._table
        if table is None or n >= len(table):
            if table is not None and table[-1] >= 1.0:
                return 1.0
            size = max(1024, 2 * n if table is None else max(2 * n, 2 * len(table)))
            table = calibration.truncated_geometric_keep_probabilities(*self._params, size)
            self._table = table
            if n >= len(table):
                return float(table[-1])
        return float(table[n])

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_table"] = None
        return state

    def __call__(self, item: Any, weight: float) -> bool:
        n = int(round(weight))
        if n <= 0:
            return False
        return self._uniform(encode_value(item)) < self.probability(n)
