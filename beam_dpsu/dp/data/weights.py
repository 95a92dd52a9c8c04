"""Histogram weights as pure functions: what each user adds to each of their items.

``user_weight`` gives the weight a user with ``n`` kept items adds to each of
them (``'count'``: 1, ``'l1'``: 1/n, ``'l2'``: 1/√n); ``add_user_to_histogram``
adds one user to an in-memory histogram. Items are sharded (``item_shard``)
only to spread the work of the Beam transforms over these functions
(``beam_dpsu.transforms.histogram``); sharding has no privacy role.
"""
from __future__ import annotations

import math
import zlib
from typing import Any, Dict

from beam_dpsu.dp.data.contribution import pack_by
from beam_dpsu.dp.randomness.noise import encode_value


__all__ = ["DEFAULT_NUM_SHARDS", "WEIGHTINGS", "check_weighting", "user_weight",
           "add_user_to_histogram", "item_shard", "shard_histogram", "SHARDS_PER_PACK",
           "shard_pack", "packed_shards"]


DEFAULT_NUM_SHARDS = 1024


# weighting name -> (what each of the n kept items of a user receives, its norm)
WEIGHTINGS = {
    "count": "1 to each kept item (ℓ∞-bounded; ℓ1 and ℓ2 norms grow with Δ0)",
    "l1": "1/n to each of the n kept items (ℓ1 norm 1)",
    "l2": "1/√n to each of the n kept items (ℓ2 norm 1)",
}


def check_weighting(weighting: str) -> str:
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {sorted(WEIGHTINGS)}, got {weighting!r}")
    return weighting


def user_weight(num_items: int, weighting: str) -> float:
    """The weight a user with ``num_items`` kept items adds to each of them.

    ``'count'``: 1; ``'l1'``: 1/n; ``'l2'``: 1/√n. ``num_items`` must be ≥ 1.
    """
    if num_items < 1:
        raise ValueError(f"a contributing user has at least one item, got {num_items!r}")
    if weighting == "count":
        return 1.0
    if weighting == "l1":
        return 1.0 / num_items
    if weighting == "l2":
        return 1.0 / math.sqrt(num_items)
    raise ValueError(f"weighting must be one of {sorted(WEIGHTINGS)}, got {weighting!r}")


def add_user_to_histogram(histogram: Dict[Any, float], items, weighting: str) -> None:
    """Adds one user's contribution (``items``: their kept distinct items) in place."""
    n = len(items)
    if n == 0:
        return
    w = user_weight(n, weighting)
    get = histogram.get
    for item in items:
        histogram[item] = get(item, 0.0) + w


# CRC32 of the type tag of a string's canonical bytes (``encode_value``): the
# CRC of ``b"s" + utf8`` is ``crc32(utf8, _CRC_STR_TAG)``.
_CRC_STR_TAG = zlib.crc32(b"s")


def item_shard(item: Any, num_shards: int) -> int:
    """A deterministic shard in [0, num_shards) of an item (CRC32 of its canonical bytes).

    Sharding only groups items for efficiency; it has no privacy role.
    """
    if type(item) is str:
        return zlib.crc32(item.encode("utf-8", "surrogatepass"), _CRC_STR_TAG) % num_shards
    return zlib.crc32(encode_value(item)) % num_shards


def shard_histogram(hist: Dict[Any, float], num_shards: int) -> Dict[int, Dict[Any, float]]:
    """Splits ``{item: weight}`` into ``{shard: {item: weight}}`` (shards by ``item_shard``)."""
    out: Dict[int, Dict[Any, float]] = {}
    crc, tag = zlib.crc32, _CRC_STR_TAG
    for item, w in hist.items():
        if type(item) is str:
            s = crc(item.encode("utf-8", "surrogatepass"), tag) % num_shards
        else:
            s = crc(encode_value(item)) % num_shards
        part = out.get(s)
        if part is None:
            out[s] = {item: w}
        else:
            part[item] = w
    return out


#: ``packed_shards`` packs this many shards into one shuffle element.
SHARDS_PER_PACK = 16


def shard_pack(shard: int) -> int:
    """The pack (shuffle key) of a shard: ``shard // SHARDS_PER_PACK``."""
    return shard // SHARDS_PER_PACK


def packed_shards(hist: Dict[Any, float], num_shards: int):
    """A partial histogram as ``(pack, pickled {shard: {item: weight}})`` elements, one per
    non-empty pack of ``SHARDS_PER_PACK`` shards (``shard_pack``): a few opaque
    elements, which a runner's shuffle moves without decoding their items
    (``SumPackedShards`` unpacks and adds them). With many partials (Dask: one per
    user group) a pack per shard would make groups × shards elements."""
    return pack_by(shard_histogram(hist, num_shards), shard_pack)
