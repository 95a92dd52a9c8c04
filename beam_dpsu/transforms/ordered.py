"""The ordered-user transform of the sequential policy mechanisms.

``OrderedUserPolicy`` runs a sequential update policy (``beam_dpsu.dp.data.sequential``)
over a PCollection of ``(user_id, {item: count})`` and returns the finished
histogram as ``(item, weight)`` for every item with weight > 0. The mechanisms
``PolicyLaplace``, ``PolicyGaussian``, ``GW`` and ``GWKT``
(``beam_dpsu.dp.mechanisms.policy``) then add noise
and apply the threshold ``T`` with ``transforms.release.ApplyReleaseRule`` exactly as
the histogram mechanisms do (``docs/mechanisms.md`` section 4).

How the transform works
-----------------------
1. ``Prepare`` (parallel, any number of workers): each user is prepared by the
   policy (Δ0 sampling, or the greedy walk order), their items are replaced by
   63-bit item ids (``sequential.ItemIds``: a keyed hash of the item), and the
   user gets the sort key ``keyed_hash64(run_key.subkey('order'),
   encode_value(user))``. Users are grouped per bundle into 2^bucket_bits
   buckets by the top bits of that hash (paying Beam's per-element cost once
   per bucket and bundle), and the bundle's ``{id: item}`` map goes to a side
   output in ``ID_SHARDS`` shards by the low bits of the id (one element per
   shard and bundle; the shards are merged per shard with ``CombinePerKey``).
2. ``SortBuckets`` (parallel): each bucket is grouped and sorted by (sort hash,
   canonical bytes of the user id), then packed into two byte strings (the
   users' id counts and their ids). Bucket b precedes bucket b + 1 in the
   order, so the buckets in increasing index are the users in processing order.
3. ``Sequential`` (one key, one worker): a stateful DoFn stores one entry per
   bucket and, when the event-time timer at the end of the global window fires
   (all users have arrived), reads the buckets in order, applies
   ``policy.update`` user by user to an in-memory ``{item id: weight}``
   histogram and emits the ids with weight > 0 as ``(shard, {id: weight})``.
   Reading a few packed buckets instead of one state entry per user is what
   makes this stage fast.
4. ``JoinShards``/``ToItems`` (parallel): each shard's weights are joined with
   the same shard's id map from step 1 (``CoGroupByKey``) and emitted as one
   ``(shard, {item: weight})`` dict per shard (``sharded=True``, what the
   policy mechanisms pass to ``ApplyReleaseRule(sharded=True)``), or
   flattened to ``(item, weight)`` elements (distinct items that share an id
   make the pipeline fail with ``sequential.ItemIdCollision``; probability about
   n²/2^64). No worker holds the whole id map, and nothing is a per-item
   shuffle, element or side input.

State and runners (``state`` argument)
--------------------------------------
* ``'ordered_list'``: ``OrderedListState`` (Beam's timestamp-sorted list
  state, sort key = the bucket index as a microsecond "timestamp"). The timer
  streams the buckets in order from state, so only the histogram (one float
  per item that some user raised), the id map and one bucket must fit in the
  worker's memory, not all users — on a runner whose state backend pages
  state in. Supported
  by the Python FnApiRunner (which the Python DirectRunner uses for batch
  pipelines; it keeps all state in memory, so there the users are in memory
  too). Not supported, as of Beam 2.77, by the Flink runner (apache/beam
  issue 21358), the Spark runner (issue 33211) or Dataflow Runner v2
  (issue 20666). Prism: not verified.
* ``'bag'``: the fallback for every runner with stateful DoFns and
  event-time timers (Flink, Spark, Dataflow, Prism): the packed buckets in
  ``BagState``, sorted by bucket index in the timer callback. All prepared users (item ids, 8
  bytes per kept user-item pair, plus the user ids) must then fit in the
  worker's memory.
* ``'gbk'``: for runners without stateful DoFns (Beam's Dask runner): the
  packed buckets are grouped under one key (GroupByKey) and replayed in bucket
  order by one ParDo. Memory as ``'bag'``: all packed buckets (8 bytes per kept
  user-item pair plus 4 per user) and the histogram on one worker.
* ``'auto'`` (default): ``'ordered_list'`` on the DirectRunner, the
  FnApiRunner and the BundleBasedDirectRunner; ``'gbk'`` on runners without
  user state (``beam_dpsu.transforms.runners.capabilities``); ``'bag'`` on any other runner.

Either way the result is identical: the order is a function of the run key
and the user ids only.

Steps 2-4 are ``RunPrepared``, which also runs after the columnar path's
preparation (``transforms.columnar.SelectFromText``: a user group's users
prepared at once from arrays, ``dp.data.columnar_policy``), in the same form.

Throughput: the sequential stage runs on one core by construction.
"""
from __future__ import annotations

