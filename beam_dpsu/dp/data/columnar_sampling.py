"""The Δ0 sampler on arrays: ``contribution.sample_items``'s subsets for many users at once.

``contribution.sample_items`` keeps a user's ``max_items`` (Δ0) distinct items of
smallest keyed score (SipHash-2-4 of the item under the user's own key). Here the
scores of every pair of the users with more than Δ0 items are computed at once, on
the byte spans of their items (``dp.data.columnar_text``), and the same subsets
kept: ``presample_mask`` (a block's pairs that can still be among their user's Δ0,
``columnar.presample``) and ``sample_big_users`` (a group's exact sample,
``columnar.sampled_pairs``). A tie at the cut is settled by ``sample_items`` itself.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from beam_dpsu.dp.randomness import compiled
from beam_dpsu.dp.randomness.buffers import Scratch, empty
from beam_dpsu.dp.data.contribution import (item_scores, owner_score_order, ranks_in_runs,
                                            sample_items, sampling_keys, smallest_scores,
                                            user_keys)
from beam_dpsu.dp.randomness.noise import STR_TAG
from beam_dpsu.dp.data.columnar_text import string_spans, work_array

__all__ = ["presample_mask", "sample_big_users"]


def presample_mask(users: pa.Array, spans, user_index: np.ndarray, max_items: int,
                   sample_key: bytes, scratch: Optional[Scratch] = None
                   ) -> Optional[np.ndarray]:
    """Which pairs ``presample`` keeps (a boolean mask; None: all). Pair k is
    ``(users[user_index[k]], item k)``, item k the bytes ``data[starts[k]:starts[k] +
    lengths[k]]`` of ``spans = (data, starts, lengths)``. ``scratch``: holds the
    scores (the mask is new)."""
    num = np.bincount(user_index, minlength=len(users))
    big = np.flatnonzero(num > max_items)
    if not len(big):
        return None
    owner = np.asarray(user_index, np.int64)
    if 2 * int(num[big].sum()) >= len(owner):
        # most pairs are the big users': score every pair in place (no gathered copies);
        # the other users keep all their pairs whatever their (unkeyed) scores
        data, starts, lengths = spans
        k0, k1 = _user_key_arrays(users, big, sample_key)
        scores = item_scores(k0, k1, data, starts, lengths, prefix=STR_TAG, owner=owner,
                             out=work_array(scratch, "scores", len(owner), np.uint64))
        keep = _smallest_distinct(owner, scores, max_items)
    else:
        pairs, pu, scores = _big_user_scores(users, spans, owner, None, big, sample_key)
        keep = np.ones(len(owner), dtype=bool)
        keep[pairs] = _smallest_distinct(pu, scores, max_items)
    return None if keep.all() else keep


def _is_sorted(a: np.ndarray) -> bool:
    """Whether ``a`` is in non-decreasing order (the compiled check when loaded)."""
    kernel = compiled.kernel("is_sorted", len(a))
    if kernel is not None:
        return bool(kernel(a))
    return len(a) < 2 or bool((a[1:] >= a[:-1]).all())


def _smallest_distinct(owner: np.ndarray, scores: np.ndarray, max_items: int) -> np.ndarray:
    """Whether each element's score is among the ``max_items`` smallest distinct
    scores of its owner's (a repeated item: one score; ties share a rank). The
    compiled kernel when ``owner`` is sorted (as the presample passes it: pairs in
    user order), else one sort by owner, then score. ``max_items`` >= 1."""
    if max_items < 1:
        raise ValueError(f"max_items must be at least 1; got {max_items}")
    kernel = compiled.kernel("smallest_distinct", len(owner))
    if kernel is not None and _is_sorted(owner):
        return kernel(owner, scores, max_items, empty(len(owner), np.bool_))
    order = owner_score_order(owner, scores)  # by owner, then score
    ss = scores[order]
    # rank among the owner's distinct scores, 0 = smallest
    rank = ranks_in_runs(owner[order], np.r_[True, ss[1:] != ss[:-1]])
    keep = np.empty(len(owner), dtype=bool)
    keep[order] = rank < max_items
    return keep


def _big_user_scores(users: pa.Array, spans, u: np.ndarray,
                     i: Optional[np.ndarray], big: np.ndarray, sample_key: bytes):
    """The sampler's scores of the pairs of the users ``big``: ``(pairs, owners,
    scores)``, the positions of those pairs, their users and the keyed scores
    ``sample_items`` gives them (SipHash-2-4 of the item under the user's own key).
    Pair k is ``(users[u[k]], item i[k])`` (item k when ``i`` is None); item j is
    ``data[starts[j]:starts[j] + lengths[j]]`` of ``spans = (data, starts, lengths)``."""
    k0, k1 = _user_key_arrays(users, big, sample_key)
    is_big = np.zeros(len(users), dtype=bool)
    is_big[big] = True
    pairs = np.flatnonzero(is_big[u])
    data, starts, lengths = spans
    pu, pi = u[pairs], (pairs if i is None else i[pairs])
    return pairs, pu, item_scores(k0, k1, data, starts[pi], lengths[pi], prefix=STR_TAG,
                                  owner=pu)


def _user_key_arrays(users: pa.Array, big: np.ndarray, sample_key: bytes):
    """``(k0, k1)``: the halves of the sampler's key of each user of ``big``
    (``user_keys``), indexed like ``users``; 0 for the other users."""
    k0, k1 = np.zeros(len(users), np.uint64), np.zeros(len(users), np.uint64)
    k0[big], k1[big] = user_keys(sampling_keys(sample_key),
                                 *string_spans(users.take(pa.array(big))), prefix=STR_TAG)
    return k0, k1


def sample_big_users(users, items, u, i, big, max_items, sample_key, keep):
    """Marks in ``keep`` the pairs of the users ``big`` that ``sample_items`` keeps:
    the Δ0 items of smallest score under the user's own key, computed for all
    their pairs at once."""
    pairs, pu, scores = _big_user_scores(users, string_spans(items), u, i, big, sample_key)
    kept, tied = smallest_scores(pu, scores, max_items)
    keep[pairs] = kept
    for user in tied.tolist():  # a tie at the cut (p ≈ n²/2^65): sample_items settles it
        mine = pairs[pu == user]
        names = items.take(pa.array(i[mine])).to_pylist()
        kept = sample_items(users[user].as_py(), dict.fromkeys(names, 1), max_items,
                            sample_key)
        keep[mine] = [name in kept for name in names]
    return keep
