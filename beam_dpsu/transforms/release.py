"""Noisy thresholding: release the items whose noisy weight is above a threshold.

The release rules are small picklable callables, ``rule(item, weight) -> bool``
with a vectorised ``rule.decide(items, weights)`` (used on sharded input),
shared by the Beam transforms and the Beam-free core (``beam_dpsu.dp.mechanisms.base``):

* ``NoisyThresholdRule``: add Laplace or Gaussian noise to a positive weight
  and release when the noisy weight is strictly above ``T``;
* ``TruncatedGeometricRule``: keep an item held by ``n`` users with the
  truncated geometric probability ``p(n)``.

An item with weight ≤ 0 is never noised and never released: a key that no
user gave weight to must not leak (``docs/mechanisms.md`` section 3).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import apache_beam as beam
import numpy as np

from beam_dpsu.transforms import run_key as keys
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.randomness.release_rules import NoisyThresholdRule, check_noisy_threshold


__all__ = ["ApplyReleaseRule", "NoisyThreshold"]


class _SelectDoFn(beam.DoFn):
    def __init__(self, make_rule, with_weight: bool, metric: Optional[str], sharded: bool):
        self._rule = keys.KeyedCache(make_rule)
        self._with_weight = with_weight
        self._sharded = sharded
        self._released = beam.metrics.Metrics.counter("beam_dpsu", "released")
        self._released_here = (beam.metrics.Metrics.counter("beam_dpsu", metric)
                               if metric else None)

    def process(self, element, key_bytes):
        rule = self._rule(key_bytes)
        if self._sharded:  # one vectorised decision for the shard's items
            hist = element[1]
            items = list(hist)
            weights = np.fromiter(hist.values(), np.float64, len(items))
            chosen = np.flatnonzero(rule.decide(items, weights)).tolist() if items else []
            pairs = [(items[i], hist[items[i]]) for i in chosen]
        else:
            pairs = [element] if rule(*element) else []
        n = len(pairs)
        for item, weight in pairs:
            yield (item, weight) if self._with_weight else item
        if n:
            self._released.inc(n)
            if self._released_here is not None:
                self._released_here.inc(n)


class ApplyReleaseRule(beam.PTransform):
    """``(item, weight)`` → the released items, by any keyed release rule.

    Args:
      make_rule: ``make_rule(run_key) -> rule`` with ``rule(item, weight) ->
        bool`` and, for ``sharded`` input, ``rule.decide(items, weights) -> bool
        array`` (the rules of ``dp.randomness.release_rules`` have both), e.g. a mechanism's ``release_rule`` method or
        ``functools.partial(NoisyThresholdRule, 'laplace', λ, T)``. It is
        called on the workers with the run's key (read from a side input, see
        ``beam_dpsu.transforms.run_key``), so no key is part of the job graph; it must be
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
    from ``run_key`` (see ``beam_dpsu.dp.randomness.noise``).

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
