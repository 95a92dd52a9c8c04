"""``SelectFromText``: any set-union mechanism straight from text files, on blocks of arrays.

The columnar path of the histogram-and-threshold family, of DP-SIPS and of the
sequential policy mechanisms (Policy Laplace, Policy Gaussian, GW, GW-KT). Every
element that crosses a shuffle is a block of arrays (``dp.data.columnar``), never a
user, a line or an item:

1. ``ReadPairs``: each file is read in blocks of about ``block_bytes`` of
   text; a block is parsed into arrays and split by user group, and a group's
   blocks are sent as one Arrow IPC message ``(group, bytes)`` per file, or
   per ``dp.data.columnar.FLUSH_PAIRS`` pairs read (malformed lines to their own
   output);
2. ``GroupByKey`` on the group, then ``BoundHistogram``: the group's users,
   their distinct items sampled to Δ0 (``contribution.sample_items``' keyed
   rule) and weighted, as partial histograms by item shard ``(shard, bytes)``;
3. ``GroupByKey`` on the shard, then ``Release``: the shard's weights summed
   per item and decided by the mechanism's release rule, vectorised.

Adaptive weighting keeps each group's sampled distinct pairs (``GroupPairs``) for its
two histograms: the basic one's estimate, per shard, gives the items that are not low
(with their buckets; one list to
every group) and the noisy values the adaptive histogram meets in its shard
(``_Rounds._adaptive``).

DP-SIPS runs its rounds on the groups' distinct pairs (``GroupPairs``, one
Arrow message per group): each round samples, weighs and releases as above
under its own keys and rule, and the next round's groups lose the items it
released (``WithoutReleased``: a side input on runners that compute one once,
else the released list sent to every group through one ``GroupByKey``).

The sequential policies read counted pairs (``columnar.counted_pair_blocks``:
each pair's number of lines and, for the first-occurrence tie-break, the
position of its first line in the input, files in sorted order); each group's
users are prepared at once (``dp.data.columnar_policy.prepare_pairs``: the Δ0 sample
or the greedy walk order, as item ids) into the buckets of
``ordered.RunPrepared``, whose one-core sequential stage and release follow.

With ``staging_dir``, the messages of steps 1 and 2 (and DP-SIPS's groups) are
written to files there and only references cross the shuffles
(``transforms.staging``), for runners that hold a shuffle in memory.

It releases exactly what ``SelectPartitions(mechanism, run_key)`` releases on
the same per-user data with the same key (the tests check it), at a fraction
of the cost: the Python SDK's per-element cost is paid per block, and the
work per line is numpy and Arrow code. Elements are blocks, so the transform
needs no batched DoFn and no ``finish_bundle`` output and runs the same on
every runner (on Dask, whose multi-output ParDos mix their outputs, the
outputs travel as ``(tag, value)`` envelopes, ``runners.tag``).
"""
from __future__ import annotations

from typing import Any, Iterator, Optional, Tuple

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_dpsu.dp.data import columnar, columnar_policy, columnar_text
from beam_dpsu.dp.mechanisms import on_blocks
from beam_dpsu.dp.data.columnar import COLUMNAR_ITEM_SHARDS, COLUMNAR_USER_GROUPS
from beam_dpsu.dp.data.lines import BLOCK_BYTES, RANGE_BYTES
from beam_dpsu.dp.mechanisms.adaptive import (LOW_BUCKET, RELEASED, Adaptive,
                                              adaptive_pairs_histogram, marks_arrays,
                                              marks_message)
from beam_dpsu.dp.mechanisms.policy import PolicyMechanism
from beam_dpsu.dp.mechanisms.sips import Sips
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms import run_key as keys
from beam_dpsu.transforms import ordered, runners, staging
from beam_dpsu.transforms.release import ApplyReleaseRule
from beam_dpsu.transforms.bounding import check_global_window
from beam_dpsu.transforms.textio import input_files
from beam_dpsu.transforms.write import local_absolute
from beam_dpsu.transforms.columnar_read import (_MALFORMED, _USERS, _PresamplePlan,
                                                _ReadPairsDoFn, _apply, _check_count,
                                                _presampled, _same_key)

__all__ = ["SelectFromText", "SelectFromPairs"]


_IDS = "ids"
_MARKS, _FIRST = "marks", "first"


