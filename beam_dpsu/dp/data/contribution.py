"""Contribution bounding as pure functions: per-user item counts and keyed sampling to Δ0.

The per-user representation used throughout the library is
``{user_id: {item: count}}``: each user's distinct items with how often the
user has each (``C_i[u]`` of the specification).

``sample_items`` keeps, for a user with more than Δ0 distinct items, a
uniformly random subset of Δ0 of them: those of smallest keyed score
(SipHash-2-4 under a key of the user's own, derived from the run key and the
user id), the same subset on every retry and on every runner.
The Beam transforms over these functions are in
``beam_dpsu.transforms.bounding``.

User ids and items are ``str``, ``bytes``, ``int`` or tuples of these
(``canonical_id``, which ``per_user_counts`` and the Beam transforms apply):
for these, Python equality, which groups users and items, is exactly the
identity of the keyed hashes (``noise.encode_value``); other types are
refused (``docs/mechanisms.md`` section 1).
"""
from __future__ import annotations

import hashlib
import pickle
import zlib
from typing import Any, Dict, Hashable, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from beam_dpsu.dp.randomness.noise import canonical_spans, encode_value
from beam_dpsu.dp.randomness.siphash import siphash24_many, siphash24_many_keys

__all__ = ["ItemCounts", "DEFAULT_FLUSH_PAIRS", "DEFAULT_USER_GROUPS", "user_group", "pack_by",
           "canonical_items", "sampling_keys", "user_keys", "item_scores", "sample_items",
           "sample_many", "owner_score_order", "ranks_in_runs", "smallest_scores", "merge_item_counts",
           "per_user_counts",
           "IdTypeError", "ID_TYPES", "MAX_INT_ID_DIGITS", "canonical_id", "canonical_pair",
           "canonical_counts", "canonical_user_counts", "canonical_per_user"]


ItemCounts = Dict[Hashable, int]


# ---------------------------------------------------------------------------
# Exact identity of user ids and items.
# ---------------------------------------------------------------------------

#: What user ids and items may be (the text of the error that refuses anything else).
ID_TYPES = ("str, bytes, int (numpy integers are converted to the equal int) or a tuple of "
            "these")

#: An int user id or item has at most this many decimal digits: its keyed hashes use its
#: decimal text, which Python may refuse to make beyond 640 digits
#: (``sys.set_int_max_str_digits``).
MAX_INT_ID_DIGITS = 600
_INT_LIMIT = 10 ** MAX_INT_ID_DIGITS


class IdTypeError(TypeError, ValueError):
    """A user id or an item of a type the library refuses (``canonical_id``).

    A ``TypeError`` and a ``ValueError``: catch either."""


def canonical_id(value: Any, what: str = "user id") -> Any:
    """The exact identity of a user id or an item: ``value`` itself, or its plain form.

    The rule: user ids and items are ``str``, ``bytes``, ``int`` or tuples of
    these (recursively). Within these types two values are equal in Python
    exactly when their canonical bytes (``noise.encode_value``), which key
    every hash and noise draw, are equal; so grouping users and items by
    Python equality (dicts, Beam's shuffles) merges exactly the values the
    hashes treat as one. Converted to the equal plain value (same bytes):
    numpy integers and other subclasses of ``int`` (not ``bool``) → ``int``;
    subclasses of ``str`` (``numpy.str_``) and ``bytes`` → ``str``, ``bytes``;
    subclasses of ``tuple`` (named tuples) → ``tuple``. Refused with an
    ``IdTypeError`` naming the type: ``bool``, ``float`` (and numpy's),
    ``None`` and every other type, because Python treats ``1``, ``1.0`` and
    ``True`` as one dict key while the hashes tell them apart (one added user
    ``True`` would otherwise merge into user ``1``); and ints of more than
    ``MAX_INT_ID_DIGITS`` decimal digits. The error names the type, never the
    value (which is private data).

    Args:
      value: the user id or item.
      what: ``'user id'`` or ``'item'``, for the error message.
    """
    t = type(value)
    if t is str or t is bytes:
        return value
    if t is int:
        if -_INT_LIMIT < value < _INT_LIMIT:
            return value
        raise IdTypeError(f"{_a(what)} of type int has more than {MAX_INT_ID_DIGITS} decimal "
                          f"digits, which is not accepted; convert the ids to str first")
    if t is tuple:
        for element in value:
            if type(element) is not str:
                return tuple(canonical_id(e, _in_tuple(what)) for e in value)
        return value
    return _canonical_other(value, what)


def _a(what: str) -> str:
    return ("an " if what.startswith("item") else "a ") + what


def _in_tuple(what: str) -> str:
    return what if what.endswith(" element") else f"{what} (a tuple) holding an element"


