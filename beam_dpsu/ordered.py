"""The ordered-user transform and the sequential policy mechanisms.

``OrderedUserPolicy`` runs a sequential update policy (``beam_dpsu.policies``)
over a PCollection of ``(user_id, {item: count})`` and returns the finished
histogram as ``(item, weight)`` for every item with weight > 0. The mechanisms
``PolicyLaplace``, ``PolicyGaussian``, ``GW`` and ``GWKT`` then add noise and
apply the threshold ``T`` with ``threshold.ApplyReleaseRule`` exactly as the
histogram mechanisms do. ``GW`` and ``GWKT`` default to the cascade-free
greedy (proven, ``docs/gw.md``); their ``variant='published'`` is not proven
private.

How the transform works
-----------------------
1. ``Prepare`` (parallel, any number of workers): each user is prepared by the
   policy (Δ0 sampling, or the greedy walk order), their items are replaced by
   63-bit item ids (``policies.ItemIds``: a keyed hash of the item), and the
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
   the same shard's id map from step 1 (``CoGroupByKey``) and emitted as
   ``(item, weight)`` (distinct items that share an id make the pipeline fail
   with ``policies.ItemIdCollision``; probability about n²/2^64). No worker
   holds the whole id map, and nothing is a per-item shuffle or side input.

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
  user state (``beam_dpsu.runners.capabilities``); ``'bag'`` on any other runner.

Either way the result is identical: the order is a function of the run key
and the user ids only.

Throughput: the sequential stage runs on one core by construction; see
``benchmarks/bench_ordered.py`` and ``benchmarks/RESULTS-ordered.md``.
"""
from __future__ import annotations

import math
import time
from typing import Any, Dict, Hashable, List, Mapping, Optional, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
import numpy as np
from apache_beam.coders import coders
from apache_beam.transforms import userstate, window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_dpsu import calibration as cal
from beam_dpsu import keys
from beam_dpsu import runners
from beam_dpsu import policies
from beam_dpsu.accounting import PrivacyGuarantee
from beam_dpsu.bounding import check_global_window
from beam_dpsu.mechanisms import Mechanism, RoundCalibration
from beam_dpsu.noise import RunKey
from beam_dpsu.threshold import ApplyReleaseRule, NoisyThresholdRule

STATES = ("auto", "ordered_list", "bag", "gbk")
# Runners known not to implement OrderedListState: see beam_dpsu/runners.py.
_NO_ORDERED_LIST_RUNNERS = runners.NO_ORDERED_LIST_RUNNERS
DEFAULT_BUCKET_BITS = 10


def check_bucket_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= 20:
        raise ValueError(f"bucket_bits must be an integer in [0, 20], got {bits!r}")
    return bits


def encode_ids(ids: List[int]) -> bytes:
    """A user's prepared item ids as 8-byte little-endian integers (cheap to ship)."""
    return np.array(ids, dtype="<i8").tobytes()


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


def shard_ids(id_to_value: Mapping[int, Any]) -> Dict[int, Dict[int, Any]]:
    """``{id: value}`` → ``{shard: {id: value}}`` with shard = ``id % ID_SHARDS``."""
    out: Dict[int, Dict[int, Any]] = {}
    for i, v in id_to_value.items():
        part = out.get(i & _ID_SHARD_MASK)
        if part is None:
            out[i & _ID_SHARD_MASK] = {i: v}
        else:
            part[i] = v
    return out


def _collision():
    return policies.ItemIdCollision(
        "two distinct items share a 63-bit item id; rerun with a fresh run key")