class _BoundHistogramDoFn(beam.DoFn):
    """``(group, [PairBlock bytes])`` → ``(shard, partial histogram bytes)``; the
    group's number of users on ``_USERS``."""

    def __init__(self, max_items, weighting: str, purpose: str, shards: int, envelope: bool,
                 stage=None):
        self._args = (max_items, weighting)
        self._key = keys.KeyedCache(keys.Subkey(purpose))
        self._shards, self._envelope, self._staging = shards, envelope, stage

    def process(self, element, key_bytes):
        blocks = [columnar.PairBlock.from_bytes(blob)
                  for blob in staging.unstaged(self._staging, element[1])]
        hist = columnar.bounded_histogram(blocks, *self._args, self._key(key_bytes))
        del blocks
        yield runners.tag(hist.num_users, _USERS, self._envelope)
        parts = columnar.split_by_shard(hist, self._shards).items()
        for part in staging.staged(self._staging, parts):
            yield runners.main_output(part, self._envelope)


class _ReleaseDoFn(beam.DoFn):
    """``(shard, [partial histogram bytes])`` → the shard's released items (counted in
    the metric ``released`` and, when given, in ``metric`` too)."""

    def __init__(self, make_rule, metric: Optional[str] = None, stage=None):
        self._rule = keys.KeyedCache(make_rule)
        self._staging = stage
        self._released = beam.metrics.Metrics.counter("beam_dpsu", "released")
        self._released_here = (beam.metrics.Metrics.counter("beam_dpsu", metric)
                               if metric else None)

    def process(self, element, key_bytes):
        items, weights = columnar.sum_histograms(staging.unstaged(self._staging, element[1]))
        released = columnar.release_shard(self._rule(key_bytes), items, weights)
        if released:
            self._released.inc(len(released))
            if self._released_here is not None:
                self._released_here.inc(len(released))
        yield from released


class _GroupPairsDoFn(beam.DoFn):
    """``(group, [PairBlock bytes])`` → ``(group, GroupPairs bytes)``; the group's
    number of users on ``_USERS``."""

    def __init__(self, envelope: bool, stage=None):
        self._envelope, self._staging = envelope, stage

    def process(self, element):
        pairs = columnar.group_pairs(columnar.PairBlock.from_bytes(b)
                                     for b in staging.unstaged(self._staging, element[1]))
        yield runners.tag(len(pairs.users), _USERS, self._envelope)
        if len(pairs):
            for part in staging.staged(self._staging, [(element[0], pairs.to_bytes())]):
                yield runners.main_output(part, self._envelope)


class _PreparePoliciesDoFn(beam.DoFn):
    """``(group, [counted PairBlock bytes])`` → the group's users prepared for a
    sequential policy, in ``ordered.RunPrepared``'s input form: ``(bucket, [(sort
    hash, encoded user id, ids bytes), ...])`` on the main output, ``(shard,
    pickled {id: item})`` on ``_IDS``, the group's number of users on ``_USERS``."""

    def __init__(self, make_policy, bucket_bits: int, envelope: bool, stage=None):
        self._keyed = keys.KeyedCache(ordered.PolicyAndOrderKey(make_policy))
        self._shift = 64 - ordered.check_bucket_bits(bucket_bits)
        self._envelope, self._staging = envelope, stage

    def process(self, element, key_bytes, public_counts=None):
        pairs = columnar.group_pairs(columnar.PairBlock.from_bytes(b)
                                     for b in staging.unstaged(self._staging, element[1]))
        yield runners.tag(len(pairs.users), _USERS, self._envelope)
        policy, order_key = self._keyed(key_bytes)
        prepared = columnar_policy.prepare_pairs(pairs, policy, public_counts)
        buckets = {}
        ids = prepared.ids
        end = np.cumsum(prepared.lengths)
        for user, b, n in zip(prepared.users, end.tolist(), prepared.lengths.tolist()):
            entry = ordered.user_entry(order_key, user, ids[b - n:b])
            buckets.setdefault(entry[0] >> self._shift, []).append(entry)
        for entry in buckets.items():
            yield runners.main_output(entry, self._envelope)
        for part in ordered.id_map_shards(prepared.item_ids):
            yield runners.tag(part, _IDS, self._envelope)