import pickle
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
import numpy as np
from apache_beam.coders import coders
from apache_beam.transforms import userstate, window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_dpsu.transforms import run_key as keys
from beam_dpsu.transforms import runners
from beam_dpsu.dp.data import sequential as policies
from beam_dpsu.transforms.bounding import GroupUsers, check_global_window
from beam_dpsu.dp.mechanisms.policy import STATES, PolicyMechanism
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms.expansion import expand_mechanism, expand_mechanism_parts
from beam_dpsu.transforms.release import ApplyReleaseRule

__all__ = ["DEFAULT_BUCKET_BITS", "check_bucket_bits", "encode_ids", "user_entry", "decode_ids", "ID_SHARDS",
           "shard_id_map", "shard_arrays", "sort_bucket", "UPDATE_ONLY_KEY", "resolve_state",
           "public_counts_side_input", "PolicyAndOrderKey", "id_map_shards", "RunPrepared", "OrderedUserPolicy"]


# Runners known not to implement OrderedListState: see beam_dpsu/runners.py.
DEFAULT_BUCKET_BITS = 10


def check_bucket_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= 20:
        raise ValueError(f"bucket_bits must be an integer in [0, 20], got {bits!r}")
    return bits


def encode_ids(ids: List[int]) -> bytes:
    """A user's prepared item ids as 8-byte little-endian integers (cheap to ship)."""
    return np.array(ids, dtype="<i8").tobytes()


def user_entry(order_key: bytes, user: Any, ids) -> Tuple[int, bytes, bytes]:
    """A prepared user as the buckets carry it: ``(sort hash, encoded user id,
    encode_ids(ids))`` (``sequential.user_sort_key`` under ``order_key``); its
    bucket is the sort hash's top bits."""
    h, encoded = policies.user_sort_key(order_key, user)
    return h, encoded, encode_ids(ids)


def decode_ids(blob: bytes) -> List[int]:
    return np.frombuffer(blob, dtype="<i8").tolist()


# ---------------------------------------------------------------------------
# Step 1: prepare users (parallel) and sort them by bucket (parallel).
# ---------------------------------------------------------------------------

#: Item ids are grouped into this many shards (by their low bits) wherever the
#: transform ships per-item data (the id → item map, the finished histogram), so
#: that Beam's per-element cost is paid per shard and bundle, not per item.
ID_SHARDS = 1024
_ID_SHARD_MASK = ID_SHARDS - 1


def shard_id_map(item_to_id: Mapping[Any, int]) -> List[Tuple[int, Dict[int, Any]]]:
    """``{item: id}`` → ``[(shard, {id: item})]`` for the non-empty shards (shard =
    ``id % ID_SHARDS``), in increasing shard order; within a shard the entries keep
    the mapping's order. Two items with one id leave one entry (callers compare
    the total size with the mapping's).

    A plain loop over the mapping: it visits the items in the order they were
    stored, about twice as fast for a million items as sorting the ids into
    shard order with numpy and gathering the items in that order (each item
    then a random memory access). Shards are made as they are needed, so a
    small map (one user's, on runners that flush per user) costs little.
    """
    shards: Dict[int, Dict[int, Any]] = {}
    get = shards.get
    mask = _ID_SHARD_MASK
    for item, i in item_to_id.items():
        part = get(i & mask)
        if part is None:
            shards[i & mask] = {i: item}
        else:
            part[i] = item
    return sorted(shards.items())


def shard_arrays(ids: np.ndarray, values: np.ndarray) -> Iterator[Tuple[int, Dict[int, Any]]]:
    """``(shard, {id: value})`` for the non-empty shards (shard = ``id % ID_SHARDS``),
    in increasing shard order; ``ids`` is an int64 array of ids ≥ 0 and ``values``
    the array of the matching values (the finished histogram's weights).

    The grouping is done by numpy (a stable sort of the shard numbers), and
    each shard's dict is built by ``dict(zip(...))``: no Python loop per id.
    Within a shard the ids keep their order in ``ids``. Ids that occur twice
    make a shard smaller than its slice (callers that need distinct ids check
    the total size).
    """
    if ids.size == 0:
        return
    shards = ids & _ID_SHARD_MASK
    order = np.argsort(shards, kind="stable")
    sorted_ids = ids[order].tolist()
    sorted_values = values[order].tolist()
    sorted_shards = shards[order]
    starts = np.flatnonzero(np.diff(sorted_shards)) + 1
    bounds = [0] + starts.tolist() + [len(sorted_ids)]
    first = sorted_shards[bounds[:-1]].tolist()
    for s, lo, hi in zip(first, bounds[:-1], bounds[1:]):
        yield s, dict(zip(sorted_ids[lo:hi], sorted_values[lo:hi]))


