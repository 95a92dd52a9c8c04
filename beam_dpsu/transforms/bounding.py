"""Contribution bounding: per-user item frequencies and keyed-hash sampling to Δ0.

The per-user representation used throughout the library is
``(user_id, {item: count})``: a user's distinct items with how often the user
has each (``C_i[u]`` of the specification). ``PerUserItemCounts`` builds it from
a PCollection of ``(user_id, item)`` occurrences, aggregating inside each
bundle before the shuffle so that the per-element cost of the Python SDK is
paid once per (bundle, user) rather than once per occurrence.

``sample_items`` keeps, for a user with more than Δ0 distinct items, the Δ0
items of smallest SipHash score under a key derived from the run key and the
user (``dp.data.contribution``): a uniformly random subset, the same on every retry
and on every runner.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import apache_beam as beam
from apache_beam import typehints
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue

from beam_dpsu.transforms import run_key as keys
from beam_dpsu.dp.privacy.calibration import check_max_items
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.data.contribution import (DEFAULT_FLUSH_PAIRS, DEFAULT_USER_GROUPS, ItemCounts,
                                       canonical_id, canonical_pair, canonical_user_counts,
                                       merge_item_counts, sample_many, user_group)

__all__ = ["KV_ANY", "GLOBAL_WINDOWS", "GLOBAL_TIMESTAMP", "GroupUsers", "MergeItemCountsFn",
           "check_global_window", "PER_USER_DESIGNS", "PerUserItemCounts", "SampleItems",
           "mark_canonical_ids", "has_canonical_ids", "CanonicalPerUser"]


KV_ANY = typehints.Tuple[Any, Any]

# Where outputs of finish_bundle go: the library aggregates in the global window.
GLOBAL_WINDOWS = (window.GlobalWindow(),)
GLOBAL_TIMESTAMP = window.GlobalWindow().max_timestamp()


def _to_group(element, groups: int):
    return user_group(element[0], groups), element


class GroupUsers(beam.PTransform):
    """``(user, value)``, one element per user → ``(group, [(user, value), ...])``.

    A ``GroupByKey`` on ``user_group``: where a runner drops what a DoFn emits in
    ``finish_bundle`` (Beam's Dask runner), a DoFn that would aggregate a bundle of
    users aggregates a group instead, so what it emits is per group, not per user.
    A group's users are held in one worker's memory (users / ``groups`` of them).
    """

    def __init__(self, groups: int = DEFAULT_USER_GROUPS, label: Optional[str] = None):
        super().__init__(label)
        self._groups = groups

    def expand(self, per_user):
        return (per_user
                | "ToGroups" >> beam.Map(_to_group, self._groups)
                | "GroupUsers" >> beam.GroupByKey())


class MergeItemCountsFn(beam.CombineFn):
    """CombineFn adding ``{item: number}`` dicts (per-user counts, per-shard weights).

    Lifts into a per-bundle pre-combine.
    """

    def create_accumulator(self):
        return {}

    def add_input(self, acc, counts):
        if not acc:
            return dict(counts)
        get = acc.get
        for item, c in counts.items():
            acc[item] = get(item, 0) + c
        return acc

    def merge_accumulators(self, accs):
        return merge_item_counts(accs)

    def extract_output(self, acc):
        return acc


def check_global_window(pcoll: beam.PCollection, transform_name: str) -> None:
    """Raises a clear error for windowed input: set union is a batch aggregate."""
    windowfn = pcoll.windowing.windowfn
    if not isinstance(windowfn, window.GlobalWindows):
        raise ValueError(
            f"{transform_name} needs its input in the global window (a bounded, batch "
            f"aggregate over all users); got windowing {windowfn!r}. Re-window with "
            f"beam.WindowInto(beam.window.GlobalWindows()) first.")


# The attribute that marks a PCollection whose user ids and items are canonical
# (``canonical_id``): the outputs of PerUserItemCounts and textio.ReadUserItems.
_CANONICAL_IDS = "_beam_dpsu_canonical_ids"


def mark_canonical_ids(pcoll):
    """Marks ``pcoll`` (or each of a tuple of them) as holding ``(user_id, {item: count})``
    with canonical ids (``dp.data.contribution.canonical_id``), so that
    ``SelectPartitions(per_user=True)`` does not check them again; returns it."""
    for one in (pcoll if isinstance(pcoll, tuple) else (pcoll,)):
        setattr(one, _CANONICAL_IDS, True)
    return pcoll


def has_canonical_ids(pcoll) -> bool:
    """Whether ``mark_canonical_ids`` marked this PCollection."""
    return getattr(pcoll, _CANONICAL_IDS, False) is True


class CanonicalPerUser(beam.PTransform):
    """``(user_id, {item: count})`` → the same with canonical user ids and items.

    ``dp.data.contribution.canonical_user_counts`` on each element: numpy integers
    become ``int``; a ``bool``, ``float``, ``None`` or other refused type
    raises ``IdTypeError`` when the pipeline runs (a PCollection's elements are
    not known before). Applied by ``SelectPartitions(per_user=True)`` to input
    that ``mark_canonical_ids`` did not mark; costs one step per user (a type
    check per item). Privacy: makes identity exact (``docs/mechanisms.md``
    section 1); it does not make several elements of one user into one.
    """

    def expand(self, per_user):
        return mark_canonical_ids(
            per_user | "CanonicalIds" >> beam.Map(canonical_user_counts))


class _AggregateOccurrencesDoFn(beam.DoFn):
    """Counts (user, item) occurrences inside a bundle, emitting (user, counts) partials.
    User ids and items are made canonical (``canonical_id``) before they are counted."""

    def __init__(self, flush_pairs: int):
        self._flush_pairs = flush_pairs

    def start_bundle(self):
        self._acc: Dict[Any, ItemCounts] = {}
        self._pairs = 0

    def process(self, element):
        user, item = element
        if type(user) is not str:
            user = canonical_id(user, "user id")
        if type(item) is not str:
            item = canonical_id(item, "item")
        counts = self._acc.get(user)
        if counts is None:
            counts = self._acc[user] = {}
        c = counts.get(item)
        if c is None:
            counts[item] = 1
            self._pairs += 1
            if self._pairs >= self._flush_pairs:
                yield from self._acc.items()
                self._acc, self._pairs = {}, 0
        else:
            counts[item] = c + 1

    def finish_bundle(self):
        for user, counts in self._acc.items():
            yield WindowedValue((user, counts), GLOBAL_TIMESTAMP, GLOBAL_WINDOWS)
        self._acc, self._pairs = {}, 0


class _CountItemsFn(beam.CombineFn):
    """CombineFn: the items of one user's occurrences → ``{item: count}``.

    ``PerUserItemCounts`` applies it with ``CombinePerKey``, which Beam lifts
    into a per-bundle pre-combine (``add_input`` is called from the runner's
    combining table, without a DoFn invocation per occurrence) and merges the
    partial dicts after the shuffle. The items are canonical (``canonical_pair``
    runs before it).
    """

    def create_accumulator(self):
        return {}

    def add_input(self, acc, item):
        acc[item] = acc.get(item, 0) + 1
        return acc

    def add_inputs(self, acc, items):
        get = acc.get
        for item in items:
            acc[item] = get(item, 0) + 1
        return acc

    def merge_accumulators(self, accs):
        return merge_item_counts(accs)

    def extract_output(self, acc):
        return acc


#: The designs of ``PerUserItemCounts`` (benchmarks compare them in one process).
PER_USER_DESIGNS = ("combine", "bundle-dofn")


class PerUserItemCounts(beam.PTransform):
    """``(user_id, item)`` occurrences → ``(user_id, {item: count})``, one per user.

    The building block for every mechanism: deduplicates each user's items and
    keeps how often the user has each (GW uses the frequencies; the other
    mechanisms use only the distinct items).

    User ids and items must be ``str``, ``bytes``, ``int`` or tuples of these
    (recursively); numpy integers are converted to the equal ``int``. Any other
    type (``bool``, ``float``, ``None``, sets, ...) makes the pipeline fail
    when it runs, with an ``IdTypeError`` naming the type
    (``dp.data.contribution.canonical_id``; the elements of a PCollection are not
    known when the graph is built, so this is the earliest the error can
    come). Within these types Python equality is exactly the identity the keyed
    hashes use, so ``1``, ``1.0`` and ``True`` can never become one user or
    one item; ``42`` and ``"42"`` are different items. Each element costs one
    ``type(x) is str`` test per value when both are ``str``.

    How, in one of two designs with the same output:

    * ``'bundle-dofn'``: a DoFn counts each bundle's occurrences in its own
      ``{user: {item: count}}`` (making each id canonical as it goes), emits
      the partial dicts at the end of the bundle (or every ``flush_pairs``
      distinct pairs), and ``CombinePerKey`` merges them per user.
    * ``'combine'``: ``canonical_pair`` on each occurrence (a ``Map``, needed
      because Beam's pre-combine table groups keys by Python equality before
      any code of ours sees them; it also makes every element a tuple), then
      ``CombinePerKey`` with a dict-counting ``CombineFn``, which Beam lifts
      into a per-bundle pre-aggregation (at most 100,000 users per bundle in
      the runner's table). On a runner that does not lift combiners it is a
      ``GroupByKey`` of the pairs followed by the count.

    The default picks ``'bundle-dofn'`` where the runner keeps what a DoFn
    emits in ``finish_bundle`` (``runners.Capabilities.bundle_outputs``) and
    ``'combine'`` elsewhere (Beam's Dask runner, where the bundle DoFn would
    emit one dict per pair). Measured on 1M ``str`` pairs in one process
    (FnApiRunner, CPU time beyond generating the pairs): ``'bundle-dofn'``
    1.08 s, ``'combine'`` 2.05 s, of which about 0.8 s is the ``Map``; before
    the ids were checked the two cost 1.19 s and 1.27 s.

    Args:
      flush_pairs: with ``'bundle-dofn'``, a bundle's partial aggregate is
        emitted when it holds this many distinct (user, item) pairs (default
        1M; bounds worker memory). No privacy effect.
      design: None (default: chosen by the runner, see above), ``'combine'``
        or ``'bundle-dofn'``; the same output. No privacy effect.

    Privacy: this transform does not bound contributions; it makes each user's
    identity exact (``docs/mechanisms.md`` section 1), which the add/remove-one-user
    guarantees assume.
    """

    def __init__(self, flush_pairs: int = DEFAULT_FLUSH_PAIRS, label: Optional[str] = None,
                 design: Optional[str] = None):
        super().__init__(label)
        if isinstance(flush_pairs, bool) or not isinstance(flush_pairs, int) or flush_pairs < 1:
            raise ValueError(f"flush_pairs must be an integer >= 1, got {flush_pairs!r}")
        if design is not None and design not in PER_USER_DESIGNS:
            raise ValueError(f"design must be None or one of {PER_USER_DESIGNS}, got {design!r}")
        self._flush_pairs = flush_pairs
        self._design = design

    def _aggregate_fn(self, occurrences):
        # A runner that drops finish_bundle outputs (Dask): flush after every pair.
        from beam_dpsu.transforms import runners
        if runners.capabilities(occurrences.pipeline).bundle_outputs:
            return _AggregateOccurrencesDoFn(self._flush_pairs)
        return runners.per_element_flush(_AggregateOccurrencesDoFn(1))

    def expand(self, occurrences):
        check_global_window(occurrences, "PerUserItemCounts")
        design = self._design
        if design is None:
            from beam_dpsu.transforms import runners
            design = ("bundle-dofn" if runners.capabilities(occurrences.pipeline).bundle_outputs
                      else "combine")
        if design == "bundle-dofn":
            return mark_canonical_ids(
                occurrences
                | "AggregateInBundle" >> beam.ParDo(self._aggregate_fn(occurrences))
                | "MergePerUser" >> beam.CombinePerKey(MergeItemCountsFn()))
        # canonical_pair also makes each element a tuple, typed as a key-value pair
        # (an input typed only as ``tuple`` would fail Beam's key-value type check).
        return mark_canonical_ids(
            occurrences
            | "CanonicalIds" >> beam.Map(canonical_pair).with_output_types(KV_ANY)
            | "CountPerUser" >> beam.CombinePerKey(_CountItemsFn()))


class SampleItems(beam.PTransform):
    """``(user_id, {item: count})`` → the same with at most Δ0 items per user.

    Each user with more than Δ0 distinct items keeps a uniformly random subset
    of Δ0 of them, chosen by keyed hash (``sample_items``), so retries and
    runners agree. Users with no items are dropped.

    Args:
      max_items: Δ0, the contribution bound (integer ≥ 1). Smaller Δ0 means less
        noise per item for count-based mechanisms and less data per user.
      run_key: the run's ``RunKey`` (``RunKey.fresh()``, or a test seed); None
        draws a fresh key (then two ``SampleItems`` in one pipeline sample
        independently). The key's bytes are drawn on a worker and read as a
        side input (``beam_dpsu.transforms.run_key``), never staged with the job graph.
      purpose: the key's purpose label; mechanisms use ``'sample/<round>'``.

    Privacy: after this transform each user changes at most Δ0 distinct items,
    which is the sensitivity bound the calibrations assume.
    """

    def __init__(self, max_items: int, run_key: Optional[RunKey] = None,
                 purpose: str = "sample/0", label: Optional[str] = None):
        super().__init__(label)
        self._max_items = check_max_items(max_items)
        self._run_key = keys.for_pipeline(run_key)
        self._purpose = purpose

    def expand(self, per_user):
        from beam_dpsu.transforms import runners
        if runners.capabilities(per_user.pipeline).bundle_outputs:
            return per_user | "SampleToMaxItems" >> beam.ParDo(
                _SampleDoFn(self._max_items, self._purpose),
                keys.key_side_input(per_user, self._run_key))
        # Where finish_bundle outputs are dropped (Dask): batches are groups of users.
        grouped = per_user | "GroupForSampling" >> GroupUsers()
        return grouped | "SampleToMaxItems" >> beam.ParDo(
            _SampleGroupDoFn(self._max_items, self._purpose),
            keys.key_side_input(grouped, self._run_key))


#: ``_SampleDoFn`` samples its buffered users when they hold this many items.
SAMPLE_BATCH_ITEMS = 100_000


class _SampleDoFn(beam.DoFn):
    """Applies ``sample_items`` to each ``(user, counts)``, in batches (``sample_many``:
    one vectorised pass per batch of users, emitted when the batch holds
    ``SAMPLE_BATCH_ITEMS`` items and at the end of the bundle); drops users with
    no items.

    The sampling key is derived on the worker from the run key's bytes (a side
    input), so it is never part of the job graph.
    """

    def __init__(self, max_items: int, purpose: str):
        self._max_items = max_items
        self._key = keys.KeyedCache(keys.Subkey(purpose))

    def start_bundle(self):
        self._batch, self._items, self._sample_key = [], 0, None

    def process(self, element, key_bytes):
        user, counts = element
        if not counts:
            return
        self._sample_key = self._key(key_bytes)
        self._batch.append(element)
        self._items += len(counts)
        if self._items >= SAMPLE_BATCH_ITEMS:
            yield from self._flush()

    def _flush(self):
        batch, self._batch, self._items = self._batch, [], 0
        if not batch:
            return []
        sampled = sample_many(batch, self._max_items, self._sample_key)
        return [(user, kept) for (user, _), kept in zip(batch, sampled)]

    def finish_bundle(self):
        for value in self._flush():
            yield WindowedValue(value, GLOBAL_TIMESTAMP, GLOBAL_WINDOWS)


class _SampleGroupDoFn(beam.DoFn):
    """``(group, [(user, counts), ...])`` → each user sampled (``sample_many``)."""

    def __init__(self, max_items: int, purpose: str):
        self._max_items = max_items
        self._key = keys.KeyedCache(keys.Subkey(purpose))

    def process(self, element, key_bytes):
        users = [(user, counts) for user, counts in element[1] if counts]
        sampled = sample_many(users, self._max_items, self._key(key_bytes))
        yield from ((user, kept) for (user, _), kept in zip(users, sampled))
