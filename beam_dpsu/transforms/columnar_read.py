"""The read stage of the columnar transforms, and the activity histogram read that way.

``_ReadPairsDoFn`` reads text files in blocks of arrays and sends each user group's
pairs as Arrow IPC messages (``dp.data.columnar.PairBlock``), the malformed lines on an
output of their own. ``SelectFromText`` (``transforms.columnar``) and ``RankFromText``
(``transforms.columnar_rank``) read through it, and so does ``ActivityFromText``: each
user group's users counted by their number of distinct items, the exact statistic of
GW-KT's DP scale estimate.

The underscore names here are the columnar transforms' shared internals (the outputs'
tags, the presample plans, ``_apply``: a ParDo with tagged outputs on every runner), not
part of the API.
"""
from __future__ import annotations

from contextlib import closing
from typing import Any, Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa

from beam_dpsu.dp.randomness import buffers
from beam_dpsu.dp.data import columnar, columnar_text
from beam_dpsu.dp.mechanisms import on_blocks
from beam_dpsu.dp.data.columnar import COLUMNAR_USER_GROUPS
from beam_dpsu.dp.data.lines import (BLOCK_BYTES, RANGE_BYTES, block_buffers,
                                     read_range_blocks)
from beam_dpsu.dp.mechanisms.activity import SCALE_BUCKETS, ActivityBuckets
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms import run_key as keys
from beam_dpsu.transforms import ordered, runners
from beam_dpsu.transforms.textio import file_of, input_files, open_binary
from beam_dpsu.transforms.write import local_absolute

__all__ = ["ActivityFromText"]


_MALFORMED, _USERS = "malformed", "users"


class _ReadPairsDoFn(beam.DoFn):
    """A file (a path, or ``(file index, path)`` with ``positions``; in place of the
    path, a byte range of it, ``textio.file_ranges``' ``(path, start, end)``: the
    lines that start in the range, ``lines.read_range_blocks``) → ``(group,
    PairBlock bytes)``: a user group's pairs, one message per group at each flush
    of a ``columnar.PairBuffer`` (every ``columnar.FLUSH_PAIRS`` pairs read, and at
    the end of the file or range); ``(raw line, occurrences)`` per distinct malformed
    line of a block on ``_MALFORMED``. The metric ``input_files`` counts a file once
    (a whole file, or its range that starts at 0). ``counted``: the blocks
    of ``columnar.counted_pair_blocks`` (with each pair's first line position when
    ``positions``), else ``columnar.pair_blocks``. ``mechanism``: the mechanism
    whose ``on_blocks.presample_plan`` (under the run key, a side input) presamples
    every block; None: no presampling (``plan``: a picklable ``run_key → (Δ0, key)``
    instead of the mechanism's). ``within``: the element is ``(file, items)``
    and only the pairs of those items are sent (no malformed lines: a second read
    of files read before)."""

    def __init__(self, groups: int, block_bytes: int, envelope: bool, counted: bool = False,
                 positions: bool = False, mechanism=None, stage=None, within: bool = False,
                 plan=None):
        self._groups, self._block_bytes, self._envelope = groups, block_bytes, envelope
        self._within = within
        self._staging = stage
        self._counted, self._positions = counted, positions
        # (Δ0, key) of on_blocks.presample_plan, built on the worker from the run key
        self._plan = keys.KeyedCache(_PresamplePlan(mechanism) if plan is None else plan)
        self._malformed = beam.metrics.Metrics.counter("beam_dpsu", "malformed_lines")
        self._files = beam.metrics.Metrics.counter("beam_dpsu", "input_files")
        self._memory = None  # (Scratch, read buffers): made on the worker, kept file to file

    def process(self, element, key_bytes):
        file = element[0] if self._within else element
        if file_of(file[1] if self._positions else file)[1] == 0:
            self._files.inc()
        if self._staging is None:
            yield from self._read(element, key_bytes, None)
            return
        # the file's blocks go to one staged file, closed before any reference leaves
        with self._staging.writer() as sink:
            yield from self._read(element, key_bytes, sink)
        for ref in sink.refs:
            yield runners.main_output(ref, self._envelope)

    def finish_bundle(self):
        self._memory = None  # not held through the later stages

    def _read(self, element, key_bytes, sink):
        """The file's malformed lines (tagged) and its pair blocks: emitted, or added
        to ``sink`` (a ``staging.StagedWriter``) when given."""
        plan = self._plan(key_bytes)
        domain = None
        if self._within:  # (path, items): only the pairs of those items; the malformed
            element, items = element  # lines were reported by the first read
            domain = pa.array(list(items), pa.string())
        file_index, file = element if self._positions else (None, element)
        path, start, end = file_of(file)
        # one block's arrays and read buffers, reused by the next block and file: taken
        # for this file and given back only once it is read whole (a read abandoned on an
        # error keeps them, its reader thread may still hold them)
        memory, self._memory = self._memory, None
        if memory is None:
            memory = buffers.Scratch(), block_buffers()
        scratch, read_buffers = memory
        held = columnar.PairBuffer()  # the file's groups, sent a few times per file
        # the reader thread is stopped and joined (closing) before the file is closed;
        # a block's buffer may be read into again once the next block is asked for: what
        # leaves an iteration is copied out of it (the messages' bytes, malformed lines)
        with open_binary(path) as f:
            # offset: of the block in the file's text (the whole file's, for a range)
            offset, blocks = read_range_blocks(f, start, end, self._block_bytes,
                                               buffers=read_buffers)
            with closing(blocks):
                for block in blocks:
                    parsed = columnar_text.parse_block(block, scratch)
                    for line, n in ({} if self._within else parsed.malformed).items():
                        self._malformed.inc(n)
                        yield runners.tag((line, n), _MALFORMED, self._envelope)
                    if self._counted:
                        base = (None if file_index is None else
                                columnar_text.line_position(file_index, offset, len(block)))
                        by_group = columnar.counted_pair_blocks(parsed, self._groups, base,
                                                                plan)
                    else:
                        by_group = columnar.pair_blocks(parsed, self._groups, plan, scratch,
                                                        within=domain)
                    offset += len(block) + 1
                    yield from self._send(held.add(by_group), sink)
        yield from self._send(held.flush(), sink)
        self._memory = memory

    def _send(self, by_group, sink):
        """``{group: PairBlock}`` as messages: emitted, or added to ``sink``."""
        for group, pairs in by_group.items():
            if sink is None:
                yield runners.main_output((group, pairs.to_bytes()), self._envelope)
            else:
                sink.add(group, pairs.to_bytes())