@beam.typehints.with_output_types(Tuple[int, Any])
class _PrepareDoFn(beam.DoFn):
    """(user, counts) → (bucket, [(sort hash, user bytes, encoded ids)]); side output
    (shard, {id: item}).

    The bucket is the top ``bucket_bits`` bits of the user's sort hash, so
    buckets in increasing order hold the users in increasing hash order.
    Users are grouped per bucket inside a bundle before they are emitted, and
    the bundle's items are collected into one ``{id: item}`` map, emitted in
    ``ID_SHARDS`` shards (one element per shard and bundle, not per item).
    """

    IDS = "ids"
    FLUSH_PAIRS = 1 << 20

    def __init__(self, make_policy, bucket_bits: int, envelope: bool = False):
        # The policy (its sampling and item-id keys) and the order key are built
        # on the worker from the run key's bytes, a side input: no key is staged.
        self._keyed = keys.KeyedCache(_PolicyAndOrderKey(make_policy))
        self._shift = 64 - bucket_bits
        # envelope: for runners that mix tagged outputs and drop finish_bundle
        # outputs (Dask): (tag, value) main outputs, buckets flushed per user.
        self._envelope = envelope
        if envelope:
            self.FLUSH_PAIRS = 0
            runners.per_element_flush(self)
        self._users = beam.metrics.Metrics.counter("beam_dpsu", "ordered_users")
        self._pairs = beam.metrics.Metrics.counter("beam_dpsu", "ordered_pairs")
        self._micros = beam.metrics.Metrics.counter("beam_dpsu", "ordered_prepare_micros")

    def start_bundle(self):
        self._buckets: Dict[int, list] = {}
        self._pending_pairs = 0
        self._item_ids: Dict[Any, int] = {}  # this bundle's items → ids
        self._n_users = self._n_pairs = 0
        self._elapsed = 0.0

    def _id_shards(self):
        """The bundle's ``{id: item}`` map in shards (fails on an id collision)."""
        id_to_item = {i: item for item, i in self._item_ids.items()}
        if len(id_to_item) != len(self._item_ids):
            raise _collision()
        self._item_ids = {}
        return shard_ids(id_to_item).items()

    def _flush(self):
        for entry in self._buckets.items():
            yield runners.main_output(entry, self._envelope)
        for part in self._id_shards():
            yield runners.tag(part, self.IDS, self._envelope)
        self._buckets, self._pending_pairs = {}, 0

    def process(self, element, key_bytes, public_counts=None):
        t0 = time.perf_counter()
        user, counts = element
        policy, order_key = self._keyed(key_bytes)
        ids, items = policy.prepare(user, counts, public_counts)
        if not ids:
            return
        h, encoded_user = policies.user_sort_key(order_key, user)
        entry = (h, encoded_user, encode_ids(ids))
        bucket = self._buckets.get(h >> self._shift)
        if bucket is None:
            self._buckets[h >> self._shift] = [entry]
        else:
            bucket.append(entry)
        self._n_users += 1
        self._n_pairs += len(ids)
        self._pending_pairs += len(ids)
        known = self._item_ids
        if getattr(policy, "ids_follow_items", False):  # ids[k] is the id of the k-th item
            for item, i in zip(items, ids):
                if item not in known:
                    known[item] = i
        else:
            item_id = policy.item_ids
            for item in items:
                if item not in known:
                    known[item] = item_id(item)
        self._elapsed += time.perf_counter() - t0
        if self._pending_pairs >= self.FLUSH_PAIRS:
            yield from self._flush()

    def finish_bundle(self):
        gw = window.GlobalWindow()
        ts = gw.max_timestamp()
        for bucket, users in self._buckets.items():
            yield WindowedValue((bucket, users), ts, [gw])
        for part in self._id_shards():
            yield beam.pvalue.TaggedOutput(self.IDS, WindowedValue(part, ts, [gw]))
        self._buckets, self._pending_pairs = {}, 0
        self._users.inc(self._n_users)
        self._pairs.inc(self._n_pairs)
        self._micros.inc(int(self._elapsed * 1e6))