def _pack(part) -> bytes:
    return pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)


def id_map_shards(item_to_id: Mapping[Any, int]) -> List[Tuple[int, bytes]]:
    """``{item: id}`` → ``[(shard, pickled {id: item})]`` (``shard_id_map``), what
    ``RunPrepared`` joins with the histogram; raises ``ItemIdCollision`` when two
    distinct items share an id."""
    parts = shard_id_map(item_to_id)
    if sum(len(part) for _, part in parts) != len(item_to_id):  # two items, one id
        raise _collision()
    return [(shard, _pack(part)) for shard, part in parts]


def _collision():
    return policies.ItemIdCollision(
        "two distinct items share a 63-bit item id; rerun with a fresh run key")


@beam.typehints.with_output_types(Tuple[int, Any])
class _PrepareDoFn(beam.DoFn):
    """(user, counts) → (bucket, [(sort hash, user bytes, encoded ids)]); side output
    (shard, {id: item}).

    The bucket is the top ``bucket_bits`` bits of the user's sort hash, so
    buckets in increasing order hold the users in increasing hash order.
    Users are grouped per bucket inside a bundle before they are emitted (every
    ``FLUSH_PAIRS`` prepared ids, and at the end of the bundle), and the
    bundle's items are collected into one ``{id: item}`` map, emitted in
    ``ID_SHARDS`` shards (one element per shard, not per item) at the end of
    the bundle or once it holds ``FLUSH_IDS`` items (then a new map starts, so
    an item may be sent again in the same bundle).
    For the sampled policies (``ids_follow_items``) the map is the policy's
    ``ItemIds`` cache itself, emptied at the start of each bundle
    (``ItemIds.record_into``): the ids it looks up are the items it keeps, so
    no second dict is built per user.
    """

    IDS = "ids"
    FLUSH_PAIRS = 1 << 20
    FLUSH_IDS = 1 << 20

    def __init__(self, make_policy, bucket_bits: int, envelope: bool = False):
        # The policy (its sampling and item-id keys) and the order key are built
        # on the worker from the run key's bytes, a side input: no key is staged.
        self._keyed = keys.KeyedCache(PolicyAndOrderKey(make_policy))
        self._shift = 64 - bucket_bits
        # envelope: for runners that mix tagged outputs and drop finish_bundle
        # outputs (Dask): (tag, value) main outputs, buckets flushed per user.
        self._envelope = envelope
        if envelope:
            self.FLUSH_PAIRS = self.FLUSH_IDS = 0
            runners.per_element_flush(self)
        self._users = beam.metrics.Metrics.counter("beam_dpsu", "ordered_users")
        self._pairs = beam.metrics.Metrics.counter("beam_dpsu", "ordered_pairs")
        self._micros = beam.metrics.Metrics.counter("beam_dpsu", "ordered_prepare_micros")

    def start_bundle(self):
        self._buckets: Dict[int, list] = {}
        self._pending_pairs = 0
        self._item_ids: Dict[Any, int] = {}  # this bundle's items → ids
        self._recorder = None  # the ItemIds whose cache is self._item_ids
        self._n_users = self._n_pairs = 0
        self._elapsed = 0.0

    def _record(self, policy) -> bool:
        """True when ``policy``'s item-id cache is this bundle's id map (see the
        class docstring); binds it on the bundle's first user."""
        if self._envelope or not getattr(policy, "ids_follow_items", False):
            return False
        if self._recorder is not policy.item_ids:
            self._recorder = policy.item_ids
            self._recorder.record_into(self._item_ids)
        return True

    def _id_shards(self):
        """The bundle's ``{id: item}`` map in shards, each pickled (``_join_shard``
        unpickles them: the runners' shuffles move opaque bytes, not one decoded
        entry per item); fails on an id collision. Starts a new, empty map."""
        known = self._item_ids
        self._item_ids = {}
        if self._recorder is not None:
            self._recorder.record_into(self._item_ids)
        return id_map_shards(known)

    def _flush(self):
        for entry in self._buckets.items():
            yield runners.main_output(entry, self._envelope)
        self._buckets, self._pending_pairs = {}, 0

    def _flush_ids(self):
        for part in self._id_shards():
            yield runners.tag(part, self.IDS, self._envelope)

    def process(self, element, key_bytes, public_counts=None):
        t0 = time.perf_counter()
        user, counts = element
        policy, order_key = self._keyed(key_bytes)
        recorded = self._record(policy)
        ids, items = policy.prepare(user, counts, public_counts)
        if not ids:
            return
        entry = user_entry(order_key, user, ids)
        h = entry[0]
        bucket = self._buckets.get(h >> self._shift)
        if bucket is None:
            self._buckets[h >> self._shift] = [entry]
        else:
            bucket.append(entry)
        self._n_users += 1
        self._n_pairs += len(ids)
        self._pending_pairs += len(ids)
        # item -> id (an id is a function of the item: re-recording one is a no-op)
        if recorded:  # the lookups in prepare recorded them
            pass
        elif getattr(policy, "ids_follow_items", False):  # ids[k] is the id of the k-th item
            self._item_ids.update(zip(items, ids))
        else:
            items = items if isinstance(items, (list, tuple)) else list(items)
            self._item_ids.update(zip(items, policy.item_ids.many(items)))
        self._elapsed += time.perf_counter() - t0
        if self._pending_pairs >= self.FLUSH_PAIRS:
            yield from self._flush()
        if len(self._item_ids) >= self.FLUSH_IDS:
            yield from self._flush_ids()

    def finish_bundle(self):
        gw = window.GlobalWindow()
        ts = gw.max_timestamp()
        for bucket, users in self._buckets.items():
            yield WindowedValue((bucket, users), ts, [gw])
        for part in self._id_shards():
            yield beam.pvalue.TaggedOutput(self.IDS, WindowedValue(part, ts, [gw]))
        if self._recorder is not None:  # the policy's cache is its own again
            self._recorder.record_into(None)
            self._recorder = None
        self._buckets, self._pending_pairs = {}, 0
        self._users.inc(self._n_users)
        self._pairs.inc(self._n_pairs)
        self._micros.inc(int(self._elapsed * 1e6))


