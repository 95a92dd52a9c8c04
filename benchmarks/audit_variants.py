"""The auditor's test material: deliberately broken variants and standard configurations.

NOT PRIVATE, on purpose. Each broken variant differs from a real mechanism
in one bug only, so that ``tests/test_audit.py`` and
``benchmarks/audit_all.py`` can show that the auditor (``beam_dpsu.dp.evaluation.audit``)
catches it:

* ``threshold-delta-x100``: T calibrated with 100·δ;
* ``zero-weight-keys``: items of a user that received weight 0 are kept as
  keys and noised;
* ``closest-to-cutoff-greedy``: GW whose users fill the items closest to Γ
  first, the non-private policy of Gopi et al.;
* ``exact-weight-buckets``: adaptive weighting whose heavy items are read from the
  exact weights (the rerouting whose indirect change is not bounded).

``standard_configs`` and ``BROKEN_CONFIGS`` are the configurations the CI
tests and ``benchmarks/audit_all.py`` audit. The auditor's command line
accepts ``--broken VARIANT`` only when it is given these variants
(``beam_dpsu.pipelines.audit.main(argv, broken=BROKEN)``, as ``python
benchmarks/audit_variants.py`` does). Never use any of this for a release.
"""
from __future__ import annotations

import copy
import dataclasses
import pathlib
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from beam_dpsu.dp.privacy import calibration as cal  # noqa: E402
from beam_dpsu.dp.mechanisms.base import Mechanism  # noqa: E402
import numpy as np  # noqa: E402

from beam_dpsu.dp.randomness.release_rules import NoisyThresholdRule  # noqa: E402


def threshold_delta_x100(mechanism: Mechanism) -> Mechanism:
    """BROKEN ON PURPOSE: the threshold T is computed with 100·δ (the claim keeps δ).

    A copy of ``mechanism`` whose only change is the threshold, from the
    mechanism's own calibration (``threshold_for``), and, for a sequential
    policy, the cutoff Γ = T + α·scale that follows from it.
    """
    g = mechanism.guarantee
    if len(mechanism.rounds) != 1 or mechanism.rounds[0].rho is not None:
        raise ValueError("threshold-delta-x100 applies to one-round (ε, δ) mechanisms")
    bad_delta = 100.0 * g.delta
    if not bad_delta < (0.5 if mechanism.name.startswith("gw") else 1.0):
        raise ValueError("threshold-delta-x100 needs --delta below 0.01 (0.005 for gw)")
    threshold = mechanism.threshold_for(g.epsilon, bad_delta)
    broken = copy.copy(mechanism)
    r = mechanism.rounds[0]
    broken.rounds = [dataclasses.replace(r, threshold=threshold)]
    if hasattr(mechanism, "cutoff"):
        broken.cutoff = cal.policy_cutoff(threshold, r.noise_scale, mechanism.alpha)
    broken.name = mechanism.name + "+threshold-delta-x100"
    return broken


class ZeroWeightKeys(Mechanism):
    """BROKEN ON PURPOSE: keeps every item a user holds as a key, even with weight 0.

    The histogram is computed by the real code (the mechanism's
    ``histogram_local``); the bug is that every item of every
    user then becomes a key (weight 0 if it received none: not sampled, or
    the user's budget ran out) and a zero-weight key is noised and released
    when its noise alone passes T, as in one public GW implementation. Each
    item only the canary holds then leaks with probability about δ·e^(−ε).
    """

    def __init__(self, inner: Mechanism):
        if len(inner.rounds) != 1 or inner.rounds[0].noise not in ("laplace", "gaussian"):
            raise ValueError("zero-weight-keys applies to one-round noisy-threshold mechanisms")
        self.inner = inner
        self.name = inner.name + "+zero-weight-keys"
        self.guarantee = inner.guarantee
        self.rounds = inner.rounds

    def run_local(self, per_user, run_key):
        inner = self.inner
        hist = inner.histogram_local(per_user, run_key)
        for counts in per_user.values():  # THE BUG: zero-weight keys are kept
            for item in counts:
                hist.setdefault(item, 0.0)
        rule: NoisyThresholdRule = inner.release_rule(run_key)
        items = list(hist)
        weights = np.array([hist[i] for i in items], np.float64)
        draw = rule.noise_values(items)
        # THE BUG: the zero-weight keys are noised (and released) like the others
        return {item for item, w, z in zip(items, weights, draw) if w + z > rule.threshold}


