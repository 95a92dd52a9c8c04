"""Noisy thresholding: release the items whose noisy weight is above a threshold.

The release rules are small picklable callables, ``rule(item, weight) -> bool``,
shared by the Beam transforms and the Beam-free core (``beam_dpsu.core``):

* ``NoisyThresholdRule``: add Laplace or Gaussian noise to a positive weight
  and release when the noisy weight is strictly above ``T``;
* ``TruncatedGeometricRule``: keep an item held by ``n`` users with the
  truncated geometric probability ``p(n)``.

An item with weight ≤ 0 is never noised and never released: a key that no
user gave weight to must not leak (``docs/mechanisms.md`` section 3).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional

import apache_beam as beam
import numpy as np

from beam_dpsu import calibration, keys
from beam_dpsu.noise import KeyedNoise, RunKey, encode_value

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


class _SelectDoFn(beam.DoFn):
    def __init__(self, make_rule, with_weight: bool, metric: Optional[str], sharded: bool):
        self._rule = keys.KeyedCache(make_rule)
        self._with_weight = with_weight
        self._sharded = sharded
        self._released = beam.metrics.Metrics.counter("beam_dpsu", "released")
        self._released_here = (beam.metrics.Metrics.counter("beam_dpsu", metric)
                               if metric else None)

    def process(self, element, key_bytes):
        pairs = element[1].items() if self._sharded else (element,)
        rule, n = self._rule(key_bytes), 0
        for item, weight in pairs:
            if rule(item, weight):
                n += 1
                yield (item, weight) if self._with_weight else item
        if n:
            self._released.inc(n)
            if self._released_here is not None:
                self._released_here.inc(n)


class ApplyReleaseRule(beam.PTransform):
    """``(item, weight)`` → the released items, by any keyed release rule.

    Args:
      make_rule: ``make_rule(run_key) -> rule`` with ``rule(item, weight) ->
        bool``, e.g. a mechanism's ``release_rule`` method or
        ``functools.partial(NoisyThresholdRule, 'laplace', λ, T)``. It is
        called on the workers with the run's key (read from a side input, see
        ``beam_dpsu.keys``), so no key is part of the job graph; it must be
        picklable and must not capture a key itself.
      run_key: the run's ``RunKey`` (``RunKey.fresh()`` or a test seed); None
        draws a fresh key.
      with_weight: emit ``(item, true_weight)`` instead of the item. The weight
        is NOT differentially private; use it only inside a pipeline (e.g. to
        carry data to a later stage), never release it.
      metric: also count the released items in the metric ``beam_dpsu/<metric>``
        (every release counts in ``beam_dpsu/released``).
      sharded: the input is ``(shard, {item: weight})`` (from
        ``histogram.ShardedHistogram`` or ``ordered.OrderedUserPolicy(...,
        sharded=True)``) instead of ``(item, weight)``.

    The output PCollection carries no order; see ``SelectPartitions``.
    """

    def __init__(self, make_rule: Callable[[RunKey], Callable[[Any, float], bool]],
                 run_key: Optional[RunKey] = None, with_weight: bool = False,
                 metric: Optional[str] = None, sharded: bool = False,
                 label: Optional[str] = None):
        super().__init__(label)
        if not callable(make_rule):
            raise ValueError(f"make_rule must be callable as make_rule(run_key), got {make_rule!r}")
        self._make_rule = make_rule
        self._run_key = keys.for_pipeline(run_key)
        self._with_weight = bool(with_weight)
        self._metric = metric
        self._sharded = bool(sharded)

    def expand(self, histogram):
        return histogram | "Select" >> beam.ParDo(
            _SelectDoFn(self._make_rule, self._with_weight, self._metric, self._sharded),
            keys.key_side_input(histogram, self._run_key))


class NoisyThreshold(ApplyReleaseRule):
    """``(item, weight)`` → items whose noisy weight is strictly above ``threshold``.

    Only items with weight > 0 are noised; each gets independent noise derived
    from ``run_key`` (see ``beam_dpsu.noise``).

    Args:
      noise: ``'laplace'`` or ``'gaussian'``.
      scale: the Laplace scale λ or the Gaussian σ (> 0), from ``calibration``.
      threshold: T, from ``calibration``.
      run_key: the run's ``RunKey``; None draws a fresh OS-random key.
      purpose: noise-key label (``'noise/<round>'``); two thresholdings of one
        run must use different purposes to draw independent noise.

    Privacy: (ε, δ)-DP exactly when ``scale`` and ``threshold`` are calibrated
    for the sensitivity of the input histogram (see ``calibration``).
    """

    def __init__(self, noise: str, scale: float, threshold: float,
                 run_key: Optional[RunKey] = None, purpose: str = "noise/0",
                 label: Optional[str] = None):
        check_noisy_threshold(noise, scale, threshold)
        super().__init__(functools.partial(NoisyThresholdRule, noise, scale, threshold,
                                           purpose=purpose), run_key, label=label)
