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

from beam_dpsu.dp.privacy import calibration
from beam_dpsu.dp.randomness.noise import ItemBits, RunKey, gaussian_many, laplace_many, uniform_below


__all__ = ["NOISE_KINDS", "TAIL_MARGIN", "check_noisy_threshold", "noise_tail",
           "NoisyThresholdRule", "GaussianLevels", "TruncatedGeometricRule"]


NOISE_KINDS = ("laplace", "gaussian")


_SIGN_BIT = 1 << 63


def check_noisy_threshold(noise: str, scale: float, threshold: float) -> None:
    """ValueError unless ``noise`` is a kind we sample, ``scale`` > 0 and ``threshold`` finite."""
    if noise not in NOISE_KINDS:
        raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
    calibration.check_sensitivity(scale, "noise scale")
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")


#: The relative margin by which ``noise_tail`` rounds a tail probability: at least 15
#: times the largest relative error of its float evaluation, measured against
#: 50-digit arithmetic (6e-14, Gaussian, near 27 standard deviations).
TAIL_MARGIN = 2.0 ** -40
#: An absolute margin in the subnormal range, where a double holds fewer digits.
_SUBNORMAL_MARGIN = 4 * 5e-324


def noise_tail(noise: str, scale: float, gaps, upward: bool = False) -> np.ndarray:
    """2·P(Z > gap) for Z ~ Lap(scale) or N(0, scale²), each gap ≥ 0, rounded down
    (``upward=False``, the default: never above the exact value) or up (never below it).

    Closed forms, no inverse CDF: e^(−gap/λ) (Laplace) and erfc(gap/(σ√2))
    (Gaussian, scipy's), then moved by the relative ``TAIL_MARGIN`` (and 4 units of
    the smallest double) so that the float evaluation's error (at most 6e-14
    relative) never puts it on the wrong side; clipped to [0, 1]. The tests compare
    both directions with 50-digit arithmetic over the whole range that does not
    underflow.
    """
    gaps = np.asarray(gaps, dtype=np.float64)
    if noise == "laplace":
        q = np.exp(-gaps / scale)
    else:
        from scipy.special import erfc  # only the Gaussian rules need scipy
        z = gaps / (scale * math.sqrt(2.0))
        q = erfc(z)
        if upward:  # scipy's erfc is 0 below 2^-1022: there, erfc(z) < e^(−z²)/(z·√π)
            deep = q < 2.0 ** -1000
            if deep.any():
                zd = z[deep]
                q[deep] = np.exp(-zd * zd) / (zd * math.sqrt(math.pi))
    if upward:
        q = q * (1.0 + TAIL_MARGIN) + _SUBNORMAL_MARGIN
    else:
        q = q * (1.0 - TAIL_MARGIN) - _SUBNORMAL_MARGIN
    return np.clip(q, 0.0, 1.0)


class _KeyedRule:
    """A rule on the keyed bits of each item (``self.bits``, a ``noise.ItemBits``):
    subclasses implement ``decide_bits(bits, weights, more)``, where ``more(indices,
    j)`` gives block j of the items at ``indices`` (``noise.uniform_below``)."""

    def __call__(self, item: Any, weight: float) -> bool:
        return bool(self.decide([item], np.array([weight], np.float64))[0])

    def decide(self, items: Sequence[Any], weights) -> np.ndarray:
        """The decisions (bool array) on ``items`` with their ``weights``."""
        items = list(items)
        return self.decide_bits(self.bits.many(items), weights, self._blocks_of(items))

    def _blocks_of(self, items: list):
        """``more(indices, j)``: block j of the keyed bits of ``items[indices]``."""
        def more(indices, j):
            return self.bits.block(j).many([items[i] for i in indices.tolist()])
        return more

    def decide_spans(self, data, starts, lengths, weights) -> np.ndarray:
        """The decisions on the UTF-8 strings ``data[starts[i]:starts[i] + lengths[i]]``
        (Arrow's layout; ``ItemBits.many_str``): the same as ``decide`` on the strings."""
        bits, more = self._spans(data, starts, lengths)
        return self.decide_bits(bits, weights, more)

    def _spans(self, data, starts, lengths):
        """``(bits, more)`` of the UTF-8 strings at ``starts``/``lengths`` of ``data``."""
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)

        def more(indices, j):
            return self.bits.block(j).many_str(data, starts[indices], lengths[indices])

        return self.bits.many_str(data, starts, lengths), more