class _RoundHistogramDoFn(beam.DoFn):
    """``(group, GroupPairs bytes)`` → ``(shard, partial histogram bytes)`` of one round."""

    def __init__(self, max_items, weighting: str, purpose: str, shards: int, stage=None):
        self._args = (max_items, weighting)
        self._key = keys.KeyedCache(keys.Subkey(purpose))
        self._shards, self._staging = shards, stage

    def process(self, element, key_bytes):
        pairs = columnar.GroupPairs.from_bytes(staging.unstaged(self._staging, [element[1]])[0])
        hist = columnar.pairs_histogram(pairs, *self._args, self._key(key_bytes))
        yield from staging.staged(self._staging,
                                  columnar.split_by_shard(hist, self._shards).items())


class _Without:
    """``(group, GroupPairs bytes, or its staged reference)`` without the items of
    ``removed`` (a list of ``str``), staged again when ``stage`` is given; nothing
    when no pair is left (picklable, for ``runners.WithList``)."""

    def __init__(self, stage=None):
        self._staging = stage

    def __call__(self, group: int, blob, removed) -> Iterator[Tuple[int, Any]]:
        if not removed:  # nothing released: the message as it is, undecoded
            yield group, blob
            return
        pairs = columnar.GroupPairs.from_bytes(staging.unstaged(self._staging, [blob])[0])
        left = columnar.without_items(pairs, pa.array(removed, pa.string()))
        if left is pairs:
            yield group, blob
        elif len(left):
            yield from staging.staged(self._staging, [(group, left.to_bytes())])


class WithoutReleased(beam.PTransform):
    """``(group, GroupPairs bytes)`` → the same groups without the items of
    ``released`` (a PCollection of ``str``): DP-SIPS's removal between rounds.
    Every group gets the whole released list (``runners.WithList``: a side input,
    or one ``GroupByKey`` on runners that re-evaluate side inputs); a group left
    without pairs disappears. With ``stage`` (a ``staging.Staging``), the groups'
    messages are staged references, and so are the groups it gives."""

    def __init__(self, released, groups: int, stage=None, label: Optional[str] = None):
        super().__init__(label)
        self._released, self._groups, self._staging = released, groups, stage

    def expand(self, pairs):
        return pairs | "Remove" >> runners.WithList(self._released, self._groups,
                                                    _Without(self._staging))


class _KeptPairsDoFn(beam.DoFn):
    """``(group, [PairBlock bytes])`` → ``(group, GroupPairs bytes)`` of the pairs the
    adaptive mechanism's Δ0 sample keeps (``sample/0``); the group's number of users
    on ``_USERS``."""

    def __init__(self, mechanism, envelope: bool, stage=None):
        self._max_items = mechanism.max_items
        self._key = keys.KeyedCache(keys.Subkey("sample/0"))
        self._envelope, self._staging = envelope, stage

    def process(self, element, key_bytes):
        pairs = columnar.group_pairs(columnar.PairBlock.from_bytes(b)
                                     for b in staging.unstaged(self._staging, element[1]))
        yield runners.tag(len(pairs.users), _USERS, self._envelope)
        keep = columnar.sampled_pairs(pairs, self._max_items, self._key(key_bytes))
        if not keep.all():
            pairs = columnar.GroupPairs(pairs.users, pairs.items, pairs.u[keep], pairs.i[keep])
        if len(pairs):
            for part in staging.staged(self._staging, [(element[0], pairs.to_bytes())]):
                yield runners.main_output(part, self._envelope)


def _kept_pairs(stage, blob):
    return columnar.GroupPairs.from_bytes(staging.unstaged(stage, [blob])[0])


def _basic_pairs(element, shards: int, stage=None):
    """``(group, kept GroupPairs)`` → its basic histogram (1/√k) by shard."""
    hist = columnar.pairs_histogram(_kept_pairs(stage, element[1]), None, "l2", None)
    return staging.staged(stage, columnar.split_by_shard(hist, shards).items())