class _PrepareGroupDoFn(_PrepareDoFn):
    """``(group, [(user, counts), ...])`` → what ``_PrepareDoFn`` emits for a bundle of
    those users: the group's buckets and id-map shards, as envelopes. For runners that
    drop ``finish_bundle`` outputs (Dask), where a per-user flush would send every
    user's bucket entry and id shards through the shuffles as elements of their own."""

    def __init__(self, make_policy, bucket_bits: int):
        super().__init__(make_policy, bucket_bits, envelope=True)
        self.FLUSH_PAIRS = _PrepareDoFn.FLUSH_PAIRS
        self.FLUSH_IDS = _PrepareDoFn.FLUSH_IDS

    def process(self, element, key_bytes, public_counts=None):
        self.start_bundle()
        for user in element[1]:
            yield from super().process(user, key_bytes, public_counts)
        yield from self._flush()
        yield from self._flush_ids()


class PolicyAndOrderKey:
    """``run_key -> (make_policy(run_key), run_key.subkey('order'))`` (picklable)."""

    def __init__(self, make_policy):
        self._make_policy = make_policy

    def __call__(self, run_key: RunKey):
        return self._make_policy(run_key), run_key.subkey("order")


def _by_hash_then_user(entry):
    return entry[0], entry[1]


def sort_bucket(element) -> Tuple[int, Tuple[int, bytes, bytes]]:
    """(bucket, lists of users) → (0, (bucket, lengths, ids)) in processing order.

    The users of the bucket are sorted by (sort hash, encoded user id) and
    packed as two byte strings: each user's number of ids (int32) and all ids
    (int64) back to back. The user ids themselves are not needed any more.
    """
    bucket, groups = element
    users = [u for group in groups for u in group]
    users.sort(key=_by_hash_then_user)
    lengths = np.fromiter((len(u[2]) >> 3 for u in users), dtype="<i4", count=len(users))
    return 0, (bucket, lengths.tobytes(), b"".join(u[2] for u in users))


# ---------------------------------------------------------------------------
# Step 2: the sequential stage (one key).
# ---------------------------------------------------------------------------