def _closest_policy_class():
    from beam_dpsu.dp.data import sequential

    class ClosestToCutoffGreedyPolicy(sequential.GreedyPolicy):
        """BROKEN ON PURPOSE: the greedy walk visits the items closest to Γ first.

        Identical to ``sequential.GreedyPolicy`` except that each user re-sorts
        their items by the current gap ``Γ − H[u]`` (ties in the real walk
        order) before the greedy fill: the choice ranks items by the histogram,
        which Gopi et al. show is not private (``docs/mechanisms.md`` section 4).
        """

        def update(self, hist, prepared):
            get, cutoff = hist.get, self.cutoff
            sequential.apply_greedy(
                hist, sorted(prepared, key=lambda i: cutoff - get(i, 0.0)), cutoff)

    return ClosestToCutoffGreedyPolicy


def closest_to_cutoff_greedy(mechanism: Mechanism) -> Mechanism:
    """BROKEN ON PURPOSE: GW (or GW-KT) with the closest-to-cutoff greedy policy."""
    if getattr(mechanism, "policy_name", "") not in ("greedy", "greedy-public"):
        raise ValueError("closest-to-cutoff-greedy applies to the greedy policies (gw, gw-kt)")
    cls = _closest_policy_class()
    real_policy = mechanism.policy
    broken = copy.copy(mechanism)

    def policy(run_key):
        p = real_policy(run_key)
        return cls(p.cutoff, run_key.subkey("item-order"), p.needs_public_counts)

    broken.policy = policy
    broken.name = mechanism.name + "+closest-to-cutoff-greedy"
    return broken


def exact_weight_buckets(mechanism: Mechanism) -> Mechanism:
    """BROKEN ON PURPOSE: adaptive weighting whose buckets come from the exact basic
    weights, not from the noisy estimate (the rerouting of ``docs/mechanisms.md`` section
    11.1). Everything else, the noisy estimate in the release statistic included, is the
    real mechanism's."""
    if not hasattr(mechanism, "estimate_levels"):
        raise ValueError("exact-weight-buckets applies to adaptive weighting")
    broken = copy.copy(mechanism)
    levels = np.asarray(mechanism.levels)

    def estimate(items, weights, run_key):
        noisy, _, first = mechanism.estimate(items, weights, run_key)
        weights = np.asarray(weights, np.float64)
        # THE BUG: the buckets read the exact weights
        return noisy, (weights[:, None] > levels[None, :]).sum(axis=1), first

    broken.estimate = estimate
    broken.name = mechanism.name + "+exact-weight-buckets"
    return broken


BROKEN: Dict[str, Callable[[Mechanism], Mechanism]] = {
    "threshold-delta-x100": threshold_delta_x100,
    "zero-weight-keys": ZeroWeightKeys,
    "closest-to-cutoff-greedy": closest_to_cutoff_greedy,
    "exact-weight-buckets": exact_weight_buckets,
}


# ---------------------------------------------------------------------------
# The configurations of the CI tests and of benchmarks/audit_all.py.
# ---------------------------------------------------------------------------

STANDARD_EPSILON, STANDARD_DELTA, STANDARD_RHO, STANDARD_MAX_ITEMS = 1.0, 1e-3, 0.1, 8
# Public counts for gw-kt that rank some scenario items first (public data may be anything).
STANDARD_PUBLIC_COUNTS = {"pile-a": 3, "near-1": 2, "canary-item-3": 5, "bg-b": 4}


