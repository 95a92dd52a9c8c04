"""Release rules: decide, item by item, whether a weighted item is released.

The rules are small picklable callables, ``rule(item, weight) -> bool``, that
also decide many items at once (``rule.decide(items, weights)``, vectorised),
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
from typing import Any, Optional, Sequence

import numpy as np

from beam_dpsu.dp import calibration
from beam_dpsu.dp.noise import (ItemBits, RunKey, gaussian_from_bits_many,
                                laplace_from_bits_many, uniform_from_bits_many)


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


class _KeyedRule:
    """A rule on the keyed bits of each item (``self.bits``, a ``noise.ItemBits``):
    subclasses implement ``decide_bits(bits, weights)``."""

    def __call__(self, item: Any, weight: float) -> bool:
        return bool(self.decide([item], np.array([weight], np.float64))[0])

    def decide(self, items: Sequence[Any], weights) -> np.ndarray:
        """The decisions (bool array) on ``items`` with their ``weights``."""
        return self.decide_bits(self.bits.many(items), weights)


class NoisyThresholdRule(_KeyedRule):
    """Release ``item`` iff ``weight > 0`` and ``weight + noise(item) > threshold``.

    The noise of an item is drawn by inverse CDF from its 64 keyed bits
    (``noise.ItemBits``: SipHash-2-4 of the item's canonical bytes under the
    run key's subkey ``purpose``): the same item gets the same noise on a
    retry, distinct items independent noise, and no item's noise depends on
    any other item. ``decide`` rules on many items at once (vectorised; the
    Beam transforms and the Beam-free runs use it), ``rule(item, weight)`` on
    one, with the same result.

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
        self.noise = noise
        self.scale = float(scale)
        self.threshold = float(threshold)
        self.bits = ItemBits(run_key, purpose)

    def decide_bits(self, bits: np.ndarray, weights) -> np.ndarray:
        """The decisions on items whose keyed bits (``self.bits``) are ``bits``.

        The same as ``weight + noise > threshold`` for every positive weight,
        with the noise's inverse CDF skipped where its sign alone decides: the
        noise is ``-m`` or ``+m`` with magnitude m >= 0 by the top bit of the
        item's bits (``noise._sign_and_tail``), so a negative draw can never
        lift a weight <= T above T, and a positive one always keeps a weight
        > T. Both shortcuts are exact; everything else is the full computation.
        """
        weights = np.asarray(weights, dtype=np.float64)
        positive = weights > 0  # False for NaN
        negative = (bits >> np.uint64(63)).astype(bool)
        low = weights <= self.threshold
        out = positive & ~low & ~negative
        undecided = np.flatnonzero(positive & (low != negative))
        if undecided.size:
            draw = (gaussian_from_bits_many if self.noise == "gaussian"
                    else laplace_from_bits_many)(bits[undecided], self.scale)
            out[undecided] = weights[undecided] + draw > self.threshold
        return out


class TruncatedGeometricRule(_KeyedRule):
    """Keep an item with ``n ≥ 1`` users with probability ``p(n)`` (truncated geometric).

    ``weight`` must be the item's number of distinct users after Δ0 sampling.
    The keep probabilities are computed once, lazily, up to the largest count
    seen (they reach 1 after about log(1/δ')/ε' users).
    """

    def __init__(self, epsilon: float, delta: float, max_items: int, run_key: RunKey,
                 purpose: str = "noise/0"):
        self._params = (calibration.check_epsilon(epsilon), calibration.check_delta(delta),
                        calibration.check_max_items(max_items))
        self.bits = ItemBits(run_key, purpose)
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

    def decide_bits(self, bits: np.ndarray, weights) -> np.ndarray:
        """Keep item ``i`` iff its count ``n = round(weights[i])`` is >= 1 and the
        uniform draw of its keyed bits (``noise.uniform_from_bits``) is below p(n)."""
        n = np.rint(np.asarray(weights, dtype=np.float64))
        n = np.where(np.isfinite(n), n, 0.0)
        out = np.zeros(len(n), dtype=bool)
        counted = np.flatnonzero(n >= 1)
        if counted.size:
            self.probability(int(n[counted].max()))  # the table reaches the largest count
            table = self._table
            p = table[np.minimum(n[counted], len(table) - 1).astype(np.int64)]
            out[counted] = uniform_from_bits_many(bits[counted]) < p
        return out
