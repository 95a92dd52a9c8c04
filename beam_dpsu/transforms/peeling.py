"""Discovery, then peeling, on Beam: top-k and k-hitting sets over an unknown domain.

The mechanisms and their pure stages are ``beam_dpsu.dp.mechanisms.peeling``.
The Beam expansion runs the discovery as Weighted Gaussian's own expansion (so
the domain is exactly what ``WeightedGaussian.run_local`` releases under the
same key), joins the data with the domain on the item (``CoGroupByKey``: no
side input, which some runners, Dask among them, evaluate again in every task),
and then:

* top-k: counts each item's users (one ``CombinePerKey``), keeps the
  discovered items and runs ``peel_top_k`` once, on one worker, on their counts;
* hitting set: keeps each user's items that are in the domain, regroups them
  per user and runs ``user_peeling`` once, on one worker, over all of them: the
  k rounds depend on each other, so they are one sequential pass. Its memory is
  one integer per (user, discovered item) pair held by that worker, plus one
  score per item.
"""
from __future__ import annotations

from typing import Optional

import apache_beam as beam

from beam_dpsu.dp.mechanisms.peeling import (DiscoverPeelHittingSet, DiscoverPeelTopK,
                                             DiscoverThenPeel)
from beam_dpsu.dp.privacy.calibration import check_flag
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms import run_key as keys
from beam_dpsu.transforms.bounding import PerUserItemCounts, check_global_window
from beam_dpsu.transforms.expansion import expand_mechanism

__all__ = ["DiscoverThenPeelTransform"]


def _item_ones(element):
    """``(user, {item: count})`` → ``(item, 1)`` for each of the user's distinct items."""
    for x in element[1]:
        yield x, 1


def _item_user(element):
    """``(user, {item: count})`` → ``(item, user)`` for each of the user's distinct items."""
    user = element[0]
    for x in element[1]:
        yield x, user


def _in_domain(element):
    """``(item, {'values': [...], 'domain': [...]})`` → its values when the item is
    in the discovered domain (the domain's marker is present)."""
    item, joined = element
    if joined["domain"]:
        for value in joined["values"]:
            yield item, value


def _user_item(element):
    item, user = element
    return user, item


def _held(element):
    return tuple(element[1])


def _one_key(element):
    return None, element


def _marked(item):
    return item, True


def _join_domain(values, domain, label: str):
    """``(item, value)`` pairs whose item is in ``domain``: a ``CoGroupByKey`` on the item
    (runner-neutral: the domain is not a side input, which a runner may re-evaluate
    per task)."""
    marks = domain | f"{label}/Mark" >> beam.Map(_marked)
    return ({"values": values, "domain": marks}
            | f"{label}/Join" >> beam.CoGroupByKey()
            | f"{label}/Keep" >> beam.FlatMap(_in_domain))


def _same_key(run_key: RunKey) -> RunKey:
    return run_key


class _PeelTopKDoFn(beam.DoFn):
    """(None, [(item, users), ...]) → the ranked rows of ``mechanism.peel``."""

    def __init__(self, mechanism: DiscoverPeelTopK):
        self._mechanism = mechanism
        self._run_key = keys.KeyedCache(_same_key)
        self._released = beam.metrics.Metrics.counter("beam_dpsu", "released")

    def process(self, element, key_bytes):
        counts = {}
        for item, n in element[1]:
            counts[item] = counts.get(item, 0) + n
        rows = self._mechanism.peel(counts, self._run_key(key_bytes))
        self._released.inc(len(rows))
        yield from rows


class _PeelHittingSetDoFn(beam.DoFn):
    """(None, [("domain", items) or ("user", held items), ...]) → ``mechanism.peel``'s rows."""

    def __init__(self, mechanism: DiscoverPeelHittingSet):
        self._mechanism = mechanism
        self._run_key = keys.KeyedCache(_same_key)
        self._released = beam.metrics.Metrics.counter("beam_dpsu", "released")

    def process(self, element, key_bytes):
        domain, user_sets = [], []
        for kind, value in element[1]:
            (domain if kind == "domain" else user_sets).append(value)
        rows = self._mechanism.peel(user_sets, domain, self._run_key(key_bytes))
        self._released.inc(len(rows))
        yield from rows


def _tagged(kind):
    def tag(value):
        return None, (kind, value)
    return tag


class DiscoverThenPeelTransform(beam.PTransform):
    """``(user_id, item)`` occurrences → the release of a discovery-then-peel mechanism:
    ``(rank, item)`` rows (top-k: by noisy count; hitting set: in the order chosen).

    Args:
      mechanism: a ``DiscoverPeelTopK`` or ``DiscoverPeelHittingSet``.
      run_key: the release's ``RunKey``; None (default) draws a fresh OS-random key
        on a worker (never part of the job graph).
      per_user: True when the input is already ``(user_id, {item: count})``;
        default False: ``(user_id, item)`` occurrences. No privacy effect, provided
        each user is ONE element.
      label: the transform's label (default: Beam's).

    Privacy: ``mechanism.guarantee`` under add/remove-one-user neighbours, provided
    each user id identifies one person and the key is used for one release. The
    rows' order is the mechanism's output (a rank), never the runner's.
    """

    def __init__(self, mechanism: DiscoverThenPeel, run_key: Optional[RunKey] = None,
                 per_user: bool = False, label: Optional[str] = None):
        super().__init__(label)
        if not isinstance(mechanism, DiscoverThenPeel):
            raise ValueError(f"mechanism must be a discovery-then-peel mechanism, "
                             f"got {mechanism!r}")
        self._mechanism = mechanism
        self._run_key = keys.for_pipeline(run_key)
        self._per_user = check_flag(per_user, "per_user")

    def expand(self, pcoll):
        from beam_dpsu.transforms import runners
        runners.check_input(pcoll, "DiscoverThenPeel")
        check_global_window(pcoll, "DiscoverThenPeel")
        per_user = pcoll if self._per_user else pcoll | "PerUser" >> PerUserItemCounts()
        return _expand(self._mechanism, per_user, self._run_key)


def _expand(mechanism: DiscoverThenPeel, per_user, run_key: RunKey):
    key = keys.key_side_input(per_user, run_key)
    domain = expand_mechanism(mechanism.discovery, per_user, run_key)
    if isinstance(mechanism, DiscoverPeelTopK):
        counts = (per_user
                  | "ItemOnes" >> beam.FlatMap(_item_ones)
                  | "UsersPerItem" >> beam.CombinePerKey(sum))
        # Every discovered item with its number of users (the domain's items all have
        # users: discovery releases only items of positive weight).
        return (_join_domain(counts, domain, "InDomain")
                | "OneKey" >> beam.Map(_one_key)
                | "Collect" >> beam.GroupByKey()
                | "Peel" >> beam.ParDo(_PeelTopKDoFn(mechanism), key))
    held = (_join_domain(per_user | "ItemUser" >> beam.FlatMap(_item_user), domain, "InDomain")
            | "ByUser" >> beam.Map(_user_item)
            | "GroupByUser" >> beam.GroupByKey()
            | "Held" >> beam.Map(_held))
    return ((domain | "TagDomain" >> beam.Map(_tagged("domain")),
             held | "TagUsers" >> beam.Map(_tagged("user")))
            | "Together" >> beam.Flatten()
            | "Collect" >> beam.GroupByKey()
            | "UserPeeling" >> beam.ParDo(_PeelHittingSetDoFn(mechanism), key))


@expand_mechanism.register
def _(mechanism: DiscoverThenPeel, per_user, run_key):
    return _expand(mechanism, per_user, run_key)