def standard_configs(public_counts_path: Optional[str] = None) -> List[Tuple[str, Dict]]:
    """``(name, params)`` for every registered mechanism: ε = 1, δ = 1e-3, Δ0 = 8
    where they apply, plus the zCDP form (ρ = 0.1) of those that have one and,
    for those that take a ``tie_break``, a form with each tie-break other than the
    registry's default (``params.DEFAULT_TIE_BREAK``), so that every tie-break is
    audited.

    Mechanisms that need public counts are included when ``public_counts_path``
    is given (write ``STANDARD_PUBLIC_COUNTS`` there). Small Δ0 and moderate δ
    keep the scenarios small (tens of users) so that thousands of runs are cheap.
    """
    from beam_dpsu.dp.privacy.params import DEFAULT_TIE_BREAK
    from beam_dpsu.dp.mechanisms.registry import REGISTRY, make_mechanism
    from beam_dpsu.dp.data.sequential import TIE_BREAKS
    out = []
    for name in sorted(REGISTRY):
        accepts = REGISTRY[name].accepts
        base = {"delta": STANDARD_DELTA}
        if "max_items" in accepts:
            base["max_items"] = STANDARD_MAX_ITEMS
        if "public_counts" in accepts:
            if public_counts_path is None:
                continue
            base["public_counts"] = public_counts_path
        out.append((name, dict(base, epsilon=STANDARD_EPSILON)))
        if "tie_break" in accepts:
            out.extend((name, dict(base, epsilon=STANDARD_EPSILON, tie_break=other))
                       for other in TIE_BREAKS if other != DEFAULT_TIE_BREAK)
        if "rho" in accepts:
            try:
                make_mechanism(name, **dict(base, rho=STANDARD_RHO))
            except ValueError:
                continue
            out.append((name, dict(base, rho=STANDARD_RHO)))
    return out


# (variant, mechanism name, params, plan, trials): each broken variant with the
# neighbouring pair that exposes it. The δ's are chosen so that δ matters: with
# δ = 1e-3 the threshold for 100·δ lets a canary-only item out w.p. ≈ 0.09;
# with δ = 1e-2 each zero-weight key leaks w.p. δ·e^(−ε) ≈ 0.0037 (63 of them).
BROKEN_CONFIGS = [
    ("threshold-delta-x100", "weighted-laplace",
     {"epsilon": 1.0, "delta": 1e-3, "max_items": 8}, [("unique", "first")], 4000),
    ("zero-weight-keys", "gw", {"epsilon": 1.0, "delta": 1e-2, "variant": "published",
                                "allow_unproven": True}, [("unique", "first")], 2000),
    ("closest-to-cutoff-greedy", "gw", {"epsilon": 1.0, "delta": 1e-2, "variant": "published",
                                        "allow_unproven": True}, [("pile", "first")], 1000),
    ("exact-weight-buckets", "adaptive", {"epsilon": 1.0, "delta": 1e-3, "max_items": 8},
     [("indirect", "first")], 1000),
]


def write_public_counts(path: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for item, count in STANDARD_PUBLIC_COUNTS.items():
            f.write(f"{item}\t{count}\n")
    return path


def describe_params(params: Mapping[str, Any]) -> str:
    order = ("epsilon", "rho", "delta", "max_items", "alpha", "rounds", "ratio")
    keys = sorted((k for k in params if k != "public_counts"),
                  key=lambda k: order.index(k) if k in order else len(order))
    return ", ".join(f"{k}={params[k]:g}" if isinstance(params[k], float) else f"{k}={params[k]}"
                     for k in keys)




if __name__ == "__main__":
    from beam_dpsu.pipelines.audit import main as _audit_main
    raise SystemExit(_audit_main(broken=BROKEN))