class _SequentialBase(beam.DoFn):
    """Shared policy loop: sorted buckets of users → histogram → (shard, {id: weight > 0})."""

    def setup(self):
        from beam_dpsu.dp.data import kernels
        kernels.warm_up()

    def __init__(self, policy: policies.UserPolicy):
        self._policy = policy
        # Time spent adding buckets to state, and in the timer (read, policy, emit).
        self._micros = beam.metrics.Metrics.counter("beam_dpsu", "ordered_sequential_add_micros")
        self._timer_micros = beam.metrics.Metrics.counter("beam_dpsu",
                                                          "ordered_sequential_timer_micros")

    def _run(self, packed_buckets):
        """``packed_buckets``: (lengths, ids) byte strings of the buckets, in bucket order.

        Returns the histogram as arrays ``(ids, weights)``."""
        return policies.run_packed_arrays(
            ((np.frombuffer(lengths, dtype="<i4"), np.frombuffer(ids, dtype="<i8"))
             for lengths, ids in packed_buckets), self._policy)

    def _emit(self, hist):
        """``(shard, pickled {id: weight})`` for the ids with weight > 0, ``ID_SHARDS``
        shards (``_join_shard`` unpickles them)."""
        ids, weights = hist
        positive = weights > 0
        for shard, part in shard_arrays(ids[positive], weights[positive]):
            yield shard, _pack(part)


_BUCKET_CODER = coders.TupleCoder([coders.BytesCoder(), coders.BytesCoder()])


class _OrderedListDoFn(_SequentialBase):
    BUCKETS = userstate.OrderedListStateSpec("buckets", _BUCKET_CODER)
    FLUSH = userstate.TimerSpec("flush", TimeDomain.WATERMARK)

    def process(self, element, buckets=beam.DoFn.StateParam(BUCKETS),
                flush=beam.DoFn.TimerParam(FLUSH), w=beam.DoFn.WindowParam):
        t0 = time.perf_counter()
        bucket, lengths, ids = element[1]
        buckets.add((Timestamp(micros=bucket), (lengths, ids)))
        flush.set(w.max_timestamp())
        self._micros.inc(int((time.perf_counter() - t0) * 1e6))

    @userstate.on_timer(FLUSH)
    def on_flush(self, buckets=beam.DoFn.StateParam(BUCKETS)):
        t0 = time.perf_counter()
        hist = self._run(packed for _, packed in buckets.read())
        buckets.clear()
        self._timer_micros.inc(int((time.perf_counter() - t0) * 1e6))
        yield from self._emit(hist)


class _BagDoFn(_SequentialBase):
    BUCKETS = userstate.BagStateSpec(
        "buckets", coders.TupleCoder([coders.VarIntCoder(), coders.BytesCoder(),
                                      coders.BytesCoder()]))
    FLUSH = userstate.TimerSpec("flush", TimeDomain.WATERMARK)

    def process(self, element, buckets=beam.DoFn.StateParam(BUCKETS),
                flush=beam.DoFn.TimerParam(FLUSH), w=beam.DoFn.WindowParam):
        t0 = time.perf_counter()
        buckets.add(element[1])
        flush.set(w.max_timestamp())
        self._micros.inc(int((time.perf_counter() - t0) * 1e6))

    @userstate.on_timer(FLUSH)
    def on_flush(self, buckets=beam.DoFn.StateParam(BUCKETS)):
        t0 = time.perf_counter()
        ordered_buckets = sorted(buckets.read(), key=lambda b: b[0])
        hist = self._run((lengths, ids) for _, lengths, ids in ordered_buckets)
        del ordered_buckets
        buckets.clear()
        self._timer_micros.inc(int((time.perf_counter() - t0) * 1e6))
        yield from self._emit(hist)


class _GbkSequentialDoFn(_SequentialBase):
    """state='gbk': all packed buckets grouped under one key, replayed in bucket order.

    For runners without stateful DoFns (Dask). Same result as the state paths;
    the GroupByKey hands the one worker every packed bucket at once.
    """

    def process(self, element):
        t0 = time.perf_counter()
        ordered_buckets = sorted(element[1], key=lambda b: b[0])
        hist = self._run((lengths, ids) for _, lengths, ids in ordered_buckets)
        del ordered_buckets
        self._timer_micros.inc(int((time.perf_counter() - t0) * 1e6))
        yield from self._emit(hist)


# ---------------------------------------------------------------------------
# Step 3: ids back to items.
# ---------------------------------------------------------------------------

class _MergeIdMapsFn(beam.CombineFn):
    """Merges ``{id: item}`` maps of one shard; fails if two distinct items share an id."""

    def create_accumulator(self):
        return {}

    def add_input(self, acc, id_to_item):
        if not acc:
            return dict(id_to_item)
        for i in acc.keys() & id_to_item.keys():  # ids both maps know: the same item?
            if acc[i] != id_to_item[i]:
                raise _collision()
        acc.update(id_to_item)
        return acc

    def merge_accumulators(self, accs):
        merged = {}
        for acc in accs:
            if len(acc) > len(merged):
                merged, acc = dict(acc), merged
            merged = self.add_input(merged, acc) if merged else dict(acc)
        return merged

    def extract_output(self, acc):
        return acc