class _EstimateShardDoFn(beam.DoFn):
    """``(shard, [partial basic histograms])`` → ``(shard, ("estimate", message of the
    items' noisy values Ŵ))``; the buckets of the items that are not low on ``_MARKS``,
    one ``marks_message`` per shard (an item missing from them is low);
    the first round's releases (``adaptive-2r``) on ``_FIRST``."""

    def __init__(self, mechanism, envelope: bool, stage=None):
        self._mechanism, self._envelope, self._staging = mechanism, envelope, stage
        self._key = keys.KeyedCache(_same_key)

    def process(self, element, key_bytes):
        items, weights = columnar.sum_histograms(staging.unstaged(self._staging, element[1]))
        if len(items) == 0:
            return
        noisy, buckets, first = self._mechanism.estimate_shard(items, weights,
                                                               self._key(key_bytes))
        message = columnar.split_by_shard(
            columnar.GroupHistogram(items, noisy, 0), 1)[0]
        for part in staging.staged(self._staging, [(element[0], message)]):
            yield runners.main_output((part[0], ("estimate", part[1])), self._envelope)
        listed = np.flatnonzero(buckets != LOW_BUCKET)
        if listed.size:  # one message per shard, not one element per item
            yield runners.tag(marks_message(items.take(pa.array(listed)), buckets[listed]),
                              _MARKS, self._envelope)
        chosen = np.flatnonzero(first)
        if chosen.size:
            for name in items.take(pa.array(chosen)).to_pylist():
                yield runners.tag(name, _FIRST, self._envelope)


def _released_mark(item):
    return item, RELEASED


class _AdaptPairs:
    """``(group, kept GroupPairs, marks)`` → ``(shard, ("adaptive", partial))``: the group's
    adaptive histogram by shard (``adaptive_pairs_histogram``; picklable, for
    ``runners.WithList``)."""

    def __init__(self, shards: int, stage=None):
        self._shards, self._staging = shards, stage
        self._cache = None   # (the list, its arrays): one conversion per list, not per group

    def __getstate__(self):
        return {"_shards": self._shards, "_staging": self._staging, "_cache": None}

    def __call__(self, group, blob, marks):
        if self._cache is None or self._cache[0] is not marks:
            self._cache = (marks, marks_arrays(marks))
        hist = adaptive_pairs_histogram(_kept_pairs(self._staging, blob), None, None,
                                        self._cache[1])
        parts = staging.staged(self._staging, columnar.split_by_shard(hist, self._shards).items())
        return [(shard, ("adaptive", part)) for shard, part in parts]


class _DecideShardDoFn(beam.DoFn):
    """``(shard, [("estimate", Ŵ message), ("adaptive", A partial), ...])`` → the items
    the adaptive round releases in the shard."""

    def __init__(self, mechanism, stage=None):
        self._mechanism, self._staging = mechanism, stage
        self._key = keys.KeyedCache(_same_key)
        self._released = beam.metrics.Metrics.counter("beam_dpsu", "released")

    def process(self, element, key_bytes):
        estimate, partials = None, []
        for kind, part in element[1]:
            if kind == "estimate":
                estimate = part
            else:
                partials.append(part)
        items, weights = columnar.sum_histograms(staging.unstaged(self._staging, partials))
        if len(items) == 0:
            return
        known, noisy = columnar.sum_histograms(staging.unstaged(self._staging, [estimate]))
        where = pc.index_in(items, value_set=known).to_numpy(zero_copy_only=False)
        out = self._mechanism.decide_shard(items, weights, noisy[where.astype(np.int64)],
                                           self._key(key_bytes))
        chosen = np.flatnonzero(out)
        if chosen.size:
            self._released.inc(int(chosen.size))
            yield from items.take(pa.array(chosen)).to_pylist()


