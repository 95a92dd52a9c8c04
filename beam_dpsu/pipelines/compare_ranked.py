"""``beam-dpsu compare --task top-k|hitting-set``: compare top-k methods or k-hitting sets.

* ``--task top-k``: ``--mechanisms`` lists ``limited-domain`` (Durfee and Rogers;
  settings ``k_bar``, ``max_items``) and ``discover-peel`` (settings
  ``discovery_share``, ``max_items``); each trial's *top-k missing mass (users)*
  (``dp.evaluation.utility.top_k_missing_mass``, Dick, Joseph and Raman's MM_k) and k-relative
  error (``dp.evaluation.utility.k_relative_error``) are reported.
* ``--task hitting-set``: ``--mechanisms discover-peel`` (settings as above); each
  trial's share of users hit, beside the non-private greedy hitting set (the ceiling).

Every mechanism states the same whole-release (ε, δ) guarantee. Runs on the
Beam-free core (``run_local``), on data read into memory. The figures are exact
statistics of the input from many runs: NOT differentially private.
"""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Tuple

from beam_dpsu.dp.privacy import params
from beam_dpsu.dp.evaluation import utility
from beam_dpsu.dp.mechanisms.base import released_items
from beam_dpsu.dp.mechanisms.peeling import DiscoverPeelHittingSet, DiscoverPeelTopK
from beam_dpsu.dp.mechanisms.topk import TopKMechanism
from beam_dpsu.pipelines.console import UsageError

__all__ = ["TASKS", "METHODS", "parse_methods", "build", "run_trials", "markdown_rows"]

#: The tasks besides set union, and the methods each compares.
TASKS = ("top-k", "hitting-set")
METHODS = {"top-k": {"limited-domain": ("k_bar", "max_items"),
                     "discover-peel": ("discovery_share", "max_items")},
           "hitting-set": {"discover-peel": ("discovery_share", "max_items")}}