def _join_shard(element):
    """``(shard, {'w': [pickled {id: weight}...], 'ids': [pickled {id: item}...]})`` →
    ``(shard, {item: weight})`` (nothing for a shard without weights). The id maps
    of several bundles are merged here (``_MergeIdMapsFn``: a collision fails)."""
    shard, grouped = element
    parts = [pickle.loads(b) for b in grouped["w"]]
    if not parts:
        return
    maps = [pickle.loads(b) for b in grouped["ids"]]
    id_to_item = maps[0] if len(maps) == 1 else _MergeIdMapsFn().merge_accumulators(maps)
    to_item = id_to_item.__getitem__
    out: Dict[Any, float] = {}
    for weights in parts:
        out.update(zip(map(to_item, weights.keys()), weights.values()))
    yield shard, out


def _shard_items(element):
    return element[1].items()


def _read_text_lines(pattern):
    from beam_dpsu.transforms.textio import match_files
    for path in match_files(pattern):
        with FileSystems.open(path) as f:
            for line in f:
                yield line.decode("utf-8").rstrip("\r\n")


def resolve_state(state: str, pipeline) -> str:
    """The state choice ``state`` (``'auto'``, ``'ordered_list'``, ``'bag'`` or
    ``'gbk'``) for ``pipeline``'s runner: ``'auto'`` resolved (see the module
    docstring); ValueError for a choice the runner cannot run."""
    if state not in STATES:
        raise ValueError(f"state must be one of {STATES}, got {state!r}")
    caps = runners.capabilities(pipeline)
    runner = caps.name
    if state == "ordered_list" and runner in runners.NO_ORDERED_LIST_RUNNERS:
        raise ValueError(
            f"state='ordered_list' needs OrderedListState, which {runner} does not "
            f"support (Beam {beam.__version__}); use state='bag' or state='auto'")
    if state in ("ordered_list", "bag") and not caps.user_state:
        raise ValueError(
            f"state={state!r} needs stateful DoFns, which {runner} does not run "
            f"(its DoFns get no state); use state='gbk' or state='auto'")
    if state != "auto":
        return state
    if not caps.user_state:
        return "gbk"
    return "ordered_list" if caps.ordered_list_state else "bag"


def public_counts_side_input(pipeline, pub):
    """GW-KT's public counts as a dict side input: ``pub`` a path or pattern of
    ``item<TAB>count`` files (read with Beam's text IO, duplicates summed), a
    ``{item: count}`` mapping or a PCollection of ``(item, count)``; None stays None."""
    if pub is None:
        return None
    if isinstance(pub, str) and not runners.capabilities(pipeline).read_primitive:
        pub = (pipeline  # no Read primitive (Dask): a Create of the pattern
               | "PublicCountsPattern" >> beam.Create([pub])
               | "ReadPublicCounts" >> beam.FlatMap(_read_text_lines)
               | "ParsePublicCounts" >> beam.Map(policies.parse_public_count_line)
               | "DropBlank" >> beam.Filter(lambda kv: kv[0] is not None)
               | "SumPublicCounts" >> beam.CombinePerKey(sum))
    elif isinstance(pub, str):
        pub = (pipeline
               | "ReadPublicCounts" >> beam.io.ReadFromText(pub)
               | "ParsePublicCounts" >> beam.Map(policies.parse_public_count_line)
               | "DropBlank" >> beam.Filter(lambda kv: kv[0] is not None)
               | "SumPublicCounts" >> beam.CombinePerKey(sum))
    elif isinstance(pub, Mapping):
        pub = pipeline | "PublicCounts" >> beam.Create(sorted(pub.items(), key=repr))
    return beam.pvalue.AsDict(pub)


# The sequential stage needs a policy object only for its cutoff and update
# rule, which use no key; it is built under this public placeholder so that the
# real keys never enter the job graph (prepare, which uses them, runs with the
# side-input key).
UPDATE_ONLY_KEY = RunKey(b"beam_dpsu public placeholder: update rules use no key")