class _PolicyAndOrderKey:
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
        from beam_dpsu import kernels
        kernels.warm_up()

    def __init__(self, policy: policies.UserPolicy):
        self._policy = policy
        # Time spent adding buckets to state, and in the timer (read, policy, emit).
        self._micros = beam.metrics.Metrics.counter("beam_dpsu", "ordered_sequential_add_micros")
        self._timer_micros = beam.metrics.Metrics.counter("beam_dpsu",
                                                          "ordered_sequential_timer_micros")

    def _run(self, packed_buckets):
        """``packed_buckets``: (lengths, ids) byte strings of the buckets, in bucket order."""
        return policies.run_packed(
            ((np.frombuffer(lengths, dtype="<i4"), np.frombuffer(ids, dtype="<i8"))
             for lengths, ids in packed_buckets), self._policy)

    def _emit(self, hist):
        """``(shard, {id: weight})`` for the ids with weight > 0, ``ID_SHARDS`` shards."""
        out: Dict[int, Dict[int, float]] = {}
        for i, w in hist:
            if w > 0:
                part = out.get(i & _ID_SHARD_MASK)
                if part is None:
                    out[i & _ID_SHARD_MASK] = {i: w}
                else:
                    part[i] = w
        yield from out.items()


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
        get = acc.get
        for i, item in id_to_item.items():
            old = get(i)
            if old is None:
                acc[i] = item
            elif old != item:
                raise _collision()
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
    """``(shard, {'w': [{id: weight}...], 'ids': [{id: item}...]})`` → ``(item, weight)``."""
    _, grouped = element
    maps = list(grouped["ids"])
    id_to_item = maps[0] if len(maps) == 1 else _MergeIdMapsFn().merge_accumulators(maps)
    for weights in grouped["w"]:
        for i, w in weights.items():
            yield id_to_item[i], w


def _read_text_lines(pattern):
    from beam_dpsu.textio import match_files
    for path in match_files(pattern):
        with FileSystems.open(path) as f:
            for line in f:
                yield line.decode("utf-8").rstrip("\r\n")


# The sequential stage needs a policy object only for its cutoff and update
# rule, which use no key; it is built under this public placeholder so that the
# real keys never enter the job graph (prepare, which uses them, runs with the
# side-input key).
UPDATE_ONLY_KEY = RunKey(b"beam_dpsu public placeholder: update rules use no key")


