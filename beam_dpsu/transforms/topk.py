"""Top-k on Beam: ``TopK`` releases the ranked top-k rows of a core ``TopKMechanism``.

The calibration, the release of the true top ``k̄ + 1`` and the Beam-free run
are in ``beam_dpsu.dp.mechanisms.topk``; this module counts each item's users
(after Δ0 sampling), ranks them with the keyed tie-break and applies the
mechanism's release on one worker.
"""
from __future__ import annotations

import functools
from typing import Optional

import apache_beam as beam

from beam_dpsu.dp.mechanisms.topk import DEFAULT_PURPOSE, TopKMechanism, rank_key
from beam_dpsu.dp.privacy.calibration import check_flag
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms import run_key as keys
from beam_dpsu.transforms.bounding import PerUserItemCounts, SampleItems, check_global_window
from beam_dpsu.transforms.expansion import expand_mechanism
from beam_dpsu.transforms.histogram import WeightedHistogram

__all__ = ["TopK"]


class _RankDoFn(beam.DoFn):
    """``(item, count)`` → its ``RankKey`` value plus the item, keyed on the worker.

    The ranking key (count, then the keyed tie hash) needs the run key, which a
    combiner's key function could only get by carrying it in the job graph;
    attaching it here, from the side-input key, lets ``Top.Of`` rank by the
    natural order of the tuples.
    """

    def __init__(self, purpose: str):
        self._rank = keys.KeyedCache(functools.partial(rank_key, purpose=purpose))

    def process(self, item_count, key_bytes):
        yield self._rank(key_bytes)(item_count) + (item_count,)


def _same_key(run_key: RunKey) -> RunKey:
    return run_key


class _ReleaseDoFn(beam.DoFn):
    """Applies ``TopKMechanism.release`` to the one list produced by ``Top.Of``."""

    def __init__(self, mechanism: TopKMechanism, purpose: str):
        self._mechanism = mechanism
        self._purpose = purpose
        self._run_key = keys.KeyedCache(_same_key)
        self._released = beam.metrics.Metrics.counter("beam_dpsu", "released")

    def process(self, ranked_top, key_bytes):
        top = [entry[-1] for entry in ranked_top]
        rows = self._mechanism.release(top, self._run_key(key_bytes), self._purpose)
        self._released.inc(len(rows))
        yield from rows


def _one_key(element):
    return None, element


class _Largest:
    """(None, elements) → the n largest, largest first (as ``Top.Of(n)`` gives them)."""

    def __init__(self, n: int):
        self._n = n

    def __call__(self, element):
        import heapq
        return heapq.nlargest(self._n, element[1])


def _top(pipeline, n: int) -> beam.PTransform:
    """``Top.Of(n)``; on a runner that drops ``finish_bundle`` outputs (Dask), where
    ``Top.Of``'s per-bundle step would lose everything, GroupByKey under one key +
    ``heapq.nlargest`` (the same list; no list at all for an empty input)."""
    from beam_dpsu.transforms import runners
    if runners.capabilities(pipeline).bundle_outputs:
        return beam.combiners.Top.Of(n)
    return ("OneKey" >> beam.Map(_one_key)) | ("Group" >> beam.GroupByKey()) | (
        "Largest" >> beam.Map(_Largest(n)))


class TopK(beam.PTransform):
    """``(user_id, item)`` occurrences → the private top k, ``(rank, item[, noisy_count])``.

    Steps: per-user deduplication (``PerUserItemCounts``); with Δ, each user
    keeps at most Δ distinct items (``SampleItems``); distinct users per item
    (``WeightedHistogram('count')``, summed per bundle then per item); the true
    top k̄ + 1 by Beam's ``Top.Of`` (combined per bundle, so no worker collects
    the histogram); then one ``release`` call (Algorithm 1 or 2) on that list.

    Args:
      mechanism: a ``TopKMechanism`` (k, k̄, ε, δ, Δ, algorithm).
      run_key: the query's ``RunKey``; None (default) draws a fresh OS-random key
        (on a worker, read as a side input: never part of the job graph).
      per_user: True when the input is already ``(user_id, {item: count})``
        (e.g. from ``textio.ReadUserItems``); default False: ``(user_id, item)``
        occurrences. No privacy effect, provided each user is ONE element.
      purpose: key purpose of this query (default ``'topk/0'``), a non-empty string;
        distinct queries under one key need distinct purposes: two queries with the
        same purpose reuse the same noise, and their composition is not what
        their guarantees add up to.
      label: the transform's label (default: Beam's).

    Privacy: the output is ``mechanism.guarantee``-DP under add/remove-one-user
    neighbours; for Algorithm 2 charge ``mechanism.charge(len(output))`` to a
    ``PayWhatYouGetAccountant``. The metric ``beam_dpsu/released`` counts the
    released items.
    """

    def __init__(self, mechanism: TopKMechanism, run_key: Optional[RunKey] = None,
                 per_user: bool = False, purpose: str = DEFAULT_PURPOSE,
                 label: Optional[str] = None):
        super().__init__(label)
        if not isinstance(mechanism, TopKMechanism):
            raise ValueError(f"mechanism must be a TopKMechanism, got {mechanism!r}")
        self._mechanism = mechanism
        self._run_key = keys.for_pipeline(run_key)
        self._per_user = check_flag(per_user, "per_user")
        if not isinstance(purpose, str) or not purpose:
            raise ValueError(f"purpose must be a non-empty string, got {purpose!r}")
        self._purpose = purpose

    def expand(self, pcoll):
        from beam_dpsu.transforms import runners
        runners.check_input(pcoll, "TopK")
        check_global_window(pcoll, "TopK")
        m = self._mechanism
        per_user = pcoll if self._per_user else pcoll | "PerUser" >> PerUserItemCounts()
        if m.max_items is not None:
            per_user = per_user | "SampleItems" >> SampleItems(
                m.max_items, self._run_key, self._purpose + "/sample")
        key = keys.key_side_input(pcoll, self._run_key)
        return (per_user
                | "UsersPerItem" >> WeightedHistogram("count")
                | "Rank" >> beam.ParDo(_RankDoFn(self._purpose), key)
                | "TrueTop" >> _top(pcoll.pipeline, m.k_bar + 1)
                | "Release" >> beam.ParDo(_ReleaseDoFn(m, self._purpose), key))


@expand_mechanism.register
def _(mechanism: TopKMechanism, per_user, run_key):
    # TopK on (user_id, {item: count}): the ranked rows.
    return per_user | "TopK" >> TopK(mechanism, run_key, per_user=True)