def _canonical_other(value: Any, what: str) -> Any:
    if isinstance(value, (bool, np.bool_)):
        pass
    elif isinstance(value, str):
        return str.__str__(value)
    elif isinstance(value, bytes):
        return bytes(memoryview(value))
    elif isinstance(value, (int, np.integer)):
        return canonical_id(int.__int__(value) if isinstance(value, int) else int(value), what)
    elif isinstance(value, tuple):
        return tuple(canonical_id(e, _in_tuple(what)) for e in value)
    t = type(value)
    name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    raise IdTypeError(
        f"{_a(what)} of type {name} is not accepted: user ids and items must be {ID_TYPES} "
        f"(bool, float and None are refused because Python treats 1, 1.0 and True as one "
        f"key while the keyed hashes tell them apart); convert them first, e.g. with str()")


def canonical_pair(pair) -> Tuple[Any, Any]:
    """``(user_id, item)`` → the same pair as a tuple of ``canonical_id`` values (the pair
    itself when both are ``str``); raises ``IdTypeError`` for a refused type."""
    user, item = pair
    if type(user) is str and type(item) is str:
        return pair if type(pair) is tuple else (user, item)
    return canonical_id(user, "user id"), canonical_id(item, "item")


_STR_ONLY = {str}


def canonical_counts(counts: Mapping[Any, int]) -> ItemCounts:
    """A user's ``{item: count}`` with every item ``canonical_id`` (the dict itself when
    all items are ``str``); two items with one canonical form are summed. Raises
    ``IdTypeError`` for a refused item type."""
    if set(map(type, counts)) <= _STR_ONLY:
        return counts
    out: ItemCounts = {}
    for item, c in counts.items():
        item = canonical_id(item, "item")
        out[item] = out.get(item, 0) + c
    return out


def canonical_user_counts(element) -> Tuple[Any, ItemCounts]:
    """``(user_id, {item: count})`` with a ``canonical_id`` user and ``canonical_counts``."""
    user, counts = element
    if type(user) is not str:
        user = canonical_id(user, "user id")
    return user, canonical_counts(counts)


def canonical_per_user(per_user: Mapping[Any, Mapping[Any, int]]) -> Dict[Any, ItemCounts]:
    """``{user_id: {item: count}}`` with canonical user ids and items (``per_user`` itself
    when nothing changes). Raises ``IdTypeError`` for a refused type, and ValueError
    when two user ids have one canonical form (two keys of the mapping that are the
    same user: a mapping built with a custom equality)."""
    out: Dict[Any, ItemCounts] = {}
    changed = False
    for user, counts in per_user.items():
        cu, cc = canonical_user_counts((user, counts))
        changed = changed or cu is not user or cc is not counts
        if cu in out:
            raise ValueError("two user ids of the input have the same canonical form "
                             "(canonical_id): the mapping holds one user twice")
        out[cu] = cc
    return out if changed else per_user  # type: ignore[return-value]


# A bundle's partial aggregate is flushed when it holds this many (user, item) pairs.
DEFAULT_FLUSH_PAIRS = 1_000_000


#: Users per group is (users / DEFAULT_USER_GROUPS) where users are batched for a
#: runner that drops ``finish_bundle`` outputs (``GroupUsers``).
DEFAULT_USER_GROUPS = 256


# CRC32 seeded with a tag, so that the groups are not those of a plain CRC32 of the
# user id, which an upstream job may already have partitioned its files by.
_CRC_USER_TAG = zlib.crc32(b"beam_dpsu/user-group")


def user_group(user: Any, groups: int) -> int:
    """The group in [0, groups) of a user id: a tagged CRC32 of its UTF-8 bytes (a str
    id) or of its canonical bytes (``noise.encode_value``). Grouping only batches
    users for a shuffle: it has no privacy role, and every record of a user lands
    in one group."""
    if type(user) is str:
        return zlib.crc32(user.encode("utf-8", "surrogatepass"), _CRC_USER_TAG) % groups
    return zlib.crc32(encode_value(user), _CRC_USER_TAG) % groups


def pack_by(entries: Dict[Any, Any], part_of) -> Iterable[Tuple[int, bytes]]:
    """``{key: value}`` → ``(part_of(key), pickled {key: value} of that part)`` for each
    non-empty part: a dict as a few opaque elements, which a runner's shuffle moves
    and groups without decoding their entries (the readers' users by group, partial
    histograms by pack of shards)."""
    parts: Dict[int, Dict[Any, Any]] = {}
    for key, value in entries.items():
        p = part_of(key)
        part = parts.get(p)
        if part is None:
            parts[p] = {key: value}
        else:
            part[key] = value
    for p, part in parts.items():
        yield p, pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)