class NoisyThresholdRule(_KeyedRule):
    """Release ``item`` iff ``weight > 0`` and ``weight + noise(item) > threshold``.

    The noise Z of an item is symmetric; its sign is the top bit of the item's 64
    keyed bits (``noise.ItemBits``: SipHash-2-4 of the item's canonical bytes under
    the run key's subkey ``purpose``) and the rest of the bits, continued by further
    keyed blocks where needed, are an exact uniform U (``noise.uniform_below``). The
    decision is made on probabilities, never on a drawn noise value: with the gap
    g = |T − weight|, an item below the threshold is released iff Z > 0 and
    U < 2·P(Z > g) (rounded down), one above it is dropped iff Z < 0 and
    U < 2·P(Z > g) (rounded up). That is the release probability P(weight + Z > T)
    of the exact distribution, with no smallest probability and no largest draw
    (``noise_tail``). The same item gets the same decision on a retry, distinct
    items independent ones, and no item's decision depends on any other item.
    ``decide`` rules on many items at once (vectorised), ``rule(item, weight)`` on
    one, with the same result; ``noise(items)`` gives the noise values these
    decisions correspond to (for ranking), by inverse CDF of the same U.

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

    def decide_bits(self, bits: np.ndarray, weights, more) -> np.ndarray:
        """The decisions on items whose keyed bits (``self.bits``) are ``bits``,
        ``more(indices, j)`` their further blocks (see the class docstring)."""
        weights = np.asarray(weights, dtype=np.float64)
        return self.exceeds_bits(bits, weights, more, weights > 0)  # False for NaN

    def exceeds_bits(self, bits: np.ndarray, weights, more, positive=None) -> np.ndarray:
        """``weight + Z > T`` for every item (``positive``: only where True, default
        wherever the weight is a number), decided on probabilities as the class docstring says. Without
        ``positive`` a weight of 0 is decided too: that is the Gaussian mechanism's
        noisy value compared with T, not a release (``GaussianLevels``)."""
        weights = np.asarray(weights, dtype=np.float64)
        bits = np.asarray(bits, dtype=np.uint64)
        if positive is None:
            positive = ~np.isnan(weights)  # a NaN weight is never decided
        negative = (bits >> np.uint64(63)).astype(bool)
        low = weights <= self.threshold
        out = positive & ~low & ~negative  # above T with Z > 0: always released
        # below T (or at it) with Z > 0: released iff U < 2·P(Z > T − w), rounded down
        rise = np.flatnonzero(positive & low & ~negative)
        if rise.size:
            q = noise_tail(self.noise, self.scale, self.threshold - weights[rise])
            out[rise] = uniform_below(bits[rise], 63, q, lambda i, j: more(rise[i], j))
        # above T with Z < 0: dropped iff U < 2·P(Z > w − T), rounded up
        fall = np.flatnonzero(positive & ~low & negative)
        if fall.size:
            q = noise_tail(self.noise, self.scale, weights[fall] - self.threshold, upward=True)
            out[fall] = ~uniform_below(bits[fall], 63, q, lambda i, j: more(fall[i], j))
        return out

    def exceeds_spans(self, data, starts, lengths, weights) -> np.ndarray:
        """``exceeds_bits`` (every weight decided) on UTF-8 strings, as ``decide_spans``."""
        bits, more = self._spans(data, starts, lengths)
        return self.exceeds_bits(bits, weights, more)

    def noise_spans(self, data, starts, lengths) -> np.ndarray:
        """``noise_values`` of UTF-8 strings, as ``decide_spans`` reads them."""
        bits, more = self._spans(data, starts, lengths)
        sampler = gaussian_many if self.noise == "gaussian" else laplace_many
        return sampler(bits, more, self.scale)

    def noise_values(self, items: Sequence[Any]) -> np.ndarray:
        """The noise of each item, by inverse CDF of the uniform the decisions use:
        ``weight + noise > T`` agrees with the decision but for the float rounding
        of both within a few units in the last place of the boundary (for ranking
        released items by noisy weight; never used to decide)."""
        items = list(items)
        sampler = gaussian_many if self.noise == "gaussian" else laplace_many
        return sampler(self.bits.many(items), self._blocks_of(items), self.scale)


class GaussianLevels(_KeyedRule):
    """How many of the increasing levels ``L_0 < … < L_{m−1}`` an item's noisy value
    ``weight + Z`` exceeds, Z ~ N(0, σ²) keyed per item under ``purpose``: a
    post-processing of the Gaussian mechanism's noisy value, not a release.

    Each comparison is ``NoisyThresholdRule``'s exact decision at that level on the
    item's one uniform U (the same bits for every level), so the answers are nested
    (exceeding a level implies exceeding every lower one) and their count is the
    index of the noisy value's interval. Unlike a release rule, a weight of 0 is
    decided too (its noisy value is Z alone): which items have weight is not
    something a post-processing may read. ``decide`` returns int64 counts in
    ``[0, m]``. Used by the adaptive-weighting estimate (``docs/mechanisms.md``
    section 11).

    Args:
      sigma: σ > 0 of the Gaussian noise.
      levels: the increasing finite levels.
      run_key: the run's ``RunKey``.
      purpose: the key purpose of the noise (distinct from every release round's).
    """

    def __init__(self, sigma: float, levels: Sequence[float], run_key: RunKey,
                 purpose: str):
        levels = [float(x) for x in levels]
        if not levels or any(b <= a for a, b in zip(levels, levels[1:])):
            raise ValueError(f"levels must be non-empty and increasing, got {levels!r}")
        self.rules = [NoisyThresholdRule("gaussian", sigma, level, run_key, purpose)
                      for level in levels]
        self.bits = ItemBits(run_key, purpose)

    def __call__(self, item: Any, weight: float) -> int:
        return int(self.decide([item], np.array([weight], np.float64))[0])

    def decide_bits(self, bits: np.ndarray, weights, more) -> np.ndarray:
        weights = np.asarray(weights, dtype=np.float64)
        bits = np.asarray(bits, dtype=np.uint64)
        counts = np.zeros(weights.shape, np.int64)
        live = np.flatnonzero(~np.isnan(weights))
        for rule in self.rules:  # nested: only the items above a level meet the next one
            if not live.size:
                break
            above = rule.exceeds_bits(bits[live], weights[live],
                                      lambda i, j, live=live: more(live[i], j))
            live = live[above]
            counts[live] += 1
        return counts


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
        # doubled until it holds n or stops changing (the recurrence then stays put):
        # never a table of the size of a count it does not need
        while table is None or (n >= len(table) and table[-1] != table[-2]):
            size = 1024 if table is None else 2 * len(table)
            table = calibration.truncated_geometric_keep_probabilities(*self._params, size)
            self._table = table
        return float(table[min(n, len(table) - 1)])

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_table"] = None
        return state

    def decide_bits(self, bits: np.ndarray, weights, more) -> np.ndarray:
        """Keep item ``i`` iff its count ``n = round(weights[i])`` is >= 1 and the exact
        uniform of its keyed bits (all 64, then ``more``'s blocks) is below p(n):
        a Bernoulli trial of probability p(n) itself (``noise.uniform_below``)."""
        n = np.rint(np.asarray(weights, dtype=np.float64))
        n = np.where(np.isfinite(n), n, 0.0)
        out = np.zeros(len(n), dtype=bool)
        counted = np.flatnonzero(n >= 1)
        if counted.size:
            self.probability(int(n[counted].max()))  # the table reaches the largest count
            table = self._table
            p = table[np.minimum(n[counted], len(table) - 1).astype(np.int64)]
            out[counted] = uniform_below(np.asarray(bits, np.uint64)[counted], 64, p,
                                         lambda i, j: more(counted[i], j))
        return out