class _Rounds(beam.PTransform):
    """What ``SelectFromText`` and ``SelectFromPairs`` share: the layout, the key and,
    from the pair blocks by user group, the release of a histogram mechanism's or
    DP-SIPS's rounds (``_select``) or of a sequential policy (``_policy``)."""

    def __init__(self, mechanism, run_key, user_groups: int, item_shards: int,
                 staging_dir: Optional[str], label: Optional[str]):
        super().__init__(label)
        self._rounds = (None if isinstance(mechanism, PolicyMechanism)
                        else list(mechanism.rounds) if isinstance(mechanism, Adaptive)
                        else on_blocks.columnar_rounds(mechanism))
        self._mechanism = mechanism
        self._run_key = keys.for_pipeline(run_key)
        self._groups = _check_count(user_groups, "user_groups")
        self._shards = _check_count(item_shards, "item_shards")
        self._staging = None if staging_dir is None else staging.Staging(staging_dir)

    def _select(self, pairs, envelope: bool):
        """The rounds' release from the ``(group, PairBlock bytes)`` messages:
        ``(released, users per group)``."""
        grouped = pairs | "GroupUsers" >> beam.GroupByKey()
        if isinstance(self._mechanism, Adaptive):
            return self._adaptive(grouped, envelope)
        if len(self._rounds) == 1:
            r = self._rounds[0]
            partials, users = _apply(grouped, "BoundHistogram", _BoundHistogramDoFn(
                r.max_items, r.weighting, "sample/0", self._shards, envelope, self._staging),
                envelope,
                _USERS, keys.key_side_input(grouped, self._run_key))
            return self._release(partials, 0, ""), users
        groups, users = _apply(grouped, "GroupPairs", _GroupPairsDoFn(envelope, self._staging),
                               envelope, _USERS)
        released = []
        for i, r in enumerate(self._rounds):
            partials = groups | f"Histogram{i}" >> beam.ParDo(
                _RoundHistogramDoFn(r.max_items, r.weighting, f"sample/{i}", self._shards,
                                    self._staging),
                keys.key_side_input(groups, self._run_key))
            released.append(self._release(partials, i, str(i)))
            if i + 1 < len(self._rounds):
                groups = groups | f"Remove{i}" >> WithoutReleased(released[-1], self._groups,
                                                                  self._staging)
        return tuple(released) | "Union" >> beam.Flatten(), users

    def _adaptive(self, grouped, envelope: bool):
        """Adaptive weighting from the grouped pair blocks (``dp.mechanisms.adaptive``):
        each group's Δ0 sample (``_KeptPairsDoFn``), the basic histogram per shard and its
        estimate (``_EstimateShardDoFn``: the noisy values stay per shard, the buckets of
        the items that are not low and, for ``adaptive-2r``, the first round's releases reach every
        group as one list, ``runners.WithList``), each group's adaptive histogram
        (``_AdaptPairs``), which meets its shard's noisy values in one ``GroupByKey``
        (``_DecideShardDoFn``). ``(released, users per group)``."""
        m = self._mechanism
        kept, users = _apply(grouped, "Keep", _KeptPairsDoFn(m, envelope, self._staging),
                             envelope, _USERS, keys.key_side_input(grouped, self._run_key))
        basic = (kept
                 | "Basic" >> beam.FlatMap(_basic_pairs, self._shards, self._staging)
                 | "GroupBasic" >> beam.GroupByKey())
        estimates, marks, first = _apply(
            basic, "Estimate", _EstimateShardDoFn(m, envelope, self._staging), envelope,
            (_MARKS, _FIRST), keys.key_side_input(basic, self._run_key))
        listed = ((marks, first | "MarkReleased" >> beam.Map(_released_mark))
                  | "Marks" >> beam.Flatten())
        adaptive = kept | "Adapt" >> runners.WithList(
            listed, self._groups, _AdaptPairs(self._shards, self._staging))
        released = ((estimates, adaptive)
                    | "Together" >> beam.Flatten()
                    | "PerShard" >> beam.GroupByKey()
                    | "Decide" >> beam.ParDo(_DecideShardDoFn(m, self._staging),
                                             keys.key_side_input(basic, self._run_key)))
        return (first, released) | "Union" >> beam.Flatten(), users

    def _release(self, partials, index: int, suffix: str):
        """Round ``index``'s released items from its partial histograms by shard."""
        shards = partials | f"GroupShards{suffix}" >> beam.GroupByKey()
        # DP-SIPS's summary reports every round's count, one round included
        metric = f"released_round_{index}" if isinstance(self._mechanism, Sips) else None
        return shards | f"Release{suffix}" >> beam.ParDo(
            _ReleaseDoFn(_RoundRule(self._mechanism, index), metric, self._staging),
            keys.key_side_input(shards, self._run_key))

    def _policy(self, pairs, envelope: bool):
        """A sequential policy mechanism's release from the counted ``(group, PairBlock
        bytes)`` messages: each group's users prepared (``columnar_policy.prepare_pairs``),
        then ``ordered.RunPrepared`` and the release, as ``SelectPartitions`` runs it
        after its preparation; ``(released, users per group)``."""
        m = self._mechanism
        grouped = pairs | "GroupUsers" >> beam.GroupByKey()
        args = [keys.key_side_input(grouped, self._run_key)]
        public = ordered.public_counts_side_input(pairs.pipeline, m.public_counts)
        if public is not None:
            args.append(public)
        buckets, ids, users = _apply(grouped, "Prepare", _PreparePoliciesDoFn(
            m.policy, ordered.DEFAULT_BUCKET_BITS, envelope, self._staging), envelope,
            (_IDS, _USERS), *args)
        update = m.policy(ordered.UPDATE_ONLY_KEY)
        hist = (buckets, ids) | "Ordered" >> ordered.RunPrepared(
            update, ordered.resolve_state(m.state, pairs.pipeline), sharded=True)
        released = hist | "Release" >> ApplyReleaseRule(m.release_rule, self._run_key,
                                                        sharded=True)
        return released, users


