"""How each mechanism family runs on Beam: one generic function, one registration per family.

The core mechanisms (``beam_dpsu.dp.mechanisms``) state their guarantee,
calibration and Beam-free run and know nothing of Beam. Their Beam expansion
is registered here, family by family, with ``functools.singledispatch``:

* ``expand_mechanism(mechanism, per_user, run_key)``: a PCollection of
  ``(user_id, {item: count})``, one element per user → the released items;
* ``expand_mechanism_parts(mechanism, parts, run_key)``: the same on a tuple
  of such PCollections, each user in exactly one of them (default: flatten,
  then ``expand_mechanism``).

This module registers the histogram-and-threshold family; the other families
register in their own transform modules (``sips``, ``ordered``, ``topk``,
``budget``), which ``beam_dpsu.transforms.select`` imports. To add a family:
a core class in ``beam_dpsu/dp/mechanisms/``, and here or in a new transform
module ``@expand_mechanism.register(ThatClass)``.
"""
from __future__ import annotations

import functools

import apache_beam as beam

from beam_dpsu.dp.mechanisms.base import Mechanism
from beam_dpsu.dp.mechanisms.histogram_threshold import HistogramMechanism
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms.bounding import SampleItems
from beam_dpsu.transforms.histogram import ShardedHistogram
from beam_dpsu.transforms.release import ApplyReleaseRule

__all__ = ["expand_mechanism", "expand_mechanism_parts"]


@functools.singledispatch
def expand_mechanism(mechanism: Mechanism, per_user: beam.PCollection,
                     run_key: RunKey) -> beam.PCollection:
    """The Beam expansion of ``mechanism``: ``(user_id, {item: count})`` → released items."""
    raise TypeError(f"no Beam expansion is registered for {type(mechanism).__name__}; "
                    "register one with beam_dpsu.transforms.expansion.expand_mechanism.register")


@functools.singledispatch
def expand_mechanism_parts(mechanism: Mechanism, parts, run_key: RunKey) -> beam.PCollection:
    """``expand_mechanism`` on a tuple of per-user PCollections, each user in exactly one
    of them. Default: flattens them; a family that prepares users one by one registers
    its own, which prepares each part where it is produced (no shuffle of per-user dicts)."""
    return expand_mechanism(mechanism, parts | "FlattenUsers" >> beam.Flatten(), run_key)


def histogram_release(sampled, weighting: str, make_rule, run_key: RunKey):
    """Weighted histogram of already-sampled users (one PCollection, or a tuple of them
    summed as partial histograms), then the keyed release rule ``make_rule(run_key)``."""
    return (sampled
            | "Histogram" >> ShardedHistogram(weighting)
            | "Release" >> ApplyReleaseRule(make_rule, run_key, sharded=True))


@expand_mechanism.register
def _(mechanism: HistogramMechanism, per_user, run_key):
    r = mechanism.calibration
    sampled = per_user | "SampleItems" >> SampleItems(r.max_items, run_key, "sample/0")
    return histogram_release(sampled, r.weighting, mechanism.release_rule, run_key)


@expand_mechanism_parts.register
def _(mechanism: HistogramMechanism, parts, run_key):
    # Each part sampled and summed into partial histograms where it is produced;
    # only the partial histograms are flattened (ShardedHistogram of a tuple).
    r = mechanism.calibration
    sampled = tuple(part | f"SampleItems{k}" >> SampleItems(r.max_items, run_key, "sample/0")
                    for k, part in enumerate(parts))
    return histogram_release(sampled, r.weighting, mechanism.release_rule, run_key)
