"""The sequential policies' preparation on a user group's pairs, as arrays.

What ``UserPolicy.prepare`` does for one user (``{item: count}`` → the item
ids ``update`` uses, in the order it uses them), done for all the users of a
group at once on the group's counted pairs (``dp.data.columnar.GroupPairs`` built
from ``counted_pair_blocks``):

* the sampled policies (Policy Laplace, Policy Gaussian): the Δ0 items of
  ``contribution.sample_items`` (``columnar.sampled_pairs``, the same keyed
  scores), their ids in increasing order (as ``prepare`` orders them);
* the greedy policies without public counts (GW, cascade-free and
  published): the walk order of ``sequential.greedy_order``, by the user's
  count descending, then the item id (``tie_break='item-hash'``) or the
  position of the item's first line (``'first-occurrence'``), cut to the first
  Δ0 items for the cascade-free policy;
* any other policy (GW-KT, whose walk order reads the public counts, or a
  policy of the caller's): ``policy.prepare`` user by user, on the user's
  ``{item: count}`` in record order (or item-id order when the pairs carry no
  positions).

The ids are the policy's own (``policy.item_ids``) in ``prepare``'s order, so
the sequential stage, the id map and the release are those of the per-user
path, float for float.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

import numpy as np
import pyarrow as pa

from beam_dpsu.dp.data import sequential as policies
from beam_dpsu.dp.data.columnar import GroupPairs, sampled_pairs
from beam_dpsu.dp.data.contribution import ranks_in_runs

__all__ = ["PreparedUsers", "prepare_pairs"]


@dataclass
class PreparedUsers:
    """A group's prepared users: user ``users[k]`` has the ``lengths[k]`` ids of
    ``ids`` that follow the previous users' (in the order ``update`` uses them);
    ``item_ids`` maps every item behind those ids to its id. Users without ids are
    left out."""
    users: List[str]
    lengths: np.ndarray
    ids: np.ndarray
    item_ids: Dict[str, int]


def _kind(policy) -> str:
    """Which vectorised preparation matches ``policy.prepare`` exactly, or ``'each'``."""
    if policies.is_sampled(policy):
        return "sampled"
    prepare = type(policy).prepare
    if policy.needs_public_counts:
        return "each"
    if prepare is policies.GreedyPolicy.prepare:
        return "greedy"
    if prepare is policies.CascadeFreeGreedyPolicy.prepare and policy.selection == "prefix":
        return "cascade-free"
    return "each"


def _check_counted(pairs: GroupPairs, record_order: bool) -> None:
    if pairs.counts is None:
        raise ValueError("the sequential policies need counted pairs "
                         "(columnar.counted_pair_blocks)")
    if record_order and pairs.first is None:
        raise ValueError("tie_break='first-occurrence' needs the pairs' first positions "
                         "(counted_pair_blocks with a base position)")


def _ids(policy, items: pa.Array, codes: np.ndarray):
    """The policy's item ids of ``items[codes]``: ``(names, ids, per_code)``, the
    distinct items among them (as ``str``), their ids, and the id of each code.
    Each distinct item is hashed once."""
    used, inverse = np.unique(codes, return_inverse=True)
    names = items.take(pa.array(used)).to_pylist()
    ids = np.array(policy.item_ids.many(names), dtype=np.int64).reshape(-1)
    return names, ids, ids[inverse.reshape(-1)]


def prepare_pairs(pairs: GroupPairs, policy: policies.UserPolicy,
                  public_counts: Optional[Mapping[str, float]] = None) -> PreparedUsers:
    """``policy.prepare`` of every user of a group's distinct pairs (see the module
    docstring): ``PreparedUsers``. ``public_counts``: ``{item: count}`` for a policy
    that needs them (GW-KT), else None. Only the items prepared users keep are
    hashed to ids, except under the item-hash tie-break, whose walk order reads
    every item's id."""
    u, i = pairs.u, pairs.i
    if len(u) == 0:
        return PreparedUsers([], np.zeros(0, np.int64), np.zeros(0, np.int64), {})
    kind = _kind(policy)
    record_order = getattr(policy, "tie_break", None) == "first-occurrence"
    if kind == "each":
        return _prepare_each(pairs, policy, public_counts, record_order)
    if kind == "sampled":
        keep = sampled_pairs(pairs, policy.max_items, policy.sample_key)
        pu = u[keep]
        names, ids, pid = _ids(policy, pairs.items, i[keep])
        order = np.lexsort((pid, pu))  # a user's kept ids in increasing order
        pu, pid = pu[order], pid[order]
    else:
        _check_counted(pairs, record_order)
        every = None
        if record_order:
            order = np.lexsort((pairs.first, -pairs.counts, u))
        else:  # the walk order reads every item's id
            _, every, _ = _ids(policy, pairs.items, np.arange(len(pairs.items)))
            order = np.lexsort((every[i], -pairs.counts, u))
        pu, pi = u[order], i[order]
        if kind == "cascade-free":  # K_i: the first Δ0 items of the walk
            cut = ranks_in_runs(pu) < policy.max_items
            pu, pi = pu[cut], pi[cut]
        if every is None:
            names, ids, pid = _ids(policy, pairs.items, pi)
        else:
            used = np.unique(pi)
            names, ids, pid = pairs.items.take(pa.array(used)).to_pylist(), every[used], every[pi]
    num = np.bincount(pu, minlength=len(pairs.users))
    here = np.flatnonzero(num)
    return PreparedUsers(pairs.users.take(pa.array(here)).to_pylist(),
                         num[here].astype(np.int64), pid, dict(zip(names, ids.tolist())))


def _prepare_each(pairs, policy, public_counts, record_order) -> PreparedUsers:
    """``policy.prepare`` user by user, on ``{item: count}`` in record order (by the
    first positions when the pairs have them, else by item id: an order that
    depends on the user's own items and the key only)."""
    _check_counted(pairs, record_order)
    u, i = pairs.u, pairs.i
    names = pairs.items.to_pylist()
    every = np.array(policy.item_ids.many(names), dtype=np.int64).reshape(-1)
    rank = pairs.first if pairs.first is not None else every[i]
    bounds = np.r_[0, np.flatnonzero(u[1:] != u[:-1]) + 1, len(u)] if len(u) else [0]
    user_names = pairs.users.to_pylist()
    counts = pairs.counts.tolist()
    out_users, lengths, ids = [], [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        mine = sorted(range(a, b), key=rank.__getitem__)
        user_counts = {names[i[k]]: counts[k] for k in mine}
        got, _ = policy.prepare(user_names[u[a]], user_counts, public_counts)
        if len(got):
            out_users.append(user_names[u[a]])
            lengths.append(len(got))
            ids.extend(got)
    ids = np.array(ids, dtype=np.int64)
    used = np.flatnonzero(np.isin(every, ids))
    return PreparedUsers(out_users, np.array(lengths, dtype=np.int64), ids,
                         dict(zip([names[j] for j in used.tolist()], every[used].tolist())))