class OrderedUserPolicy(beam.PTransform):
    """``(user_id, {item: count})`` → ``(item, weight)`` (or, with ``sharded=True``,
    ``(shard, {item: weight})``): a sequential policy's histogram.

    The input may also be a tuple of such PCollections, each user in exactly
    one of them (each is prepared where it is produced).

    Users are processed one at a time in the order of
    ``keyed_hash64(run_key.subkey('order'), encode_value(user_id))`` (ties by
    the encoded user id), each applying ``policy.update`` to the histogram
    built so far. Only items with weight > 0 are emitted; the weights are NOT
    differentially private (add noise with ``ApplyReleaseRule``).

    Args:
      make_policy: ``make_policy(run_key) -> policies.UserPolicy``, e.g. a
        policy mechanism's ``policy`` method. It is called on the workers with
        the run's key, read from a side input (``beam_dpsu.transforms.run_key``), so that no
        key (sampling, item ids, user order) is part of the job graph. The
        sequential stage uses only the policy's cutoff and ``update``, which
        use no key; it gets a policy built under a public placeholder key.
      run_key: the run's ``RunKey`` (``RunKey.fresh()`` or a test seed; the
        user order comes from it).
      public_counts: for a policy that needs them (GW-KT): a path to an
        ``item<TAB>count`` file (read with Beam's text IO, duplicates summed),
        a ``{item: count}`` mapping, or a PCollection of ``(item, count)``.
        Public counts cost no privacy budget. None otherwise.
      state: ``'auto'`` (default), ``'ordered_list'`` or ``'bag'``; see the
        module docstring for which runners support which. No privacy effect.
      bucket_bits: users are sorted in parallel in 2^bucket_bits buckets of
        the order (default 10: 1024 buckets), and the sequential stage holds
        one state entry per bucket. No privacy effect; more buckets mean
        smaller sorts and, with ordered-list state on a runner that pages
        state, less memory in the sequential worker.
      sharded: when True, the output is the same histogram as ``(shard,
        {item: weight})`` dicts (every item in exactly one shard, by the low
        bits of its item id), which ``threshold.ApplyReleaseRule(...,
        sharded=True)`` consumes: one Beam element per shard instead of one
        per item. Default False: ``(item, weight)`` elements. No privacy
        effect (the policy mechanisms use True).

    Privacy: none by itself; given that the order depends on no user's data,
    the histogram has the per-user sensitivity of the policy (ℓ1 ≤ 1 for
    ℓ1-descent and the greedy policies, ℓ2 ≤ 1 for ℓ2-descent). That alone is
    not a privacy proof: the mechanisms also need the support condition
    (only the added user's kept items can be new in the histogram), which
    ℓ1/ℓ2-descent and the cascade-free greedy have and the published greedy
    does not (``docs/gw.md``).
    """

    def __init__(self, make_policy, run_key: RunKey, public_counts=None,
                 state: str = "auto", bucket_bits: int = DEFAULT_BUCKET_BITS,
                 label: Optional[str] = None, sharded: bool = False):
        super().__init__(label)
        self._sharded = bool(sharded)
        policy = make_policy(UPDATE_ONLY_KEY) if callable(make_policy) else None
        if not isinstance(policy, policies.UserPolicy):
            raise ValueError("make_policy must be callable as make_policy(run_key) and return "
                             f"a beam_dpsu.dp.data.sequential.UserPolicy, got {make_policy!r}")
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        self._bucket_bits = check_bucket_bits(bucket_bits)
        if policy.needs_public_counts and public_counts is None:
            raise ValueError(f"policy {policy.name!r} needs public_counts")
        if not policy.needs_public_counts and public_counts is not None:
            raise ValueError(f"policy {policy.name!r} does not use public_counts")
        self._make_policy = make_policy
        self._update_policy = policy
        self._run_key = keys.for_pipeline(run_key)
        self._public = public_counts
        self._state = state

    def _prepare(self, per_user, prep_args, suffix: str = ""):
        """Step 1 on one PCollection of users: (bucketed users, id-map shards)."""
        if runners.capabilities(per_user.pipeline).tagged_outputs:
            prepared = per_user | f"Prepare{suffix}" >> beam.ParDo(
                _PrepareDoFn(self._make_policy, self._bucket_bits), *prep_args
            ).with_outputs(_PrepareDoFn.IDS, main="users")
            return prepared.users, prepared[_PrepareDoFn.IDS]
        # the runner mixes tagged outputs (Dask): one output of (tag, value)
        if runners.capabilities(per_user.pipeline).bundle_outputs:
            prepared = per_user | f"Prepare{suffix}" >> beam.ParDo(
                _PrepareDoFn(self._make_policy, self._bucket_bits, envelope=True), *prep_args)
        else:  # finish_bundle outputs are dropped: prepare users in groups
            prepared = (per_user
                        | f"GroupUsers{suffix}" >> GroupUsers()
                        | f"Prepare{suffix}" >> beam.ParDo(
                            _PrepareGroupDoFn(self._make_policy, self._bucket_bits),
                            *prep_args))
        split = runners.split_envelopes(prepared, f"SplitPrepared{suffix}",
                                        (None, _PrepareDoFn.IDS))
        return split[None], split[_PrepareDoFn.IDS]

    def expand(self, per_user):
        # A tuple of PCollections: per-user parts (each user in one of them, e.g. the
        # merged and complete users of ReadUserItems), each prepared where it is made.
        parts = tuple(per_user) if isinstance(per_user, (tuple, list)) else (per_user,)
        for part in parts:
            check_global_window(part, "OrderedUserPolicy")
        pipeline = parts[0].pipeline
        side = public_counts_side_input(pipeline, self._public)
        prep_args = [keys.key_side_input(parts[0], self._run_key)]
        if side is not None:
            prep_args.append(side)
        state = resolve_state(self._state, pipeline)
        if len(parts) == 1:
            users, ids = self._prepare(parts[0], prep_args)
        else:
            prepared = [self._prepare(part, prep_args, str(k)) for k, part in enumerate(parts)]
            users = [u for u, _ in prepared] | "FlattenUsers" >> beam.Flatten()
            ids = [i for _, i in prepared] | "FlattenIds" >> beam.Flatten()
        return (users, ids) | "Ordered" >> RunPrepared(self._update_policy, state, self._sharded)


