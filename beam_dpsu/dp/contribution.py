"""Contribution bounding as pure functions: per-user item counts and keyed sampling to Δ0.

The per-user representation used throughout the library is
``{user_id: {item: count}}``: each user's distinct items with how often the
user has each (``C_i[u]`` of the specification).

``sample_items`` keeps, for a user with more than Δ0 distinct items, a
uniformly random subset of Δ0 of them drawn by a generator seeded with
``HMAC(key, user)``: the same subset on every retry and on every runner.
The Beam transforms over these functions are in
``beam_dpsu.transforms.bounding``.
"""
from __future__ import annotations

import pickle
import zlib
from typing import Any, Dict, Hashable, Iterable, Tuple

from beam_dpsu.dp.noise import encode_value, keyed_generator

__all__ = ["ItemCounts", "DEFAULT_FLUSH_PAIRS", "DEFAULT_USER_GROUPS", "user_group", "pack_by",
           "canonical_items", "sample_items", "merge_item_counts", "per_user_counts"]


ItemCounts = Dict[Hashable, int]





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


def sample_items(user_id: Any, counts: ItemCounts, max_items: int, key: bytes) -> ItemCounts:
    """At most ``max_items`` of a user's distinct items, a uniformly random subset.

    A user with at most Δ0 items keeps all of them. Otherwise the user's items
    are put in canonical order and a generator seeded with
    ``HMAC(key, user_id)`` draws Δ0 of them without replacement. The choice
    depends only on the key, the user id and the user's item set, never on
    other users, on the order of ``counts`` or on how a runner split the work;
    a retry draws the same subset.

    Args:
      user_id: the user (any hashable; encoded with ``noise.encode_value``).
      counts: ``{item: count}`` of that user.
      max_items: Δ0 ≥ 1.
      key: the sampling key, ``RunKey.subkey('sample/<round>')``.
    Returns:
      ``{item: count}`` restricted to the kept items.
    """
    n = len(counts)
    if n <= max_items:
        return counts
    items = canonical_items(counts)
    rng = keyed_generator(key, encode_value(user_id))
    chosen = rng.choice(n, size=max_items, replace=False)
    return {items[i]: counts[items[i]] for i in chosen.tolist()}


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
    """``(user_id, item)`` occurrences → ``{user_id: {item: count}}`` (None dropped).

    Each user's dict iterates in the order the user's items first occur (the
    record order that ``needs_record_order`` mechanisms read).
    """
    out: Dict[Any, ItemCounts] = {}
    for user, item in occurrences:
        if user is None or item is None:
            continue
        counts = out.get(user)
        if counts is None:
            counts = out[user] = {}
        counts[item] = counts.get(item, 0) + 1
    return out
