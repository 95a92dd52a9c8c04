"""``RankFromText``: top-k and discovery then peeling straight from text files, on blocks of arrays.

Top-k with limited domain counts each item's users (Δ-sampled under top-k's own key
purpose) as a count histogram per item shard, keeps in each shard the items that can be
among the true top k̄ + 1 (``dp.data.columnar.top_candidates``) and re-ranks them on one
worker for the release (``TopKMechanism.release``). Discovery then peeling reads the
files twice: first as ``SelectFromText`` releases Weighted Gaussian (the domain), then
keeping only the pairs of the domain's items, which go to the one worker of the peeling
(``dp.mechanisms.peeling.held_rounds``). The files are read as
``transforms.columnar_read`` reads them.
"""
from __future__ import annotations

from typing import Optional

import apache_beam as beam

from beam_dpsu.dp.data import columnar
from beam_dpsu.dp.data.columnar import COLUMNAR_ITEM_SHARDS, COLUMNAR_USER_GROUPS
from beam_dpsu.dp.data.lines import BLOCK_BYTES, RANGE_BYTES
from beam_dpsu.dp.mechanisms.peeling import DiscoverPeelHittingSet, DiscoverThenPeel
from beam_dpsu.dp.mechanisms.topk import DEFAULT_PURPOSE as TOPK_PURPOSE, TopKMechanism, true_top
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms import run_key as keys
from beam_dpsu.transforms import runners, staging
from beam_dpsu.transforms.textio import input_files
from beam_dpsu.transforms.write import local_absolute
from beam_dpsu.transforms.columnar import SelectFromText, _BoundHistogramDoFn
from beam_dpsu.transforms.columnar_read import (_MALFORMED, _NO_KEY, _USERS, _ReadPairsDoFn,
                                                _apply, _check_count, _same_key)

__all__ = ["RankFromText"]


class _TopKSample:
    """``run_key → (Δ, key)`` of a top-k query's Δ sample (``TopK``'s: the key of
    ``purpose + '/sample'``), the read stage's presample plan (picklable)."""

    def __init__(self, max_items: int, purpose: str):
        self._max_items, self._purpose = max_items, purpose

    def __call__(self, run_key: RunKey):
        return self._max_items, run_key.subkey(self._purpose + "/sample")


class _ShardTopDoFn(beam.DoFn):
    """``(shard, [partial histogram bytes])`` → ``(None, top)``: the shard's true top
    ``n`` ``(item, users)`` by the query's ``RankKey`` (count, then the keyed tie
    hash: a total order), from the items that can be among them
    (``columnar.top_candidates``). The item shards partition the items, so the true
    top n is among the shards' top n."""

    def __init__(self, n: int, purpose: str, stage=None):
        self._n, self._staging = n, stage
        self._purpose = purpose
        self._run_key = keys.KeyedCache(_same_key)

    def process(self, element, key_bytes):
        items, counts = columnar.sum_histograms(staging.unstaged(self._staging, element[1]))
        top = true_top(columnar.top_candidates(items, counts, self._n), self._n,
                       self._run_key(key_bytes), self._purpose)
        if top:
            yield None, top


class _TopKReleaseDoFn(beam.DoFn):
    """``(None, [candidates, ...])`` → ``TopKMechanism.release``'s ranked rows (the
    true top k̄ + 1 re-ranked there with the query's keyed tie-break)."""

    def __init__(self, mechanism, purpose: str):
        self._mechanism, self._purpose = mechanism, purpose
        self._run_key = keys.KeyedCache(_same_key)
        self._released = beam.metrics.Metrics.counter("beam_dpsu", "released")

    def process(self, element, key_bytes):
        top = [pair for part in element[1] for pair in part]
        rows = self._mechanism.release(top, self._run_key(key_bytes), self._purpose)
        self._released.inc(len(rows))
        yield from rows


class _InDomainDoFn(beam.DoFn):
    """``(group, [PairBlock bytes])`` of the discovered domain's pairs → ``(None, part)``
    for the peeling stage's one worker: ``('counts', (items, users per item))`` for
    top-k, ``('pairs', (number of pairs, columnar.held_pairs message or its staged
    reference))`` for the hitting set."""

    def __init__(self, hitting: bool, stage=None):
        self._hitting, self._staging = hitting, stage

    def process(self, element):
        pairs = columnar.group_pairs(columnar.PairBlock.from_bytes(b)
                                     for b in staging.unstaged(self._staging, element[1]))
        if not len(pairs):
            return
        if self._hitting:
            for _, blob in staging.staged(self._staging, [(None, columnar.held_pairs(pairs))]):
                yield None, ("pairs", (len(pairs), blob))
        else:
            yield None, ("counts", columnar.item_users_of_pairs(pairs))