class RunPrepared(beam.PTransform):
    """Prepared users → the policy's histogram: steps 2-4 of ``OrderedUserPolicy``.

    The input is a pair of PCollections ``(buckets, id_shards)``: ``(bucket, [(sort
    hash, encoded user id, encode_ids(ids)), ...])`` (users may be spread over
    several elements of one bucket) and ``(shard, pickled {id: item})`` (the id maps,
    ``shard_id_map``), as ``OrderedUserPolicy``'s preparation or the columnar
    path (``transforms.columnar``) makes them. The output is that of
    ``OrderedUserPolicy``.

    Args:
      update_policy: the policy whose ``update`` runs (built under
        ``UPDATE_ONLY_KEY``: the update uses no key).
      state: ``'ordered_list'``, ``'bag'`` or ``'gbk'`` (``resolve_state``).
      sharded: as ``OrderedUserPolicy``'s.
      label: the transform's label (optional).
    """

    def __init__(self, update_policy: policies.UserPolicy, state: str, sharded: bool,
                 label: Optional[str] = None):
        super().__init__(label)
        if state not in ("ordered_list", "bag", "gbk"):
            raise ValueError(f"state must be 'ordered_list', 'bag' or 'gbk', got {state!r}")
        self._policy, self._state, self._sharded = update_policy, state, bool(sharded)

    def expand(self, prepared):
        users, ids = prepared
        sorted_buckets = (users
                          | "GroupBuckets" >> beam.GroupByKey()
                          | "SortBuckets" >> beam.Map(sort_bucket))
        if self._state == "gbk":
            weights = (sorted_buckets
                       | "CollectBuckets" >> beam.GroupByKey()
                       | "Sequential" >> beam.ParDo(_GbkSequentialDoFn(self._policy)))
        else:
            seq_fn = (_OrderedListDoFn if self._state == "ordered_list" else _BagDoFn)(
                self._policy)
            weights = sorted_buckets | "Sequential" >> beam.ParDo(seq_fn)
        # The bundles' id maps go straight into the join (merged per shard there).
        shards = ({"w": weights, "ids": ids}
                  | "JoinShards" >> beam.CoGroupByKey()
                  | "ToItems" >> beam.FlatMap(_join_shard))
        if self._sharded:
            return shards
        return shards | "PerItem" >> beam.FlatMap(_shard_items)


@expand_mechanism.register
def _(mechanism: PolicyMechanism, per_user, run_key):
    hist = per_user | "OrderedPolicy" >> OrderedUserPolicy(
        mechanism.policy, run_key, mechanism.public_counts, state=mechanism.state, sharded=True)
    return hist | "Release" >> ApplyReleaseRule(mechanism.release_rule, run_key, sharded=True)


@expand_mechanism_parts.register
def _(mechanism: PolicyMechanism, parts, run_key):
    # Each part prepared where it is produced (OrderedUserPolicy of a tuple).
    return expand_mechanism(mechanism, tuple(parts), run_key)