def canonical_items(items) -> list:
    """The items in an order that depends only on the items themselves.

    Sorted by value when the items are mutually comparable (e.g. all strings),
    otherwise by their canonical bytes (``noise.encode_value``).
    """
    try:
        return sorted(items)
    except TypeError:
        return sorted(items, key=encode_value)


def sampling_keys(key: bytes) -> Tuple[bytes, bytes]:
    """The two 16-byte SipHash keys of the sampler, derived from a sampling key
    (``RunKey.subkey('sample/<round>')``) with keyed BLAKE2b."""
    k = hashlib.blake2b(b"beam_dpsu/sample", key=key[:64], digest_size=32).digest()
    return k[:16], k[16:]


def user_keys(keys: Tuple[bytes, bytes], data, starts, lengths, prefix=None):
    """Each user's own 128-bit sampling key ``(k0, k1)`` (two uint64 arrays): SipHash-2-4
    of the user's canonical bytes (``data[starts[i]:starts[i] + lengths[i]]``, after
    the one-byte ``prefix`` when given) under the two keys of ``sampling_keys``."""
    return (siphash24_many(keys[0], data, starts, lengths, prefix),
            siphash24_many(keys[1], data, starts, lengths, prefix))


def item_scores(k0, k1, data, starts, lengths, prefix=None, owner=None, out=None
                ) -> np.ndarray:
    """The sampling score of each (user, item) pair: SipHash-2-4 of the item's canonical
    bytes under its user's key ``(k0[i], k1[i])`` (``user_keys``), or, with ``owner``,
    ``(k0[owner[i]], k1[owner[i]])`` (keys per user, pair i of user ``owner[i]``).
    ``out``: an array to write the scores to (``siphash24_many_keys``)."""
    return siphash24_many_keys(k0, k1, data, starts, lengths, prefix, owner, out)


def sample_items(user_id: Any, counts: ItemCounts, max_items: int, key: bytes) -> ItemCounts:
    """At most ``max_items`` of a user's distinct items, a uniformly random subset.

    A user with at most Δ0 items keeps all of them. Otherwise each item gets a
    score, SipHash-2-4 of the item's canonical bytes (``noise.encode_value``)
    under the user's own key (``user_keys``: SipHash-2-4 of the user id under
    two keys derived from ``key``), and the user keeps the Δ0 items of
    smallest score (ties, of probability about n²/2^65, by canonical bytes).
    The choice is a keyed pseudo-random function of the key, the user id and
    the user's item set only, never of other users, of the order of ``counts``
    or of how a runner split the work; a retry keeps the same subset.
    ``sample_many`` computes the same for many users at once (one vectorised
    pass, far cheaper per user), as does the columnar path (``dp.data.columnar``).

    Args:
      user_id: the user (encoded with ``noise.encode_value``).
      counts: ``{item: count}`` of that user.
      max_items: Δ0 ≥ 1.
      key: the sampling key, ``RunKey.subkey('sample/<round>')``.
    Returns:
      ``{item: count}`` restricted to the kept items (in the order of ``counts``).
    """
    return sample_many([(user_id, counts)], max_items, key)[0]


def sample_many(users: Sequence[Tuple[Any, ItemCounts]], max_items: int,
                key: bytes) -> List[ItemCounts]:
    """``sample_items`` of every ``(user_id, counts)`` of ``users`` (in order), with the
    scores of all users above Δ0 computed in one vectorised pass."""
    out: List[ItemCounts] = [counts for _, counts in users]
    big = [k for k, (_, counts) in enumerate(users) if len(counts) > max_items]
    if not big:
        return out
    user_data, user_starts, user_lengths, user_prefix, _ = canonical_spans(
        [users[k][0] for k in big])
    k0, k1 = user_keys(sampling_keys(key), user_data, user_starts, user_lengths, user_prefix)
    items = [list(users[k][1]) for k in big]
    sizes = np.fromiter(map(len, items), np.int64, len(items))
    data, starts, lengths, prefix, encoded = canonical_spans([x for mine in items for x in mine])
    scores = item_scores(np.repeat(k0, sizes), np.repeat(k1, sizes), data, starts, lengths,
                         prefix)
    keep, tied = smallest_scores(np.repeat(np.arange(len(big)), sizes), scores, max_items)
    first = np.zeros(len(big) + 1, np.int64)
    np.cumsum(sizes, out=first[1:])
    tied = set(tied.tolist())
    for j, k in enumerate(big):
        a, b = int(first[j]), int(first[j + 1])
        if j in tied:  # a tie at the cut: by canonical bytes
            s, enc = scores[a:b].tolist(), encoded[a:b]
            head = sorted(sorted(range(b - a), key=lambda i: (s[i], enc[i]))[:max_items])
        else:
            head = np.flatnonzero(keep[a:b]).tolist()
        counts, names = users[k][1], items[j]
        out[k] = {names[i]: counts[names[i]] for i in head}
    return out