def parse_methods(text: str, task: str) -> List[Tuple[str, Dict[str, Any]]]:
    """``'limited-domain:k_bar=50,discover-peel'`` → ``[(name, {setting: value}), ...]``."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, *settings = part.split(":")
        if name not in METHODS[task]:
            raise UsageError(f"unknown method {name!r} for --task {task}; choose from: "
                             f"{', '.join(METHODS[task])}")
        own: Dict[str, Any] = {}
        for setting in settings:
            key, eq, value = setting.partition("=")
            key = key.strip().replace("-", "_")
            try:
                key = params.canonical(key)  # max_items_per_user -> max_items
            except KeyError:
                pass
            if not eq or key not in METHODS[task][name]:
                raise UsageError(f"bad setting {setting!r} for {name}; use KEY=VALUE with KEY "
                                 f"in {', '.join(METHODS[task][name])}")
            try:
                own[key] = params.ALL_PARAMS[key].type(value)
            except ValueError:
                raise UsageError(f"bad value in {setting!r} for {name}") from None
        out.append((name, own))
    if not out:
        raise UsageError("--mechanisms lists no method")
    return out


def _label(name: str, own: Dict[str, Any]) -> str:
    return name + "".join(f" {k}={v}" for k, v in sorted(own.items()))


def build(task: str, specs, k: int, epsilons: List[float], delta: float) -> Dict[Tuple, Any]:
    """Every (label, ε) → its calibrated mechanism; raises UsageError for bad values."""
    built = {}
    for name, own in specs:
        for eps in epsilons:
            try:
                if own.get("max_items") == params.AUTO:
                    raise ValueError("max_items auto applies to select's mechanisms; give "
                                     "an integer")
                if name == "limited-domain":
                    m = TopKMechanism(k, eps, delta, k_bar=own.get("k_bar"),
                                      max_items=own.get("max_items"))
                else:
                    cls = DiscoverPeelTopK if task == "top-k" else DiscoverPeelHittingSet
                    m = cls(k, eps, delta, own.get("max_items", params.DEFAULT_MAX_ITEMS),
                            own.get("discovery_share", params.DEFAULT_DISCOVERY_SHARE))
            except ValueError as e:
                raise UsageError(f"{_label(name, own)} at ε={eps:g}: "
                                 f"{params.as_flags(str(e))}") from None
            built[(_label(name, own), eps)] = m
    return built


def _mean_sd(values: List[float]) -> Tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def run_trials(task: str, specs, k: int, epsilons, built, per_user, trials: int,
               progress, seed: Optional[int] = None) -> List[Dict[str, Any]]:
    """Runs every mechanism ``trials`` times per ε; the results. Each trial's key is
    ``runs.trial_key(seed, step)``: fresh OS randomness unless ``seed`` (tests only)."""
    from beam_dpsu.pipelines import runs  # imports Beam: not when compare's flags are parsed
    holders = utility.users_per_item(per_user)
    pairs = utility.user_item_pairs(per_user)
    results = []
    step = 0
    if task == "hitting-set":
        greedy = utility.greedy_hitting_set(per_user, k)
        results.append({"mechanism": "greedy (non-private ceiling)", "epsilon": None,
                        "released_mean": len(greedy), "users_hit_mean":
                        utility.users_hit_share(per_user, greedy), "users_hit_sd": 0.0})
    for name, own in specs:
        for eps in epsilons:
            m = built[(_label(name, own), eps)]
            sizes, first, second = [], [], []
            for _ in range(trials):
                step += 1
                rows = m.run_local(per_user, runs.trial_key(seed, step))
                items = [row[1] for row in sorted(rows, key=lambda r: r[0])]
                sizes.append(len(released_items(m, rows)))
                if task == "top-k":
                    first.append(utility.top_k_missing_mass(holders, items, k, pairs))
                    second.append(float(utility.k_relative_error(holders, items, k)))
                else:
                    first.append(utility.users_hit_share(per_user, items))
            entry = {"mechanism": _label(name, own), "epsilon": eps,
                     "released_mean": statistics.fmean(sizes),
                     "calibration": f"({m.guarantee.epsilon:g}, {m.guarantee.delta:g})-DP"}
            if task == "top-k":
                entry["top_k_missing_mass_mean"], entry["top_k_missing_mass_sd"] = \
                    _mean_sd(first)
                entry["k_relative_error_mean"], entry["k_relative_error_sd"] = _mean_sd(second)
            else:
                entry["users_hit_mean"], entry["users_hit_sd"] = _mean_sd(first)
            results.append(entry)
            progress(f"{entry['mechanism']} at ε={eps:g}: done")
    return results


def markdown_rows(task: str, results) -> List[str]:
    """The markdown table of ``run_trials``' results."""
    if task == "top-k":
        lines = ["| method | ε | released (mean) | top-k missing mass (users), mean ± sd "
                 "| k-relative error (users), mean ± sd | calibration |",
                 "|---|---|---|---|---|---|"]
        for r in results:
            lines.append(f"| {r['mechanism']} | {r['epsilon']:g} | {r['released_mean']:.1f} | "
                         f"{r['top_k_missing_mass_mean']:.4f} ± {r['top_k_missing_mass_sd']:.4f} | "
                         f"{r['k_relative_error_mean']:.1f} ± {r['k_relative_error_sd']:.1f} | "
                         f"{r['calibration']} |")
        return lines
    lines = ["| method | ε | chosen (mean) | share of users hit, mean ± sd | calibration |",
             "|---|---|---|---|---|"]
    for r in results:
        eps = "–" if r["epsilon"] is None else f"{r['epsilon']:g}"
        lines.append(f"| {r['mechanism']} | {eps} | {r['released_mean']:.1f} | "
                     f"{r['users_hit_mean']:.4f} ± {r['users_hit_sd']:.4f} | "
                     f"{r.get('calibration', 'not private')} |")
    return lines
