"""A mechanism on the data path's blocks of arrays: which mechanisms the columnar path runs
(``runs_columnar``), their rounds there (``columnar_rounds``), the Δ0 sample the read stage
may take for them (``presample_plan``), and the whole columnar path in one process without
Beam (``release_from_files``, the benchmarks' floor).

The data path (``beam_dpsu.dp.data.columnar``) knows no mechanism; this module, above both,
hands it what a mechanism needs.
"""
from __future__ import annotations

from contextlib import closing
from typing import Dict, Iterable, List, Optional, Tuple

import pyarrow as pa

from beam_dpsu.dp.data import sequential as policies
from beam_dpsu.dp.data.columnar import (COLUMNAR_ITEM_SHARDS, COLUMNAR_USER_GROUPS, GroupPairs,
                                        PairBlock, PairBuffer, group_pairs, pair_blocks,
                                        pairs_histogram, release_shard, split_by_shard,
                                        sum_histograms, without_items)
from beam_dpsu.dp.data.columnar_text import parse_block
from beam_dpsu.dp.mechanisms.adaptive import Adaptive
from beam_dpsu.dp.mechanisms.histogram_threshold import HistogramMechanism
from beam_dpsu.dp.mechanisms.policy import PolicyMechanism
from beam_dpsu.dp.mechanisms.sips import Sips
from beam_dpsu.dp.randomness.buffers import Scratch

__all__ = ["presample_plan", "runs_columnar", "columnar_rounds", "release_from_files"]


def presample_plan(mechanism, run_key) -> Optional[Tuple[int, bytes]]:
    """``(Δ0, sampling key)`` under which the read stage may ``presample`` a
    mechanism's pair blocks, or None: a one-round mechanism with a Δ0 (its key
    ``run_key.subkey('sample/0')``) and the sampled policies (Policy Laplace,
    Policy Gaussian: their policy's ``sample_key``). Not DP-SIPS with several
    rounds (its later rounds sample all the pairs again under other keys), not
    GW (whose K_i follows the user's counts over the whole input)."""
    if isinstance(mechanism, PolicyMechanism):
        policy = mechanism.policy(run_key)
        return (policy.max_items, policy.sample_key) if policies.is_sampled(policy) else None
    rounds = getattr(mechanism, "rounds", None) or []
    if isinstance(mechanism, HistogramMechanism) and len(rounds) == 1 \
            and rounds[0].max_items is not None:
        return rounds[0].max_items, run_key.subkey("sample/0")
    if isinstance(mechanism, Adaptive):  # both stages read the one sample/0 sample
        return mechanism.max_items, run_key.subkey("sample/0")
    return None


def runs_columnar(mechanism) -> bool:
    """Whether the columnar path runs ``mechanism``: a histogram mechanism (one
    round), DP-SIPS with ``removal='side-input'`` (its rounds, each on the items
    earlier rounds did not release, the released items held per group), adaptive
    weighting (``transforms.columnar``'s own stages) or a sequential policy
    mechanism (its users prepared on counted pairs, ``dp.data.columnar_policy``)."""
    return (isinstance(mechanism, (HistogramMechanism, PolicyMechanism, Adaptive))
            or (isinstance(mechanism, Sips) and mechanism.removal == "side-input"))


def columnar_rounds(mechanism) -> list:
    """The rounds of a histogram mechanism or DP-SIPS on the columnar path; raises
    ValueError for any other mechanism (a policy mechanism has no rounds here:
    ``dp.data.columnar_policy`` prepares its users)."""
    if runs_columnar(mechanism) and not isinstance(mechanism, (PolicyMechanism, Adaptive)):
        return list(mechanism.rounds)
    raise ValueError(
        f"the columnar path runs the histogram mechanisms and DP-SIPS with "
        f"removal='side-input'; got {mechanism!r}: use textio.ReadUserItems and "
        f"SelectPartitions for it")


def release_from_files(paths: Iterable[str], mechanism, run_key,
                       user_groups: int = COLUMNAR_USER_GROUPS,
                       item_shards: int = COLUMNAR_ITEM_SHARDS, block_bytes: Optional[int] = None
                       ) -> Tuple[set, int, Dict[bytes, int]]:
    """The columnar path in one process, without Beam: local text files → ``(released
    set, number of users, {malformed line: occurrences})``, exactly what
    ``transforms.columnar.SelectFromText`` computes on a runner (the benchmarks'
    floor). ``mechanism``: a histogram mechanism or DP-SIPS (``columnar_rounds``);
    ``run_key``: its ``RunKey``."""
    from beam_dpsu.dp.data.lines import BLOCK_BYTES, block_buffers, open_local_binary, read_blocks
    rounds = columnar_rounds(mechanism)
    plan = presample_plan(mechanism, run_key)
    groups: Dict[int, List[bytes]] = {}
    malformed: Dict[bytes, int] = {}
    scratch, read_buffers = Scratch(), block_buffers()  # kept from file to file
    held = PairBuffer()
    for path in paths:
        with open_local_binary(path) as f, closing(read_blocks(
                f, block_bytes or BLOCK_BYTES, buffers=read_buffers)) as blocks:
            for block in blocks:
                parsed = parse_block(block, scratch)
                for line, n in parsed.malformed.items():
                    malformed[line] = malformed.get(line, 0) + n
                for g, pairs in held.add(pair_blocks(parsed, user_groups, plan,
                                                      scratch)).items():
                    groups.setdefault(g, []).append(pairs.to_bytes())
        for g, pairs in held.flush().items():
            groups.setdefault(g, []).append(pairs.to_bytes())
    kept: Dict[int, bytes] = {}  # a group's pairs between rounds
    released: Dict[str, int] = {}
    users = 0
    for index, r in enumerate(rounds):
        last = index + 1 == len(rounds)
        removed = pa.array(list(released), pa.string())
        key = run_key.subkey(f"sample/{index}")
        shards: Dict[int, List[bytes]] = {}
        for g in sorted(groups if index == 0 else kept):
            if index == 0:
                pairs = group_pairs([PairBlock.from_bytes(b) for b in groups.pop(g)])
            else:
                pairs = without_items(GroupPairs.from_bytes(kept.pop(g)), removed)
            hist = pairs_histogram(pairs, r.max_items, r.weighting, key)
            users += hist.num_users if index == 0 else 0
            if not last and len(pairs):
                kept[g] = pairs.to_bytes()
            for s, blob in split_by_shard(hist, item_shards).items():
                shards.setdefault(s, []).append(blob)
        rule = mechanism.release_rule(run_key, round_index=index)
        while shards:
            _, blobs = shards.popitem()
            released.update(dict.fromkeys(release_shard(rule, *sum_histograms(blobs)), index))
    return set(released), users, malformed