def owner_score_order(owner: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``np.lexsort((scores, owner))`` (by owner, then score, then position), computed
    with one stable sort of a 64-bit key when ``owner`` is sorted (as the samplers pass
    it): the owner's rank in the high bits and the score's high bits below it, so that
    equal keys stay in position order (a user's repeated item, many in pairs as they
    come, is one run of equal keys), then the rare runs whose scores differ in the low
    bits re-sorted exactly, all in one ``lexsort``."""
    n = len(owner)
    if n < 2 or not (owner[1:] >= owner[:-1]).all():
        return np.lexsort((scores, owner))
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(owner[1:], owner[:-1], out=first[1:])
    rank = np.cumsum(first, dtype=np.int64) - 1
    bits = int(rank[-1]).bit_length()
    if bits > 32:
        return np.lexsort((scores, owner))
    scores = scores.astype(np.uint64, copy=False)
    key = scores if bits == 0 else ((rank.astype(np.uint64) << np.uint64(64 - bits))
                                    | (scores >> np.uint64(bits)))
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    same = np.flatnonzero(ordered[1:] == ordered[:-1])  # order[j], order[j+1] share a key
    if len(same) and (scores[order[same]] != scores[order[same + 1]]).any():
        tied = np.zeros(n, dtype=bool)
        tied[same] = True
        tied[same + 1] = True
        at = np.flatnonzero(tied)
        run = np.cumsum(np.r_[True, (at[1:] != at[:-1] + 1)
                              | (ordered[at[1:]] != ordered[at[:-1]])])
        members = order[at]  # in position order within each run: a stable lexsort keeps it
        order[at] = members[np.lexsort((scores[members], run))]
    return order


def ranks_in_runs(owner: np.ndarray, steps: Optional[np.ndarray] = None) -> np.ndarray:
    """For an array sorted by ``owner``: each element's rank among its owner's, from
    0. ``steps``: a boolean array, True where an element counts as a new rank (an
    owner's first element always does); default every element (its position)."""
    n = len(owner)
    first = np.ones(n, dtype=bool)
    np.not_equal(owner[1:], owner[:-1], out=first[1:])
    count = np.arange(n) if steps is None else np.cumsum(first | steps) - 1
    return count - np.maximum.accumulate(np.where(first, count, 0))


def smallest_scores(owner: np.ndarray, scores: np.ndarray, max_items: int):
    """The sampler's rule on many users' pairs at once: ``(keep, tied)``, ``keep[p]``
    True for the ``max_items`` pairs of smallest score of each owner (user), and
    ``tied`` the owners whose ``max_items``-th and next scores are equal (probability
    about n²/2^65), whose choice the caller settles by canonical bytes."""
    order = owner_score_order(owner, scores)  # by owner, then score
    so, ss = owner[order], scores[order]
    first = np.r_[True, so[1:] != so[:-1]]
    rank = ranks_in_runs(so)
    keep = np.zeros(len(order), dtype=bool)
    keep[order[rank < max_items]] = True
    cut = np.flatnonzero((rank[1:] == max_items) & ~first[1:] & (ss[1:] == ss[:-1]))
    return keep, np.unique(so[cut + 1])


def merge_item_counts(parts: Iterable[ItemCounts]) -> ItemCounts:
    """Adds several ``{item: count}`` dicts (the merge of per-bundle partials)."""
    merged: ItemCounts = {}
    for part in parts:
        if not merged:
            merged = dict(part)
            continue
        if len(part) > len(merged):
            merged, part = dict(part), merged
        get = merged.get
        for item, c in part.items():
            merged[item] = get(item, 0) + c
    return merged


def per_user_counts(occurrences: Iterable[Tuple[Hashable, Hashable]]) -> Dict[Any, ItemCounts]:
    """``(user_id, item)`` occurrences → ``{user_id: {item: count}}``.

    Each user's dict iterates in the order the user's items first occur (the
    record order that ``needs_record_order`` mechanisms read).

    User ids and items must be ``str``, ``bytes``, ``int`` or tuples of these
    (``canonical_id``: numpy integers become the equal ``int``; ``bool``,
    ``float``, ``None`` and any other type raise ``IdTypeError``, naming the
    type). Privacy: this makes a user's identity exact, so that an added user
    ``True`` can never merge into user ``1`` (the neighbouring-dataset
    relation the guarantees assume; ``docs/mechanisms.md`` section 1).
    """
    out: Dict[Any, ItemCounts] = {}
    for user, item in occurrences:
        if type(user) is not str:
            user = canonical_id(user, "user id")
        if type(item) is not str:
            item = canonical_id(item, "item")
        counts = out.get(user)
        if counts is None:
            counts = out[user] = {}
        counts[item] = counts.get(item, 0) + 1
    return out
