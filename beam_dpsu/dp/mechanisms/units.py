"""What each number of a public JSON summary means: units, scale, round.

``describe()`` of every mechanism (and so each pipeline's ``PREFIX.json``)
carries ``units``, a ``{field: meaning}`` dict, and the set-union mechanisms a
``threshold_meaning`` sentence that turns the threshold into numbers of users.
The threshold and the noise scale are on the scale of the mechanism's
histogram, which for the weighted and policy mechanisms is NOT a number of
users: T = 24.6 does not mean "about 25 users".
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

__all__ = ["SCALES", "threshold_meaning", "set_union_units", "topk_units", "peeling_units"]


#: What one user adds to the histogram, per weighting of ``RoundCalibration``.
SCALES = {
    "count": "user count: each user adds 1 to each of the (at most Δ0) items it keeps, so an "
             "item's value is the number of users holding it",
    "l1": "weighted histogram (L1): a user adds weights summing to at most 1 over the items it "
          "keeps (1/n to each of n items), so an item's value is at most, and usually far "
          "below, the number of users holding it",
    "l2": "weighted histogram (L2): a user adds weights of L2 norm at most 1 (1/√n to each of "
          "n items), so an item's value is at most, and usually below, the number of users "
          "holding it",
}

_NOISE = {"gaussian": "standard deviation σ of the Gaussian noise",
          "laplace": "scale λ of the Laplace noise (standard deviation λ√2)",
          "truncated-geometric": "none (the truncated geometric keeps an item with n users "
                                 "with probability p(n); no additive noise)"}


#: The ``max_items_choice`` field of ``--max-items-per-user auto``.
MAX_ITEMS_CHOICE = ("Δ0 chosen from a DP estimate of the users' activity (the users counted "
                    "by their number of distinct items): share, the share of epsilon (of rho "
                    "with --rho) it spent; epsilon, the ε of that estimate; rule, how Δ0 follows from it; "
                    "max_items_per_user, the Δ0 chosen. epsilon and delta above are the "
                    "whole run's, estimate and release together; the estimate itself is "
                    "never stated")


def _users_needed(threshold: float, weighting: str, max_items: Optional[int],
                  policy: bool) -> str:
    single = math.ceil(threshold)
    if weighting == "count":
        return f"about {single} users holding the item"
    if policy or not max_items:
        return (f"{single} users who hold only this item, and more when users hold "
                f"several items")
    per_user = 1.0 / (max_items if weighting == "l1" else math.sqrt(max_items))
    many = math.ceil(threshold / per_user)
    return (f"{single} users who hold only this item, or {many} users who each hold "
            f"Δ0 = {max_items} items")


def threshold_meaning(rounds: List[Any], policy: bool = False) -> str:
    """One sentence: what the threshold(s) of ``rounds`` mean in numbers of users.

    Args:
      rounds: the mechanism's ``RoundCalibration`` list (threshold, noise,
        weighting, max_items of each round).
      policy: True for the policy mechanisms (a user's weight goes to its items
        still below the cutoff, not 1/n to each).
    """
    first = rounds[0]
    if first.threshold is None:
        return ("no threshold (a number of users decides): the truncated geometric keeps an "
                "item held by n users with a probability p(n) that grows with n, tiny for few "
                "users")
    scale = SCALES[first.weighting].split(":")[0]
    parts = []
    for i, r in enumerate(rounds):
        which = f"round {i}: " if len(rounds) > 1 else ""
        parts.append(f"{which}T = {r.threshold:.4g} is reached by "
                     f"{_users_needed(r.threshold, r.weighting, r.max_items, policy)}")
    unit = ("a number of users" if first.weighting == "count" else
            "NOT a number of users")
    return (f"an item is released when its noisy value on the {scale} scale exceeds the "
            f"threshold T ({unit}); " + "; ".join(parts) + " (before noise)")


def set_union_units(rounds: List[Any], policy: bool = False) -> Dict[str, str]:
    """``{field: meaning}`` for the fields of a set-union mechanism's summary."""
    first = rounds[0]
    scale = SCALES[first.weighting]
    many = len(rounds) > 1
    noise = _NOISE.get(first.noise, first.noise)
    units = {
        "epsilon": "ε of the (ε, δ)-differential-privacy guarantee of the whole release "
                   "(all rounds), per user",
        "delta": "δ of that guarantee (a probability)",
        "rho": "ρ of the ρ-zCDP guarantee, for zCDP-calibrated mechanisms (else null)",
        "zcdp_delta": "δ of the approximate zCDP guarantee (else null)",
        "threshold": ("list, one per round in order: " if many else "list of one: ") +
                     "the threshold T on the histogram scale (" + scale + ")",
        "noise_scale": ("list, one per round: " if many else "") + noise +
                       " added to each item's value, on the same scale as threshold",
        "max_items_per_user": "Δ0: the most distinct items one user contributes (items; "
                              "PipelineDP's max_partitions_contributed)",
        "num_released": "number of items in the items file",
    }
    if policy:
        units["cutoff"] = ("Γ = T + α·noise scale, on the threshold's scale: a user stops "
                           "adding weight to an item once its value reaches Γ")
        units["alpha"] = "α: the cutoff multiplier (dimensionless)"
    if many:
        units["per_round"] = ("one entry per round, in order: its ρ and δ, sigma (Gaussian "
                              "standard deviation) and threshold on the threshold's scale, "
                              "and released: the items released by that round")
    return units


def topk_units(with_counts: bool) -> Dict[str, str]:
    """``{field: meaning}`` for a top-k summary (``TopKMechanism.describe``)."""
    return {
        "algorithm": "1: Laplace with noisy counts, 2: Gumbel without counts (Durfee and "
                     "Rogers)",
        "k": "the most items released", "k_bar": "k̄: candidates (the true top k̄ are noised)",
        "epsilon": "ε of the stand-alone (ε, δ)-DP guarantee of the whole query",
        "delta": "δ of that guarantee",
        "epsilon_per_selection": "ε of one selection (Algorithm 2; null with counts)",
        "max_items_per_user": "Δ: the most distinct items one user contributes",
        "noise_scale": ("scale of the Laplace noise added to each user count"
                        if with_counts else "scale β of the Gumbel noise added to each user "
                        "count") + " (in users)",
        "threshold_offset": "in users: added to the (k̄+1)-th count to form the noisy "
                            "threshold an item's noisy count must beat",
        "num_released": "number of items in the items file (at most k)",
        "charge": "what the query costs under pay-what-you-get composition",
    }


def peeling_units() -> Dict[str, str]:
    """``{field: meaning}`` for a discovery-then-peel summary (top-k or hitting set)."""
    return {
        "epsilon": "ε of the (ε, δ)-DP guarantee of the whole release (both stages)",
        "delta": "δ of that guarantee",
        "k": "the most items released",
        "max_items_per_user": "Δ0 of the discovery stage: the most distinct items one user "
                              "contributes to it (the peeling stage counts every item)",
        "discovery_share": "the fraction of ε and of δ spent on discovering the domain",
        "discovery": "the Weighted Gaussian stage that discovers the domain: its ε, δ, "
                     "threshold and noise scale (on the weighted-count scale)",
        "peeling": "the known-domain stage: its ε and δ, the ε of each selection, and the "
                   "scale of the Gumbel noise added to each user count (in users)",
    }