class SelectFromText(_Rounds):
    """Text files of ``user_id<TAB>item`` lines → the items a histogram mechanism,
    DP-SIPS or a sequential policy mechanism releases.

    ``p | SelectFromText(pattern, WeightedGaussian(3, 1e-5))`` is
    ``p | ReadUserItems(pattern) | SelectPartitions(mechanism, per_user=True)``
    computed on blocks of arrays (``dp.data.columnar``): the same per-user data
    (the same line format, ``dp.data.lines``), the same sampled items, weights and
    release rule (for DP-SIPS, in every round, after the same removal; for a
    policy mechanism, the same prepared users in the same keyed order, as
    ``ReadUserItems(pattern, keep_order=True)`` gives them), so the same
    release under the same ``run_key``. Returns ``(released, malformed,
    users)``: the released items (``str``, no order; write them with
    ``write.WriteRelease``), the malformed lines as ``(raw line bytes,
    occurrences)`` (private input: a dead-letter file, never a release) and one
    ``int`` per user group, the number of its users (their sum is the number of
    distinct users; private, like the input).

    Args:
      file_pattern: a path or glob on any Beam filesystem; ``.gz`` and ``.bz2``
        files are decompressed; a UTF-8 byte-order mark at the start of a file
        is removed.
      mechanism: a histogram mechanism (``TruncatedGeometric``,
        ``CountLaplace``, ``CountGaussian``, ``WeightedLaplace``,
        ``WeightedGaussian``, ``WeightedGaussianZcdp``) or ``Sips`` with
        ``removal='side-input'`` (its default; ``dp.mechanisms.on_blocks.columnar_rounds``),
        ``Adaptive`` (``adaptive``, ``adaptive-2r``), or a sequential policy mechanism (``PolicyLaplace``, ``PolicyGaussian``,
        ``GW``, ``GWKT``; its ``state`` as in ``ordered.OrderedUserPolicy``; GW's
        ``'first-occurrence'`` tie-break reads the record order: files sorted by
        path, lines in file order). Its guarantee is the release's. DP-SIPS's released items carry no round
        here; the metrics ``beam_dpsu/released_round_<i>`` count them per round.
      run_key: the run's ``RunKey``; None (default) draws a fresh OS-random key
        on a worker (``transforms.run_key``). ``RunKey.from_test_seed`` only
        in tests.
      user_groups: users are split into this many groups by a hash of their
        id; a worker holds one group's lines while it bounds them (about
        lines / ``user_groups`` × 30 bytes). Default ``COLUMNAR_USER_GROUPS``
        (64); raise it for inputs of hundreds of millions of lines. No
        privacy effect.
      item_shards: the histogram is summed and decided in this many shards
        (default ``COLUMNAR_ITEM_SHARDS``, 16). No privacy effect.
      block_bytes: the size of the text blocks a file is read in (default
        8 MiB). No privacy effect.
      range_bytes: an uncompressed file larger than this is read in byte ranges of
        this size, one task each (``lines.byte_ranges``; a range reads the lines
        that start in it), spread over the workers where the runner redistributes
        (``runners.Capabilities.redistributes``; on Dask the ranges are dealt as
        files are), so that one large file is read in parallel; a ``.gz`` or
        ``.bz2`` file is read whole. Default ``lines.RANGE_BYTES`` (64 MiB). No
        privacy effect: every line is read once, in the same record order (the
        first-occurrence tie-break's positions are the whole file's).
      staging_dir: None (default): the pair blocks, partial histograms (and
        DP-SIPS's groups between rounds) go through the runner's shuffles. A
        directory (an existing one every worker reads and writes,
        ``staging.make_directory``): they are written to files there and only
        references are shuffled (``transforms.staging``), so a worker's memory
        holds one group's data, not the run's, on runners that keep a shuffle
        in memory (the DirectRunner, Dask). The files hold private data derived
        from the input: keep the directory as private as the input and remove
        it after the run (``staging.remove_directory``; the command line does
        both). No effect on the release.
      label: the transform's label (default: Beam's).

    Privacy: the mechanism's ``guarantee`` under add/remove-one-user
    neighbouring datasets, provided each user id identifies one person and the
    run key is secret and used for one release only.
    """

    def __init__(self, file_pattern: str, mechanism,
                 run_key: Optional[RunKey] = None, user_groups: int = COLUMNAR_USER_GROUPS,
                 item_shards: int = COLUMNAR_ITEM_SHARDS, block_bytes: int = BLOCK_BYTES,
                 staging_dir: Optional[str] = None, label: Optional[str] = None,
                 range_bytes: int = RANGE_BYTES):
        if not isinstance(file_pattern, str) or not file_pattern:
            raise ValueError(f"file_pattern must be a non-empty string, got {file_pattern!r}")
        if not on_blocks.runs_columnar(mechanism):
            raise ValueError(
                f"SelectFromText runs the histogram mechanisms, DP-SIPS with "
                f"removal='side-input', adaptive weighting and the sequential policy "
                f"mechanisms; got "
                f"{mechanism!r}: use textio.ReadUserItems and SelectPartitions for it")
        super().__init__(mechanism, run_key, user_groups, item_shards, staging_dir, label)
        self._pattern = local_absolute(file_pattern)  # the workers may run elsewhere
        self._block_bytes = _check_count(block_bytes, "block_bytes")
        self._range_bytes = _check_count(range_bytes, "range_bytes")

    def expand(self, pbegin):
        envelope = not runners.capabilities(pbegin.pipeline).tagged_outputs
        if self._rounds is None:
            return self._expand_policy(pbegin, envelope)
        pairs, malformed = self._read_pairs(pbegin, envelope)
        released, users = self._select(pairs, envelope)
        return released, malformed, users

    def _read_pairs(self, pbegin, envelope: bool, counted: bool = False,
                    positions: bool = False):
        """The files' pair blocks by user group, presampled where the mechanism allows
        (``_ReadPairsDoFn``): ``(pairs, malformed)``."""
        files = input_files(pbegin, self._pattern, ordered=positions,
                            range_bytes=self._range_bytes)
        return _apply(files, "ReadPairs", _ReadPairsDoFn(
            self._groups, self._block_bytes, envelope, counted, positions,
            _presampled(self._mechanism), self._staging), envelope, _MALFORMED,
            keys.key_side_input(files, self._run_key))

    def _expand_policy(self, pbegin, envelope: bool):
        """A sequential policy mechanism: counted pairs by group, then ``_policy``."""
        pairs, malformed = self._read_pairs(pbegin, envelope, counted=True,
                                            positions=bool(self._mechanism.needs_record_order))
        released, users = self._policy(pairs, envelope)
        return released, malformed, users