def _presampled(mechanism):
    """``mechanism`` if the read stage presamples for it (``on_blocks.presample_plan``
    gives a plan; the plan's keys are drawn on the workers), else None (nothing of
    it is shipped to the read stage)."""
    return (mechanism if on_blocks.presample_plan(mechanism, ordered.UPDATE_ONLY_KEY)
            is not None else None)


class _PresamplePlan:
    """``run_key → on_blocks.presample_plan(mechanism, run_key)`` (picklable; None
    without a mechanism)."""

    def __init__(self, mechanism):
        self._mechanism = mechanism

    def __call__(self, run_key: RunKey):
        if self._mechanism is None:
            return None
        return on_blocks.presample_plan(self._mechanism, run_key)


def _check_count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _same_key(run_key: RunKey) -> RunKey:
    return run_key

def _apply(pcoll, label: str, dofn, envelope: bool, tags, *side_inputs):
    """``pcoll | label >> ParDo(dofn)`` with a main output and the output(s) ``tags`` (a
    tag or a tuple of tags): ``(main, tagged...)``; in envelope mode (Dask) the one
    output is split."""
    tags = (tags,) if isinstance(tags, str) else tuple(tags)
    if envelope:
        out = pcoll | label >> beam.ParDo(dofn, *side_inputs).with_output_types(Any)
        split = runners.split_envelopes(out, f"{label}/Split", (None,) + tags)
        return tuple(split[t] for t in (None,) + tags)
    out = pcoll | label >> beam.ParDo(dofn, *side_inputs).with_output_types(Any).with_outputs(
        *tags, main="main")
    return (out.main,) + tuple(out[t] for t in tags)



#: What ``ActivityFromText``'s read stage gets instead of a run key (it samples nothing).
_NO_KEY = b"beam_dpsu: this stage uses no key"


class _GroupActivityDoFn(beam.DoFn):
    """``(group, [PairBlock bytes])`` → the group's activity histogram in ``buckets`` (a
    tuple of ints): its users counted by their number of distinct items."""

    def __init__(self, buckets: ActivityBuckets):
        self._buckets = buckets

    def process(self, element):
        pairs = columnar.group_pairs(columnar.PairBlock.from_bytes(b) for b in element[1])
        distinct = np.bincount(pairs.u, minlength=len(pairs.users))
        yield tuple(int(n) for n in self._buckets.histogram(distinct[distinct > 0]))


class ActivityFromText(beam.PTransform):
    """Text files of ``user_id<TAB>item`` lines → one activity histogram per user group
    (a tuple of ``buckets.count`` ints; their sum over the groups is the histogram of
    every user by its number of distinct items), read as ``SelectFromText`` reads: the
    exact statistic of the DP activity estimate (``mechanisms.activity.release_scale``)
    of GW-KT and of ``--max-items-per-user auto``.

    Args:
      file_pattern: as for ``SelectFromText``.
      buckets: the bucket layout (``mechanisms.activity.ActivityBuckets``); default
        GW-KT's ``SCALE_BUCKETS``.
      user_groups, block_bytes, range_bytes: as for ``SelectFromText``; no effect on the
        result.

    Privacy: the output is exact and private; only its noised release may leave the
    owner's hands.
    """

    def __init__(self, file_pattern: str, buckets: ActivityBuckets = SCALE_BUCKETS,
                 user_groups: int = COLUMNAR_USER_GROUPS, block_bytes: int = BLOCK_BYTES,
                 label: Optional[str] = None, range_bytes: int = RANGE_BYTES):
        super().__init__(label)
        if not isinstance(file_pattern, str) or not file_pattern:
            raise ValueError(f"file_pattern must be a non-empty string, got {file_pattern!r}")
        if not isinstance(buckets, ActivityBuckets):
            raise ValueError(f"buckets must be an ActivityBuckets, got {buckets!r}")
        self._buckets = buckets
        self._pattern = local_absolute(file_pattern)  # the workers may run elsewhere
        self._groups = _check_count(user_groups, "user_groups")
        self._block_bytes = _check_count(block_bytes, "block_bytes")
        self._range_bytes = _check_count(range_bytes, "range_bytes")

    def expand(self, pbegin):
        envelope = not runners.capabilities(pbegin.pipeline).tagged_outputs
        files = input_files(pbegin, self._pattern, range_bytes=self._range_bytes)
        # no presampling, so no key: a public placeholder stands where the run key goes
        pairs, _ = _apply(files, "ReadPairs", _ReadPairsDoFn(
            self._groups, self._block_bytes, envelope), envelope, _MALFORMED, _NO_KEY)
        return (pairs | "GroupUsers" >> beam.GroupByKey()
                | "Activity" >> beam.ParDo(_GroupActivityDoFn(self._buckets)))