class _PeelDoFn(beam.DoFn):
    """``(None, [("domain", item) or part, ...])`` → the peeling stage's ranked rows: top-k
    on the summed user counts (``DiscoverPeelTopK.peel``), the hitting set on the
    groups' pairs (``DiscoverPeelHittingSet.peel_pairs``)."""

    def __init__(self, mechanism, stage=None):
        self._mechanism, self._staging = mechanism, stage
        self._run_key = keys.KeyedCache(_same_key)
        self._released = beam.metrics.Metrics.counter("beam_dpsu", "released")

    def process(self, element, key_bytes):
        run_key = self._run_key(key_bytes)
        domain = [value for kind, value in element[1] if kind == "domain"]
        parts = [value for kind, value in element[1] if kind != "domain"]
        if isinstance(self._mechanism, DiscoverPeelHittingSet):
            # one group's pairs read at a time, into arrays of the total's size
            rows = self._mechanism.peel_pairs(
                (columnar.read_held_pairs(staging.unstaged(self._staging, [blob])[0])
                 for _, blob in parts), domain, run_key, total_pairs=sum(n for n, _ in parts))
        else:  # every discovered item is a candidate, held or not (as item_users)
            counts = dict.fromkeys(domain, 0)
            for items, users in parts:
                for item, n in zip(items, users):
                    counts[item] = counts.get(item, 0) + n
            rows = self._mechanism.peel(counts, run_key)
        self._released.inc(len(rows))
        yield from rows