class _GatherPairsDoFn(beam.DoFn):
    """``(user, item)`` pairs → ``(users, items)``: two lists of ``batch`` of a bundle's
    pairs (fewer in the bundle's last), so that the per-pair work is two appends."""

    def __init__(self, batch: int):
        self._batch = batch

    def start_bundle(self):
        self._new_batch()

    def _new_batch(self):
        self._users, self._items = [], []
        self._add_user, self._add_item = self._users.append, self._items.append
        self._left = self._batch

    def process(self, pair):
        # (not a generator: a call per pair is the cost that matters here)
        user, item = pair
        self._add_user(user)
        self._add_item(item)
        self._left -= 1
        if self._left:
            return ()  # (None would make Beam log a warning)
        full = [(self._users, self._items)]
        self._new_batch()
        return full

    def finish_bundle(self):
        if self._users:
            yield GlobalWindows.windowed_value((self._users, self._items))
            self._new_batch()


class _PairsToBlocksDoFn(beam.DoFn):
    """``(users, items)`` lists → ``(group, PairBlock bytes)``, the messages
    ``_ReadPairsDoFn`` makes of text: the ids as strings (``columnar_text.id_strings``),
    the pairs split by user group and presampled under the mechanism's plan where
    it has one (``counted``: with each pair's number of lines, for the sequential
    policies), a group's blocks held (``columnar.PairBuffer``) and sent a few times
    per bundle, the rest when the bundle ends."""

    def __init__(self, groups: int, mechanism=None, stage=None, counted: bool = False):
        self._groups, self._staging, self._counted = groups, stage, counted
        self._plan = keys.KeyedCache(_PresamplePlan(mechanism))

    def start_bundle(self):
        self._held = columnar.PairBuffer()

    def process(self, lists, key_bytes):
        users, items = lists
        parsed = columnar_text.arrays_block(columnar_text.id_strings(users, "user id"),
                                            columnar_text.id_strings(items, "item"))
        plan = self._plan(key_bytes)
        yield from self._send(self._held.add(
            columnar.counted_pair_blocks(parsed, self._groups, None, plan) if self._counted
            else columnar.pair_blocks(parsed, self._groups, plan)))

    def finish_bundle(self):
        for message in self._send(self._held.flush()):
            yield GlobalWindows.windowed_value(message)

    def _send(self, by_group):
        parts = [(g, block.to_bytes()) for g, block in by_group.items()]
        return staging.staged(self._staging, parts) if parts else []