class OrderedUserPolicy(beam.PTransform):
    """``(user_id, {item: count})`` → ``(item, weight)``: a sequential policy's histogram.

    Users are processed one at a time in the order of
    ``keyed_hash64(run_key.subkey('order'), encode_value(user_id))`` (ties by
    the encoded user id), each applying ``policy.update`` to the histogram
    built so far. Only items with weight > 0 are emitted; the weights are NOT
    differentially private (add noise with ``ApplyReleaseRule``).

    Args:
      make_policy: ``make_policy(run_key) -> policies.UserPolicy``, e.g. a
        policy mechanism's ``policy`` method. It is called on the workers with
        the run's key, read from a side input (``beam_dpsu.keys``), so that no
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
                 label: Optional[str] = None):
        super().__init__(label)
        policy = make_policy(UPDATE_ONLY_KEY) if callable(make_policy) else None
        if not isinstance(policy, policies.UserPolicy):
            raise ValueError("make_policy must be callable as make_policy(run_key) and return "
                             f"a beam_dpsu.policies.UserPolicy, got {make_policy!r}")
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

    def _resolve_state(self, pipeline) -> str:
        caps = runners.capabilities(pipeline)
        runner = caps.name
        if self._state == "ordered_list" and runner in _NO_ORDERED_LIST_RUNNERS:
            raise ValueError(
                f"state='ordered_list' needs OrderedListState, which {runner} does not "
                f"support (Beam {beam.__version__}); use state='bag' or state='auto'")
        if self._state in ("ordered_list", "bag") and not caps.user_state:
            raise ValueError(
                f"state={self._state!r} needs stateful DoFns, which {runner} does not run "
                f"(its DoFns get no state); use state='gbk' or state='auto'")
        if self._state != "auto":
            return self._state
        if not caps.user_state:
            return "gbk"
        return "ordered_list" if caps.ordered_list_state else "bag"

    def _public_side_input(self, pipeline):
        pub = self._public
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

    def expand(self, per_user):
        check_global_window(per_user, "OrderedUserPolicy")
        side = self._public_side_input(per_user.pipeline)
        prep_args = [keys.key_side_input(per_user, self._run_key)]
        if side is not None:
            prep_args.append(side)
        state = self._resolve_state(per_user.pipeline)
        if runners.capabilities(per_user.pipeline).tagged_outputs:
            prepared = per_user | "Prepare" >> beam.ParDo(
                _PrepareDoFn(self._make_policy, self._bucket_bits), *prep_args
            ).with_outputs(_PrepareDoFn.IDS, main="users")
            users, ids = prepared.users, prepared[_PrepareDoFn.IDS]
        else:  # the runner mixes tagged outputs (Dask): one output of (tag, value)
            split = runners.split_envelopes(
                per_user | "Prepare" >> beam.ParDo(
                    _PrepareDoFn(self._make_policy, self._bucket_bits, envelope=True),
                    *prep_args),
                "SplitPrepared", (None, _PrepareDoFn.IDS))
            users, ids = split[None], split[_PrepareDoFn.IDS]
        sorted_buckets = (users
                          | "GroupBuckets" >> beam.GroupByKey()
                          | "SortBuckets" >> beam.Map(sort_bucket))
        if state == "gbk":
            weights = (sorted_buckets
                       | "CollectBuckets" >> beam.GroupByKey()
                       | "Sequential" >> beam.ParDo(_GbkSequentialDoFn(self._update_policy)))
        else:
            seq_fn = (_OrderedListDoFn if state == "ordered_list" else _BagDoFn)(
                self._update_policy)
            weights = sorted_buckets | "Sequential" >> beam.ParDo(seq_fn)
        id_maps = ids | "ItemPerId" >> beam.CombinePerKey(_MergeIdMapsFn())
        return ({"w": weights, "ids": id_maps}
                | "JoinShards" >> beam.CoGroupByKey()
                | "ToItems" >> beam.FlatMap(_join_shard))


# ---------------------------------------------------------------------------
# Mechanisms.
# ---------------------------------------------------------------------------

DEFAULT_ALPHA = 3.0


class PolicyMechanism(Mechanism):
    """A sequential policy followed by noise and the threshold T (specification 3).

    Subclasses set the calibration and build the policy; this class runs it
    with ``OrderedUserPolicy`` in Beam and with ``policies.run_sequential`` in
    the Beam-free core (``core.run_local``), with the same functions and order.

    Attributes (besides those of ``Mechanism``):
      alpha: α, the cutoff multiplier.
      cutoff: Γ = T + α·(λ or σ).
      state: the ``OrderedUserPolicy`` state choice (no privacy effect).
    """

    public_counts = None
    policy_name = ""

    def __init__(self, name: str, guarantee: PrivacyGuarantee, round_: RoundCalibration,
                 alpha: float, state: str):
        self.name = name
        self.guarantee = guarantee
        self.rounds = [round_]
        self.alpha = _check_alpha(alpha)
        self.cutoff = cal.policy_cutoff(round_.threshold, round_.noise_scale, self.alpha)
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        self.state = state

    def policy(self, run_key: RunKey) -> policies.UserPolicy:
        """The update policy of this run (its keys derive from ``run_key``)."""
        raise NotImplementedError

    def release_rule(self, run_key: RunKey, purpose: str = "noise/0"):
        r = self.calibration
        return NoisyThresholdRule(r.noise, r.noise_scale, r.threshold, run_key, purpose)

    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d.update({"alpha": self.alpha, "cutoff": self.cutoff, "policy": self.policy_name})
        return d

    def _public_counts_local(self):
        return None

    def histogram_local(self, per_user, run_key: RunKey) -> Dict[Hashable, float]:
        """The finished policy histogram ``{item: weight > 0}`` (not private)."""
        return policies.run_sequential(per_user, self.policy(run_key), run_key,
                                       self._public_counts_local())

    def run_local(self, per_user, run_key: RunKey):
        """The released set on in-memory data (called by ``core.run_local``)."""
        run_key = RunKey.resolve(run_key)
        rule = self.release_rule(run_key)
        return {item for item, w in self.histogram_local(per_user, run_key).items()
                if rule(item, w)}

    def expand_per_user(self, per_user, run_key):
        hist = per_user | "OrderedPolicy" >> OrderedUserPolicy(
            self.policy, run_key, self.public_counts, state=self.state)
        return hist | "Release" >> ApplyReleaseRule(self.release_rule, run_key)


def _check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) \
            or not (float(alpha) >= 0 and math.isfinite(float(alpha))):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    return float(alpha)


class PolicyLaplace(PolicyMechanism):
    """Policy Laplace (Gopi et al.): Δ0 sampling, ℓ1-descent to Γ, Laplace noise.

    λ = 1/ε; T as Weighted Laplace, ``max_t [1/t + λ·log(1/(2δ_t))]``;
    Γ = T + α·λ. Guarantee: (ε, δ)-DP.

    Args:
      epsilon: ε > 0. delta: 0 < δ < 1.
      max_items: Δ0 ≥ 1, distinct items kept per user (default 100). A larger
        Δ0 raises T slightly (δ_t for more t) and lets users reach more items.
      alpha: α ≥ 0 (default 3): the cutoff Γ = T + α·λ. Larger α wastes less
        budget on items that would be released anyway only when it is small;
        no privacy effect.
      state: ``OrderedUserPolicy`` state choice (default ``'auto'``).
    """

    def __init__(self, epsilon: float, delta: float, max_items: int = 100,
                 alpha: float = DEFAULT_ALPHA, state: str = "auto"):
        lam = cal.weighted_laplace_scale(epsilon)
        t = cal.weighted_laplace_threshold(epsilon, delta, max_items)
        super().__init__("policy-laplace",
                         PrivacyGuarantee(float(epsilon), float(delta), note="(ε, δ)-DP"),
                         RoundCalibration(t, "laplace", lam, int(max_items), "l1"), alpha, state)

    policy_name = "l1-descent"

    def policy(self, run_key):
        return policies.L1DescentPolicy(self.cutoff, self.max_items, run_key.subkey("sample/0"),
                                        run_key.subkey("item-order"))


class PolicyGaussian(PolicyMechanism):
    """Policy Gaussian (Gopi et al.): Δ0 sampling, ℓ2-descent to Γ, Gaussian noise.

    σ = AGM(ε, δ/2, 1); T as Weighted Gaussian,
    ``max_t [1/√t + σ·Φ⁻¹(1 − δ'_t)]`` with δ' from δ/2; Γ = T + α·σ.
    Guarantee: (ε, δ)-DP.

    Args:
      epsilon: ε > 0. delta: 0 < δ < 1. max_items: Δ0 ≥ 1 (default 100).
      alpha: α ≥ 0 (default 3), Γ = T + α·σ; no privacy effect.
      state: ``OrderedUserPolicy`` state choice (default ``'auto'``).
    """

    def __init__(self, epsilon: float, delta: float, max_items: int = 100,
                 alpha: float = DEFAULT_ALPHA, state: str = "auto"):
        sigma = cal.weighted_gaussian_sigma(epsilon, delta)
        t = cal.weighted_gaussian_threshold(epsilon, delta, max_items)
        super().__init__("policy-gaussian",
                         PrivacyGuarantee(float(epsilon), float(delta), note="(ε, δ)-DP"),
                         RoundCalibration(t, "gaussian", sigma, int(max_items), "l2"), alpha,
                         state)

    policy_name = "l2-descent"

    def policy(self, run_key):
        return policies.L2DescentPolicy(self.cutoff, self.max_items, run_key.subkey("sample/0"),
                                        run_key.subkey("item-order"))


VARIANTS = ("cascade-free", "published")
#: Default Δ0 (K_i size) and η (step-1 budget) of the cascade-free GW and GW-KT.
#: Chosen from the Δ0 × η sweep on the five shared datasets at ε = 3, δ = e^-10,
#: α = 3 (``benchmarks/RESULTS-gw.md``): see the ``GW`` and ``GWKT`` docstrings.
DEFAULT_GW_MAX_ITEMS = 20
DEFAULT_GWKT_MAX_ITEMS = 100
DEFAULT_GW_ETA = 0.001


def check_variant(variant) -> str:
    """Validates GW's variant: ``'cascade-free'`` (proven) or ``'published'`` (unproven)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return variant


class GW(PolicyMechanism):
    """GW (greedy weighting, after Carvalho et al.): by default the cascade-free greedy.

    ``variant='cascade-free'`` (default; specification 3.3a, proof in
    ``docs/gw.md``). User i keeps K_i, the first Δ0 items of their walk order
    (their item frequencies descending, ties by the tie-break), and spends a
    budget of 1 on K_i in two steps: ℓ1-descent with budget η (every item of
    K_i below Γ gains a strictly positive weight), then the greedy walk with
    budget 1 − η. λ = 1/ε; T = the smallest T with
    ``1 − (1 − ½e^(−ε(T−1)))·(1 − ½e^(−εT))^(Δ0−1) ≤ δ``
    (``calibration.gw_cascade_free_threshold``); Γ = T + α·λ. Guarantee:
    (ε, δ)-DP for a user order that depends on no user's data. The proof rests
    on the support condition: only the added user's own K_i can become
    non-zero, which step 1 guarantees.

    ``variant='published'`` (research only, NOT PROVEN PRIVATE): the greedy of
    Carvalho et al., no Δ0, every distinct item of a user takes part, T =
    1 − λ·log(2δ). Its published δ argument is false: with an added user x, a
    later user can find an item x filled to Γ, skip it and spend budget on an
    item it never reached without x (a "cascade"), so items x does not hold
    become non-zero and nothing bounds how many. ``describe()`` reports
    ``"proven": false``; the command-line tools run it only with
    ``--allow-unproven``.

    Args:
      epsilon: ε > 0.
      delta: 0 < δ < 1/2 (so that T ≥ 1).
      alpha: α ≥ 0 (default 3), Γ = T + α·λ; no privacy effect.
      state: ``OrderedUserPolicy`` state choice (default ``'auto'``); no
        privacy effect.
      tie_break: ``'item-hash'`` (default, the specification: items of equal
        frequency are walked in the order of a keyed hash) or
        ``'first-occurrence'`` (in the order they first occur in the user's
        records, as the authors' reference code does). No privacy effect: both
        orders depend on the user's own data only. ``'first-occurrence'``
        needs per-user counts in record order: ``ReadUserItems(keep_order=True)``
        (the command-line pipeline does this when ``--tie-break
        first-occurrence`` is given) or ``core.per_user_counts``; see
        ``needs_record_order``.
      max_items: Δ0 ≥ 1, the size of K_i (cascade-free only; default
        ``DEFAULT_GW_MAX_ITEMS`` = 20). Privacy: the guarantee holds for any
        Δ0 because T grows with it, by at most ``log(1 + (Δ0 − 1)·e^(−ε))/ε``
        over the published T (at ε = 3: 0.22 for Δ0 = 20, 0.59 for 100).
        Utility: a small Δ0 wastes the budget of users whose K_i is all at Γ,
        a large one raises T and Γ; on the five shared datasets (ε = 3,
        δ = e^-10, α = 3; ``benchmarks/RESULTS-gw.md``) releases peak at
        Δ0 = 10-30 and fall by 5-10% at 100 and 15-20% at 300. 20 keeps GW at
        ≥ 0.9× the published GW on commits-rails and reddit-titles.
      eta: η in (0, 1), the step-1 budget (cascade-free only; default
        ``DEFAULT_GW_ETA`` = 0.001). Privacy: none on T; η > 0 is what makes the
        support condition hold (any η > 0 does; in floating point too).
        Utility: budget spread evenly over K_i is mostly wasted on items that
        are never released, so η should be small; the sweep shows 0.2 clearly
        worse everywhere and 0.001, 0.01 and 0.05 within noise of each other.
      variant: ``'cascade-free'`` (default) or ``'published'`` (unproven).
    """

    def __init__(self, epsilon: float, delta: float, alpha: float = DEFAULT_ALPHA,
                 state: str = "auto", tie_break: str = "item-hash", *,
                 max_items: Optional[int] = None, eta: Optional[float] = None,
                 variant: str = "cascade-free", _name: str = "gw"):
        self.variant = check_variant(variant)
        lam = cal.weighted_laplace_scale(epsilon)
        if self.variant == "published":
            if max_items is not None or eta is not None:
                raise ValueError("max_items and eta apply to the cascade-free GW only, "
                                 "not to variant='published'")
            self.eta = None
            t = cal.gw_threshold(epsilon, delta)
            note = ("(ε, δ)-DP as claimed by Carvalho et al.; NOT PROVEN: the published δ "
                    "argument ignores cascades (docs/gw.md)")
        else:
            max_items = self._default_max_items if max_items is None else max_items
            max_items = cal.check_max_items(max_items)
            self.eta = cal.check_eta(DEFAULT_GW_ETA if eta is None else eta)
            t = cal.gw_cascade_free_threshold(epsilon, delta, max_items)
            note = "(ε, δ)-DP"
        super().__init__(_name, PrivacyGuarantee(float(epsilon), float(delta), note=note),
                         RoundCalibration(t, "laplace", lam, max_items, "l1"), alpha, state)
        self.tie_break = policies.check_tie_break(tie_break)
        self.policy_name = self._policy_names[self.variant]

    _policy_names = {"cascade-free": "cascade-free-greedy", "published": "greedy"}
    _public = False
    _default_max_items = DEFAULT_GW_MAX_ITEMS

    @property
    def proven(self) -> bool:
        """False for ``variant='published'``: its δ argument does not hold."""
        return self.variant != "published"

    @property
    def needs_record_order(self) -> bool:
        """True when the per-user counts must iterate in the users' record order."""
        return self.tie_break == "first-occurrence"

    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d.update({"tie_break": self.tie_break, "variant": self.variant, "proven": self.proven,
                  "eta": self.eta})
        return d

    def policy(self, run_key):
        if self.variant == "published":
            return policies.GreedyPolicy(self.cutoff, run_key.subkey("item-order"),
                                         use_public_counts=self._public,
                                         tie_break=self.tie_break)
        return policies.CascadeFreeGreedyPolicy(
            self.cutoff, run_key.subkey("item-order"), self.max_items, self.eta,
            use_public_counts=self._public, tie_break=self.tie_break)


class GWKT(GW):
    """GW-KT: GW whose walk order ranks items by public counts first.

    As ``GW`` (same variants, same threshold, same proof), but a user walks
    their items by the public count descending (1 for an item absent from the
    public data), then their own frequency, then the tie-break; the
    cascade-free variant keeps the first Δ0 items of that order as K_i. The
    public counts must not come from the private input; they cost no privacy
    budget. Guarantee: (ε, δ)-DP for the cascade-free variant (default); the
    published variant is NOT PROVEN (see ``GW``).

    Args:
      epsilon: ε > 0. delta: 0 < δ < 1/2.
      public_counts: a path to an ``item<TAB>count`` file (any Beam
        filesystem; ``.gz`` read by suffix; duplicates summed) or a
        ``{item: count}`` mapping.
      alpha: α ≥ 0 (default 3); no privacy effect.
      state: ``OrderedUserPolicy`` state choice (default ``'auto'``).
      tie_break: as for ``GW``; it orders items of equal public count and
        equal frequency. No privacy effect.
      max_items: Δ0, as for ``GW`` but default ``DEFAULT_GWKT_MAX_ITEMS`` =
        100: every user walks the same public ranking, so its top items fill
        up early and a user whose K_i is all at Γ wastes budget; on
        commits-rails (public counts from commits-ansible) releases rise up to
        Δ0 ≈ 100 and are flat to 150 (``benchmarks/RESULTS-gw.md``), where
        GW-KT reaches about 0.85× the published GW-KT.
      eta, variant: as for ``GW`` (defaults 0.001, ``'cascade-free'``).
    """

    def __init__(self, epsilon: float, delta: float, public_counts,
                 alpha: float = DEFAULT_ALPHA, state: str = "auto",
                 tie_break: str = "item-hash", *, max_items: Optional[int] = None,
                 eta: Optional[float] = None, variant: str = "cascade-free"):
        if isinstance(public_counts, str):
            if not public_counts:
                raise ValueError("public_counts must be a non-empty path or a mapping")
        elif not isinstance(public_counts, Mapping):
            raise ValueError(f"public_counts must be a path or a mapping, got {public_counts!r}")
        super().__init__(epsilon, delta, alpha, state, tie_break, max_items=max_items, eta=eta,
                         variant=variant, _name="gw-kt")
        self.public_counts = public_counts
        self._loaded = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_loaded"] = None
        return state

    _policy_names = {"cascade-free": "cascade-free-greedy-public", "published": "greedy-public"}
    _public = True
    _default_max_items = DEFAULT_GWKT_MAX_ITEMS

    def _public_counts_local(self):
        if isinstance(self.public_counts, Mapping):
            return self.public_counts
        if self._loaded is None:
            self._loaded = policies.read_public_counts(self.public_counts)
        return self._loaded