class RankFromText(beam.PTransform):
    """Text files of ``user_id<TAB>item`` lines → a ranked release: the rows of a
    top-k query (``TopKMechanism``) or of discovery then peeling (top-k over an
    unknown domain, ``DiscoverPeelTopK``, or the k-hitting set,
    ``DiscoverPeelHittingSet``), on blocks of arrays as ``SelectFromText``.

    ``p | RankFromText(pattern, mechanism, key)`` releases what ``p |
    ReadUserItems(pattern) | TopK(mechanism, key, per_user=True)`` (or
    ``DiscoverThenPeelTransform``) releases under the same key: the same users'
    distinct items, the same Δ sample (``TopK``'s purpose), the same true top k̄ + 1
    (each item shard's candidates, re-ranked on one worker), the same discovered
    domain (Weighted Gaussian's columnar release, ``SelectFromText``) and the same
    peeling on each user's items within it (the files read a second time for the
    domain's pairs only; one worker, over arrays of item indices).
    Returns ``(rows, malformed, users)``: the ranked rows (``(rank, item)`` or
    ``(rank, item, noisy_count)``, in no order: write them with
    ``write.ranked_lines``), the malformed lines as ``(raw line bytes,
    occurrences)`` (private) and one ``int`` per user group, its number of users
    (private).

    Args:
      file_pattern, run_key, user_groups, item_shards, block_bytes, staging_dir,
        label, range_bytes: as for ``SelectFromText`` (none affects the release).
      mechanism: a ``TopKMechanism``, ``DiscoverPeelTopK`` or
        ``DiscoverPeelHittingSet``; its guarantee is the release's.
      purpose: a top-k query's key purpose (default ``'topk/0'``, ``TopK``'s);
        two queries under one key need distinct purposes.

    Memory: top-k holds one candidate list per item shard on one worker, and a
    worker one user group's distinct pairs (all of them without Δ; with Δ, read
    presampled as ``SelectFromText`` reads them); discovery then
    peeling holds what ``SelectFromText`` holds, then one group's pairs within the
    domain, and the hitting set one int32 per (user, discovered item) pair and one
    offset per user on the peeling's worker.

    Privacy: the mechanism's ``guarantee`` under add/remove-one-user neighbours,
    provided each user id identifies one person and the run key is secret and used
    for one release only. Discovery then peeling reads the files twice: they must
    not change during the run (every discovered item stays a candidate of the
    peeling whatever the second read finds).
    """

    def __init__(self, file_pattern: str, mechanism, run_key: Optional[RunKey] = None,
                 user_groups: int = COLUMNAR_USER_GROUPS,
                 item_shards: int = COLUMNAR_ITEM_SHARDS, block_bytes: int = BLOCK_BYTES,
                 staging_dir: Optional[str] = None, purpose: str = TOPK_PURPOSE,
                 label: Optional[str] = None, range_bytes: int = RANGE_BYTES):
        super().__init__(label)
        if not isinstance(file_pattern, str) or not file_pattern:
            raise ValueError(f"file_pattern must be a non-empty string, got {file_pattern!r}")
        if not isinstance(mechanism, (TopKMechanism, DiscoverThenPeel)):
            raise ValueError(f"RankFromText runs a TopKMechanism, DiscoverPeelTopK or "
                             f"DiscoverPeelHittingSet; got {mechanism!r}")
        if not isinstance(purpose, str) or not purpose:
            raise ValueError(f"purpose must be a non-empty string, got {purpose!r}")
        self._pattern = local_absolute(file_pattern)  # the workers may run elsewhere
        self._mechanism, self._purpose = mechanism, purpose
        self._run_key = keys.for_pipeline(run_key)
        self._groups = _check_count(user_groups, "user_groups")
        self._shards = _check_count(item_shards, "item_shards")
        self._block_bytes = _check_count(block_bytes, "block_bytes")
        self._range_bytes = _check_count(range_bytes, "range_bytes")
        self._staging = None if staging_dir is None else staging.Staging(staging_dir)

    def expand(self, pbegin):
        m = self._mechanism
        if not isinstance(m, TopKMechanism):
            return self._discover_then_peel(pbegin)
        envelope = not runners.capabilities(pbegin.pipeline).tagged_outputs
        files = input_files(pbegin, self._pattern, range_bytes=self._range_bytes)
        # with Δ, the blocks presampled under the query's own sampling key; without,
        # every distinct item of a user counts
        plan = None if m.max_items is None else _TopKSample(m.max_items, self._purpose)
        pairs, malformed = _apply(files, "ReadPairs", _ReadPairsDoFn(
            self._groups, self._block_bytes, envelope, stage=self._staging, plan=plan),
            envelope, _MALFORMED,
            _NO_KEY if plan is None else keys.key_side_input(files, self._run_key))
        grouped = pairs | "GroupUsers" >> beam.GroupByKey()
        partials, users = _apply(grouped, "UsersPerItem", _BoundHistogramDoFn(
            m.max_items, "count", self._purpose + "/sample", self._shards, envelope,
            self._staging), envelope, _USERS, keys.key_side_input(grouped, self._run_key))
        rows = (partials
                | "GroupShards" >> beam.GroupByKey()
                | "ShardTop" >> beam.ParDo(
                    _ShardTopDoFn(m.k_bar + 1, self._purpose, self._staging),
                    keys.key_side_input(grouped, self._run_key))
                | "Collect" >> beam.GroupByKey()
                | "Release" >> beam.ParDo(_TopKReleaseDoFn(m, self._purpose),
                                          keys.key_side_input(grouped, self._run_key)))
        return rows, malformed, users

    def _discover_then_peel(self, pbegin):
        """Discovery as ``SelectFromText`` releases Weighted Gaussian (its Δ0 sample
        presampled as the files are read), then the files read again keeping only
        the discovered items' pairs (a user's pairs outside the domain are never
        held), each group's within-domain pairs to the one worker of the peeling."""
        m = self._mechanism
        envelope = not runners.capabilities(pbegin.pipeline).tagged_outputs
        layout = {"user_groups": self._groups, "item_shards": self._shards,
                  "block_bytes": self._block_bytes, "range_bytes": self._range_bytes,
                  "staging_dir": None if self._staging is None else self._staging.directory}
        domain, malformed, users = pbegin | "Discover" >> SelectFromText(
            self._pattern, m.discovery, self._run_key, **layout)
        files = (input_files(pbegin, self._pattern, label="FilesAgain", ordered=True,
                             range_bytes=self._range_bytes)
                 | "ByIndex" >> beam.Map(_file_key))
        with_domain = files | "WithDomain" >> runners.WithList(domain, _FILE_KEYS, _with_items)
        pairs, _ = _apply(with_domain, "ReadDomainPairs", _ReadPairsDoFn(
            self._groups, self._block_bytes, envelope, stage=self._staging, within=True),
            envelope, _MALFORMED, _NO_KEY)
        parts = (pairs
                 | "GroupDomainPairs" >> beam.GroupByKey()
                 | "InDomain" >> beam.ParDo(_InDomainDoFn(
                     isinstance(m, DiscoverPeelHittingSet), self._staging)))
        # the domain travels with the parts (no side input: some runners evaluate one
        # again in every task)
        rows = ((domain | "TagDomain" >> beam.Map(_tag_domain), parts)
                | "Together" >> beam.Flatten()
                | "Collect" >> beam.GroupByKey()
                | "Peel" >> beam.ParDo(_PeelDoFn(m, self._staging),
                                       keys.key_side_input(parts, self._run_key)))
        return rows, malformed, users


#: the keys the files of the second read are spread over to meet the domain
#: (``runners.WithList``: one per file up to this many)
_FILE_KEYS = 16


def _file_key(element):
    index, file = element  # a path, or a byte range of it: (path, start, end)
    spread = index if isinstance(file, str) else hash((index, file[1]))
    return spread % _FILE_KEYS, file


def _with_items(key: int, file, items):
    yield file, items  # a path, or a byte range of it


def _tag_domain(item: str):
    return None, ("domain", item)