class SelectFromPairs(_Rounds):
    """A PCollection of ``(user_id, item)`` pairs → the items a set-union mechanism
    releases, on the columnar path: ``SelectPartitions`` runs it on pairs (on runners
    that keep what a DoFn emits when a bundle ends).

    The pairs are gathered in batches, each batch turned into the pair blocks
    ``SelectFromText`` makes of text (counted pairs for a sequential policy; user
    ids and items as strings,
    ``dp.data.columnar_text.id_strings``: a ``str`` as itself, another id as an escaped
    string read back on output), and released by the same stages. For ``str``
    ids the release is ``SelectPartitions``'s per-user one under the same key;
    other ids are hashed through their escaped strings (another draw of the same
    mechanism). Returns the released items (no order; the ids as given).

    Args:
      mechanism, run_key, user_groups, item_shards, staging_dir, label: as for
        ``SelectFromText``; a GW or GW-KT with the first-occurrence tie-break is
        refused (pairs carry no record order: ``SelectPartitions`` gives it the
        item-hash tie-break, ``GW.without_record_order``).
      batch_size: the pairs gathered before they are turned into blocks (default
        2**16; no effect on the release).

    Privacy: the mechanism's ``guarantee`` under add/remove-one-user neighbours,
    provided each user id identifies one person and the run key is secret and
    used for one release only.
    """

    def __init__(self, mechanism, run_key: Optional[RunKey] = None,
                 user_groups: int = COLUMNAR_USER_GROUPS,
                 item_shards: int = COLUMNAR_ITEM_SHARDS, staging_dir: Optional[str] = None,
                 batch_size: int = 1 << 16, label: Optional[str] = None):
        if not on_blocks.runs_columnar(mechanism) or getattr(mechanism, "needs_record_order",
                                                             False):
            raise ValueError(f"SelectFromPairs runs the histogram mechanisms, DP-SIPS with "
                             f"removal='side-input' and the sequential policies without the "
                             f"record order; got {mechanism!r}: use SelectPartitions")
        super().__init__(mechanism, run_key, user_groups, item_shards, staging_dir, label)
        self._batch = _check_count(batch_size, "batch_size")

    def expand(self, pcoll):
        check_global_window(pcoll, "SelectFromPairs")
        envelope = not runners.capabilities(pcoll.pipeline).tagged_outputs
        policy = self._rounds is None
        pairs = (pcoll
                 | "Gather" >> beam.ParDo(_GatherPairsDoFn(self._batch))
                 | "ToBlocks" >> beam.ParDo(
                     _PairsToBlocksDoFn(self._groups, _presampled(self._mechanism),
                                        self._staging, counted=policy),
                     keys.key_side_input(pcoll, self._run_key)))
        released, _ = (self._policy if policy else self._select)(pairs, envelope)
        return released | "Ids" >> beam.Map(columnar_text.from_id_string)


class _RoundRule:
    """``run_key → mechanism.release_rule(run_key, round_index)`` (picklable)."""

    def __init__(self, mechanism, round_index: int):
        self._mechanism, self._index = mechanism, round_index

    def __call__(self, run_key: RunKey):
        return self._mechanism.release_rule(run_key, round_index=self._index)
