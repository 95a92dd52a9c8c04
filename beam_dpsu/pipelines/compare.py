"""Compare set-union mechanisms on your data: released items, tables and plots.

Usage::

    beam-dpsu compare --input PATH --mechanisms LIST --epsilon E --delta D
        [--max-items-per-user N] [--alpha A] [--rounds I] [--ratio r]
        [--public-counts PATH] [--trials N] [--epsilons LIST] [--engine core|beam]
        [--budget-epsilon E --budget-delta D] [--insecure-test-seed N]
        --output DIR [--overwrite] [any Beam pipeline option, with --engine beam]
    beam-dpsu compare --task top-k|hitting-set --k K --mechanisms METHODS ...
        (top-k methods or k-hitting sets: ``beam_dpsu.pipelines.compare_ranked``)

``LIST`` is comma-separated mechanism names, each optionally with its own
parameters after colons, e.g.
``weighted-gaussian:max_items=300,policy-gaussian:max_items=300:alpha=5,gw,gw-kt``.
A per-mechanism parameter overrides the shared flag of the same name
(``max_items``, ``alpha``, ``rounds``, ``ratio``, ``public_counts``; Δ0 may
also be spelled ``max_items_per_user`` or, as PipelineDP calls it,
``max_partitions_contributed``);
``tie_break`` (``gw``, ``gw-kt``) is per mechanism only, e.g.
``gw,gw:tie_break=first-occurrence``; likewise ``eta`` and ``variant``
(``gw:variant=published`` is not proven private and needs ``--allow-unproven``).

Every mechanism is run ``--trials`` times (default 5) with fresh OS randomness at
each ε of ``--epsilons`` (default: just ``--epsilon``; for tests,
``--insecure-test-seed N`` gives the i-th trial of the run the key of seed N + i, so a
comparison can be repeated exactly); the mean and standard
deviation of the number of released items go to ``DIR/results.PRIVATE.json``
and ``DIR/results.PRIVATE.md``, with each trial's *occurrence coverage*: the
share of all input lines (user, item occurrences) whose item was released
(``beam_dpsu.utility``; its complement, the missing mass, is the share of the
data a vocabulary built from the release would not cover). With matplotlib
installed (``pip install beam-dpsu[plots]``) it also writes
``DIR/released_vs_epsilon.PRIVATE.png`` (released items against ε, one line per
mechanism), ``DIR/coverage_vs_epsilon.PRIVATE.png`` (occurrence coverage,
likewise) and ``DIR/released_by_users.PRIVATE.png`` (released items by how many
users hold them), one distinct colour per mechanism. Progress goes to stderr.

Every output holds exact, non-private statistics of the input (coverage,
released-by-users, counts from many runs on the same data): each has
``PRIVATE`` in its name, as the run details of a release, is created
owner-only (mode 0600), and says in its first line (the markdown) or title
(each plot) that it is NOT differentially private and must never be
published as a release.

Common footing: all mechanisms are calibrated to the same (ε, δ)-DP target.
Mechanisms calibrated in zCDP (``sips``) get the largest ρ whose conversion
(DP-SIPS Corollary 9) gives (ε, δ)-DP, with half of δ as the approximate-zCDP δ;
the table's "calibration" column says so for each.

Engines: ``dp.mechanisms.base`` (default) reads the data once into memory and runs each trial
with ``beam_dpsu.run_local``, the same per-user and per-item functions the
Beam transforms use; ``beam`` runs the real command-line pipeline per trial
(``beam-dpsu select``) with any Beam options, for data that does not
fit in memory.

The released counts are outputs of private mechanisms, but this tool runs each
mechanism many times on the same data: the comparison itself is NOT
differentially private. Use it to choose a mechanism, then release once.

What the trials cost together: every trial is a release, so
``results.PRIVATE.json`` states ``privacy_cost``, the composition of all of them
(basic composition; zCDP composition converted once when every mechanism is
zCDP-calibrated): what publishing the released counts would cost, were they
published. ``--budget-epsilon E --budget-delta D`` caps it: a comparison
whose trials would spend more is refused before any data is read. The
coverage figures and the released-by-users table use the exact data and are
never covered.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from beam_dpsu.dp.evaluation import utility
from beam_dpsu.dp.mechanisms.base import run_local
from beam_dpsu.dp.privacy import params
from beam_dpsu.dp.mechanisms.registry import REGISTRY, MechanismParams, make_mechanism
from beam_dpsu.pipelines import compare_ranked, run_budget, flags, console
# textio, outputs and runs (which import Apache Beam) are imported by the functions that
# read, run and write: parse_args checks the flags without Beam (arguments.check).
from beam_dpsu.pipelines.console import UsageError

__all__ = ["PROG", "RESULTS_MD", "RESULTS_JSON", "RELEASED_PNG", "COVERAGE_PNG", "BY_USERS_PNG",
           "NOT_PRIVATE_NOTE", "SPEC_PARAMS", "SHARED", "parse_mechanisms", "label", "build_parser",
           "mechanism_params", "parse_args", "privacy_cost", "load_per_user", "users_per_item",
           "user_bins", "occurrences_of_files", "run_trials", "markdown", "distinct_colors",
           "plot", "run", "main"]


PROG = "compare"

#: The outputs in ``--output DIR`` (each ``PRIVATE``: exact statistics of the input).
RESULTS_MD = "results.PRIVATE.md"
RESULTS_JSON = "results.PRIVATE.json"
RELEASED_PNG = "released_vs_epsilon.PRIVATE.png"
COVERAGE_PNG = "coverage_vs_epsilon.PRIVATE.png"
BY_USERS_PNG = "released_by_users.PRIVATE.png"

#: The first line of the markdown and of each plot's title.
NOT_PRIVATE_NOTE = ("PRIVATE: exact statistics of the input, NOT differentially private; "
                    "never publish as a DP release")
#: The per-mechanism settings of ``NAME:KEY=VALUE`` (from the parameter declaration).
SPEC_PARAMS = params.spec_types()
#: Settings that may also be given once for every mechanism, as flags.
SHARED = ("max_items", "alpha", "rounds", "ratio", "public_counts")


def parse_mechanisms(text: str) -> List[Tuple[str, Dict[str, Any]]]:
    """``'a:max_items=3,b'`` → ``[('a', {'max_items': 3}), ('b', {})]``."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, *settings = part.split(":")
        if name not in REGISTRY:
            raise UsageError(f"unknown mechanism {name!r}; choose from: "
                             f"{', '.join(sorted(REGISTRY))}")
        own: Dict[str, Any] = {}
        for setting in settings:
            key, eq, value = setting.partition("=")
            key = key.strip().replace("-", "_")
            if not eq or key not in SPEC_PARAMS:
                raise UsageError(f"bad setting {setting!r} for {name}; use KEY=VALUE with KEY in "
                                 f"{', '.join(sorted(SPEC_PARAMS))}")
            declared = SPEC_PARAMS[key]
            try:
                own[declared.name] = declared.type(value)
            except ValueError:
                raise UsageError(f"bad value in {setting!r} for {name}") from None
        out.append((name, own))
    if not out:
        raise UsageError("--mechanisms lists no mechanism")
    return out


def label(name: str, own: Dict[str, Any]) -> str:
    return name + "".join(f" {k}={v}" for k, v in sorted(own.items()))


def build_parser() -> flags.ArgumentParser:
    p = flags.ArgumentParser(PROG, __doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="input file or glob of user<TAB>item lines")
    flags.add_column_arguments(p)
    p.add_argument("--output", required=True,
                   help=f"directory for the results ({RESULTS_MD}, {RESULTS_JSON}) and plots "
                        f"(*.PRIVATE.png): exact statistics of the input, owner-only, never "
                        f"to be published")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results of an earlier comparison in --output (default: "
                        "they are refused, as select refuses an earlier run's outputs)")
    p.add_argument("--mechanisms", required=True, help="comma-separated NAME[:KEY=VALUE...]")
    p.add_argument("--task", choices=("set-union",) + compare_ranked.TASKS, default="set-union",
                   help="what to compare: set-union mechanisms (default), top-k methods "
                        "(limited-domain, discover-peel: top-k missing mass and k-relative "
                        "error) or hitting sets (discover-peel: share of users hit, beside "
                        "the non-private greedy)")
    params.add_arguments(p, ["k"], help={"k": "--task top-k or hitting-set: the most items "
                                              "to release (integer >= 1)"})
    params.add_arguments(p, ["epsilon", "delta"], required=("delta",), help={
        "epsilon": "ε of the common (ε, δ)-DP target", "delta": "δ of the common target"})
    p.add_argument("--epsilons", help="comma-separated ε values to sweep")
    params.add_arguments(p, SHARED)
    p.add_argument("--trials", type=int, default=5, help="runs per mechanism and ε (default 5)")
    p.add_argument("--engine", choices=("core", "beam"), default="core",
                   help="core (default): run each mechanism's Beam-free core in this process; "
                        "beam: run it as a Beam pipeline (with the runner flags given), "
                        "slower, the same releases under --insecure-test-seed")
    flags.add_test_seed_argument(p)
    params.add_arguments(p, ["allow_unproven"])
    run_budget.add_arguments(p, shares=False)
    return p


def mechanism_params(name: str, own: Dict[str, Any], args, epsilon: float) -> MechanismParams:
    accepts = REGISTRY[name].accepts
    shared = {k: getattr(args, k) for k in SHARED}
    values = {k: v for k, v in shared.items() if v is not None and k in accepts}
    values.update(own, allow_unproven=args.allow_unproven)
    return MechanismParams(epsilon=epsilon, delta=args.delta, **values)


def parse_args(argv):
    """``beam-dpsu compare``'s flags, parsed and validated: (args, Beam's arguments, the
    listed mechanisms, the ε values, every mechanism built); raises UsageError for
    any user mistake, before any data is read."""
    return flags.parse(build_parser(), argv, _validate)


def _validate(args, beam_args):
    if args.engine == "core" and beam_args:
        raise UsageError(f"Beam options need --engine beam: {' '.join(beam_args)}")
    if args.trials < 1:
        raise UsageError(f"--trials must be an integer >= 1, got {args.trials}")
    if args.epsilons:
        try:
            epsilons = [float(e) for e in args.epsilons.split(",") if e.strip()]
        except ValueError:
            raise UsageError(f"--epsilons must be numbers, got {args.epsilons!r}") from None
    elif args.epsilon is not None:
        epsilons = [args.epsilon]
    else:
        raise UsageError("give --epsilon or --epsilons")
    if args.task != "set-union":
        if args.engine != "core":
            raise UsageError(f"--task {args.task} runs on --engine core only")
        if args.k is None:
            raise UsageError(f"--task {args.task} needs --k")
        if getattr(args, "max_items", None) is not None:
            raise UsageError(f"--max-items-per-user does not apply to --task {args.task}: "
                             "give it per method (e.g. discover-peel:max_items=50)")
        specs = compare_ranked.parse_methods(args.mechanisms, args.task)
        built = compare_ranked.build(args.task, specs, args.k, epsilons, args.delta)
        args.privacy_cost = privacy_cost(args, specs, epsilons, built,
                                         label=compare_ranked._label)
        return args, beam_args, specs, epsilons, built
    if args.k is not None:
        raise UsageError("--k applies to --task top-k and --task hitting-set only")
    specs = parse_mechanisms(args.mechanisms)
    built = {}
    for name, own in specs:
        for eps in epsilons:  # validate every combination before reading data
            try:
                built[(label(name, own), eps)] = make_mechanism(
                    name, mechanism_params(name, own, args, eps))
            except ValueError as e:
                raise UsageError(f"{label(name, own)} at ε={eps:g}: "
                                 f"{params.as_flags(str(e))}") from None
    args.privacy_cost = privacy_cost(args, specs, epsilons, built)
    return args, beam_args, specs, epsilons, built


def privacy_cost(args, specs, epsilons, built, label=None) -> Dict[str, Any]:
    """The composed guarantee of every trial ``run_trials`` will run (``--trials`` per
    listed mechanism and ε, a mechanism or ε listed twice counted twice), checked
    against ``--budget-epsilon/--budget-delta``; what it covers."""
    label = label or globals()["label"]
    guarantees = [built[(label(name, own), eps)].guarantee
                  for name, own in specs for eps in epsilons for _ in range(args.trials)]
    cost = run_budget.total_cost(
        args, guarantees, f"{args.trials} trial(s) of {len(specs)} mechanism(s) at "
                          f"{len(epsilons)} ε value(s)")
    cost["covers"] = ("the released counts (each a function of one release); NOT the "
                      "occurrence coverage, missing mass or released-by-users figures, which "
                      "use the exact data")
    return cost


def load_per_user(pattern: str) -> Dict[Any, Dict[Any, int]]:
    """All users in memory, each user's items in record order (``textio.read_per_user``)."""
    from beam_dpsu.transforms import textio
    return textio.read_per_user(pattern)


def users_per_item(per_user) -> Dict[Any, int]:
    out: Dict[Any, int] = {}
    for counts in per_user.values():
        for item in counts:
            out[item] = out.get(item, 0) + 1
    return out


def user_bins(max_users: int) -> List[Tuple[int, int]]:
    """Bins 1, 2, 3–4, 5–8, … up to ``max_users``."""
    bins, lo = [(1, 1)], 2
    while lo <= max(max_users, 2):
        hi = 2 * (lo - 1)          # 2, 4, 8, 16, ...
        bins.append((lo, hi))
        lo = hi + 1
    return bins


def occurrences_of_files(pattern: str) -> Dict[Any, int]:
    """``{item: occurrences}`` of the input files, streamed (no per-user data kept)."""
    from beam_dpsu.transforms import textio
    out: Dict[Any, int] = {}
    get = out.get
    for path in textio.match_files(pattern):
        for kind, value in textio.read_user_items(path):
            if kind == "user":
                for item, c in value[1].items():
                    out[item] = get(item, 0) + c
    return out


def _released_items(prefix: str) -> set:
    """The items of a release file written by select_partitions (one per line)."""
    from beam_dpsu.pipelines import outputs
    path = prefix + outputs.ITEMS_SUFFIX
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        return {line.rstrip("\n") for line in f if line.rstrip("\n")}


def run_trials(args, beam_args, specs, epsilons, built, per_user, tmp, progress,
               occurrences=None):
    """Runs every (mechanism, ε, trial); returns one result row per (mechanism, ε).

    ``occurrences`` (``utility.item_occurrences`` of the input) adds each
    trial's occurrence coverage (the share of input lines whose item was
    released) to the rows.
    """
    from beam_dpsu.pipelines import runs
    results = []
    total = len(specs) * len(epsilons) * args.trials
    step = 0
    holders = users_per_item(per_user) if per_user is not None else None
    seed = args.insecure_test_seed
    for name, own in specs:
        lab = label(name, own)
        for eps in epsilons:
            mech = built[(lab, eps)]
            counts, seconds, last, coverage = [], [], None, []
            for t in range(args.trials):
                step += 1
                start = time.time()
                if args.engine == "core":
                    last = run_local(per_user, mech, runs.trial_key(seed, step))
                    n = len(last)
                else:
                    prefix = os.path.join(tmp, f"{len(results)}-{t}")
                    flags = _cli_flags(name, mechanism_params(name, own, args, eps))
                    if seed is not None:
                        flags += ["--insecure-test-seed", str(seed + step)]
                    s = _select_partitions().run(["--input", args.input, "--output", prefix,
                                                  "--quiet"] + flags + list(beam_args))
                    n = s["num_released"]
                    if occurrences is not None:
                        last = _released_items(prefix)
                seconds.append(time.time() - start)
                counts.append(n)
                if occurrences is not None:
                    coverage.append(utility.occurrence_coverage(last, occurrences))
                progress(f"[{step}/{total}] {lab} ε={eps:g} trial {t + 1}/{args.trials}: "
                         f"{n} items ({seconds[-1]:.1f} s)")
            row = {
                "mechanism": name, "label": lab, "settings": own, "epsilon": eps,
                "delta": args.delta, "trials": args.trials, "released": counts,
                "mean": statistics.mean(counts),
                "sd": statistics.stdev(counts) if len(counts) > 1 else 0.0,
                "seconds_per_trial": statistics.mean(seconds),
                "calibration": mech.describe(),
                "footing": _footing(mech),
            }
            if coverage:
                row.update({
                    "occurrence_coverage": coverage,
                    "coverage_mean": statistics.mean(coverage),
                    "coverage_sd": statistics.stdev(coverage) if len(coverage) > 1 else 0.0,
                    "missing_mass_mean": 1.0 - statistics.mean(coverage),
                })
            if holders is not None and last is not None:
                row["released_by_users"] = _by_users(last, holders)
            results.append(row)
    return results


def _select_partitions():
    from beam_dpsu.pipelines import select_partitions
    return select_partitions


def _cli_flags(name: str, values: MechanismParams) -> List[str]:
    """The ``select_partitions`` arguments that build mechanism ``name`` with ``values``."""
    return ["--mechanism", name] + params.cli_arguments(dataclasses.asdict(values))


def _footing(mech) -> str:
    g = mech.guarantee
    if g.rho is not None:
        return (f"zCDP, converted: ρ={g.rho:.4g} with δ_zCDP={g.zcdp_delta:.3g} gives "
                f"({g.epsilon:.4g}, {g.delta:.3g})-DP (DP-SIPS Cor. 9)")
    return f"({g.epsilon:.4g}, {g.delta:.3g})-DP"


def _by_users(released, holders) -> Dict[str, int]:
    bins = user_bins(max(holders.values(), default=1))
    out = {f"{lo}-{hi}" if lo != hi else str(lo): 0 for lo, hi in bins}
    for item in released:
        n = holders.get(item, 0)
        for lo, hi in bins:
            if lo <= n <= hi:
                out[f"{lo}-{hi}" if lo != hi else str(lo)] += 1
                break
    return out


def _randomness(args) -> str:
    return ("fresh OS randomness each" if args.insecure_test_seed is None else
            f"keys from --insecure-test-seed {args.insecure_test_seed} (tests only)")


def markdown(results, args, epsilons, command: str) -> str:
    lines = [f"# {NOT_PRIVATE_NOTE}", "", "## Mechanism comparison", "",
             f"Data: `{args.input}`. Common target δ = {args.delta:g}; "
             f"{args.trials} trials per cell, {_randomness(args)}; engine `{args.engine}`.",
             "", f"Command: `{command}`", "",
             "All mechanisms are compared at the same (ε, δ)-DP guarantee; zCDP mechanisms are "
             "calibrated to it with the library's conversion, as the last column says.", "",
             "Occurrence coverage is the share of all input lines (user, item occurrences) "
             "whose item was released; the missing mass is its complement.", "",
             "| mechanism | ε | released (mean) | sd | runs | occurrence coverage (mean ± sd) "
             "| missing mass | s/trial | calibration |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["epsilon"], -r["mean"])):
        cov = (f"{100 * r['coverage_mean']:.2f}% ± {100 * r['coverage_sd']:.2f}"
               if "coverage_mean" in r else "–")
        miss = f"{100 * r['missing_mass_mean']:.2f}%" if "coverage_mean" in r else "–"
        lines.append(f"| {r['label']} | {r['epsilon']:g} | {r['mean']:.1f} | {r['sd']:.1f} | "
                     f"{r['released']} | {cov} | {miss} | {r['seconds_per_trial']:.2f} | "
                     f"{r['footing']} |")
    if any("released_by_users" in r for r in results):
        eps = epsilons[-1]
        rows = [r for r in results if r["epsilon"] == eps and "released_by_users" in r]
        if rows:
            bins = list(rows[0]["released_by_users"])
            lines += ["", f"Released items of the last trial by how many users hold them "
                      f"(ε = {eps:g}):", "",
                      "| mechanism | " + " | ".join(bins) + " |",
                      "|---|" + "---|" * len(bins)]
            for r in rows:
                lines.append(f"| {r['label']} | " +
                             " | ".join(str(r["released_by_users"][b]) for b in bins) + " |")
    cost = getattr(args, "privacy_cost", None)
    if cost:
        lines += ["", f"What the {cost['releases']} releases of this comparison cost together: "
                  f"ε = {cost['epsilon']:.4g}, δ = {cost['delta']:.3g} ({cost['composition']}"
                  + (f"; within the stated budget ε = {cost['budget_epsilon']:g}, "
                     f"δ = {cost['budget_delta']:g}" if cost["budget_epsilon"] is not None
                     else "") + "). It covers " + cost["covers"] + "."]
    lines += ["", "These counts come from many runs on the same data: the comparison itself "
              "is not differentially private."]
    return "\n".join(lines) + "\n"


def distinct_colors(n: int) -> List[Tuple[float, float, float]]:
    """``n`` colours of clearly different hue, one per mechanism.

    The ten of matplotlib's ``tab10`` for n ≤ 10 (no light/dark pairs, which
    would suggest pairings that do not exist), else ``n`` hues evenly spaced
    around the colour wheel.
    """
    import colorsys
    if n <= 10:
        tab10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                 "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
        return [tuple(int(h[i:i + 2], 16) / 255 for i in (1, 3, 5)) for h in tab10[:n]]
    return [colorsys.hsv_to_rgb(k / n, 0.75, 0.85 if k % 2 else 0.65) for k in range(n)]


def _open_private(path: str):
    """``path`` opened for writing (binary), created owner-only (mode 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # also when the file existed
    return os.fdopen(fd, "wb")


def _save(plt, fig, path: str) -> str:
    """Saves ``fig`` as the owner-only PNG ``path``, its title marked PRIVATE."""
    fig.suptitle(NOT_PRIVATE_NOTE, fontsize=8, color="#b00000")
    fig.tight_layout()
    with _open_private(path) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
    return path


def _plot_metric(plt, results, epsilons, labels, colors, out_dir, key, sd_key, scale, ylabel,
                 title, filename) -> str:
    """One figure of ``key`` (mean ± ``sd_key``) per mechanism: against ε, or bars at one ε."""
    rows_with = [r for r in results if key in r]
    if len(epsilons) > 1:
        fig, ax = plt.subplots(figsize=(8, 5))
        for k, lab in enumerate(labels):
            rows = sorted((r for r in rows_with if r["label"] == lab), key=lambda r: r["epsilon"])
            ax.errorbar([r["epsilon"] for r in rows], [scale * r[key] for r in rows],
                        yerr=[scale * r[sd_key] for r in rows], marker="os^vD<>ph*"[k % 10],
                        capsize=3, color=colors[k], label=lab)
        ax.set_xlabel("ε")
        ax.set_title(f"{title} against ε")
        ax.legend(fontsize=7)
        ax.set_ylabel(ylabel)
    else:
        rows = sorted(rows_with, key=lambda r: r[key])
        fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.5))
        ax.barh([r["label"] for r in rows], [scale * r[key] for r in rows],
                xerr=[scale * r[sd_key] for r in rows], capsize=3,
                color=[colors[labels.index(r["label"])] for r in rows])
        ax.set_xlabel(ylabel)
        ax.set_title(f"{title} at ε = {epsilons[0]:g}")
        ax.tick_params(axis="y", labelsize=8)
    ax.grid(alpha=0.3)
    return _save(plt, fig, os.path.join(out_dir, filename))


def plot(results, epsilons, out_dir) -> List[str]:
    """Writes the PNG plots; returns their paths ([] without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    labels = list(dict.fromkeys(r["label"] for r in results))
    colors = distinct_colors(len(labels))
    if any("coverage_mean" in r for r in results):
        written.append(_plot_metric(plt, results, epsilons, labels, colors, out_dir,
                                    "coverage_mean", "coverage_sd", 100.0,
                                    "share of input lines whose item was released (%)",
                                    "Occurrence coverage", COVERAGE_PNG))
    if len(epsilons) > 1:
        fig, ax = plt.subplots(figsize=(8, 5))
        for k, lab in enumerate(labels):
            rows = sorted((r for r in results if r["label"] == lab), key=lambda r: r["epsilon"])
            ax.errorbar([r["epsilon"] for r in rows], [r["mean"] for r in rows],
                        yerr=[r["sd"] for r in rows], marker="os^vD<>ph*"[k % 10], capsize=3,
                        color=colors[k], label=lab)
        ax.set_xlabel("ε")
        ax.set_ylabel("released items (mean over trials)")
        ax.set_title("Released items against ε")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    else:  # one ε: a bar per mechanism (a line plot would be one column of points)
        rows = sorted(results, key=lambda r: r["mean"])
        fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.5))
        ax.barh([r["label"] for r in rows], [r["mean"] for r in rows],
                xerr=[r["sd"] for r in rows], capsize=3,
                color=[colors[labels.index(r["label"])] for r in rows])
        ax.set_xlabel("released items (mean over trials, ± sd)")
        ax.set_title(f"Released items at ε = {epsilons[0]:g}")
        ax.grid(alpha=0.3, axis="x")
        ax.tick_params(axis="y", labelsize=8)
    written.append(_save(plt, fig, os.path.join(out_dir, RELEASED_PNG)))

    rows = [r for r in results if r["epsilon"] == epsilons[-1] and "released_by_users" in r]
    if rows:
        bins = list(rows[0]["released_by_users"])
        fig, ax = plt.subplots(figsize=(8, 4.5))
        width = 0.8 / len(rows)
        for j, r in enumerate(rows):
            ax.bar([i + j * width for i in range(len(bins))],
                   [r["released_by_users"][b] for b in bins], width=width, label=r["label"],
                   color=colors[labels.index(r["label"])])
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(bins))])
        ax.set_xticklabels(bins, rotation=45)
        ax.set_xlabel("number of users holding the item")
        ax.set_ylabel("released items (last trial)")
        ax.set_title(f"Released items by how many users hold them (ε = {epsilons[-1]:g})")
        ax.legend(fontsize=8)
        written.append(_save(plt, fig, os.path.join(out_dir, BY_USERS_PNG)))
    return written


def earlier_results(folder: str) -> List[str]:
    """The files an earlier comparison wrote in ``folder`` (every output's name holds
    ``.PRIVATE.``), sorted; [] when there are none or ``folder`` does not exist."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(os.path.join(folder, n) for n in names
                  if ".PRIVATE." in n and os.path.isfile(os.path.join(folder, n)))


def run(argv: Optional[Sequence[str]] = None, progress=None) -> Dict[str, Any]:
    from beam_dpsu.pipelines import outputs, runs
    argv = list(sys.argv[1:] if argv is None else argv)
    args, beam_args, specs, epsilons, built = parse_args(argv)
    outputs.check_locations(args.input)
    outputs.check_columns(outputs.check_input(args.input), args.tabs_in_items,
                          args.trust_columns)
    earlier = earlier_results(args.output)
    if earlier and not args.overwrite:
        raise UsageError(f"{args.output!r} holds an earlier comparison's results "
                         f"({os.path.basename(earlier[0])}); pass --overwrite to replace them")
    try:
        os.makedirs(args.output, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create {args.output!r}: {e.strerror}") from None
    for path in earlier:  # --overwrite: no plot of the earlier run is left beside the new
        os.remove(path)
    if progress is None:  # stderr lines, none with --quiet
        progress = console.Progress(console.command_prog(PROG), args.quiet)
    if args.insecure_test_seed is not None:
        print(runs.INSECURE_SEED_WARNING, file=sys.stderr)
    start = time.time()
    per_user = None
    if args.engine == "core":
        progress(f"reading {args.input} ...")
        per_user = load_per_user(args.input)
        if not per_user:
            raise runs.NoWellFormedInput(f"no well-formed user<TAB>item line in "
                                           f"{args.input!r}: nothing to compare")
        if args.verbose:  # an exact count: owner-only, shown only when asked for
            progress(f"{len(per_user)} users")
        if args.task != "set-union":
            return _run_ranked(args, argv, specs, epsilons, built, per_user, progress, start)
        occurrences = utility.item_occurrences(per_user)
    else:
        progress(f"counting item occurrences of {args.input} (for the coverage figure) ...")
        occurrences = occurrences_of_files(args.input)
    with tempfile.TemporaryDirectory() as tmp:
        results = run_trials(args, beam_args, specs, epsilons, built, per_user, tmp, progress,
                             occurrences)
    command = "beam-dpsu compare " + " ".join(
        a if " " not in a else repr(a) for a in argv)
    with _open_private(os.path.join(args.output, RESULTS_MD)) as f:
        f.write(markdown(results, args, epsilons, command).encode("utf-8"))
    plots = plot(results, epsilons, args.output)
    if not plots:
        progress("matplotlib is not installed: tables only (pip install beam-dpsu[plots])")
    summary = {"PRIVATE": NOT_PRIVATE_NOTE, "input": args.input, "delta": args.delta,
               "epsilons": epsilons, "trials": args.trials, "engine": args.engine,
               "command": command,
               "results": results, "plots": plots, "seconds": round(time.time() - start, 1),
               "privacy_cost": args.privacy_cost,
               "not_private": "many runs on the same data: this comparison is not DP"}
    _write_json(os.path.join(args.output, RESULTS_JSON), summary)
    return summary


def _write_json(path: str, summary: Dict[str, Any]) -> None:
    with _open_private(path) as f:
        f.write((json.dumps(summary, indent=2, ensure_ascii=False, default=str) + "\n")
                .encode("utf-8"))


def _run_ranked(args, argv, specs, epsilons, built, per_user, progress, start):
    """``--task top-k`` or ``hitting-set``: the trials, the table and the JSON (no plots)."""
    results = compare_ranked.run_trials(args.task, specs, args.k, epsilons, built, per_user,
                                        args.trials, progress, args.insecure_test_seed)
    command = "beam-dpsu compare " + " ".join(a if " " not in a else repr(a) for a in argv)
    text = "\n".join([f"# {NOT_PRIVATE_NOTE}", "", f"Task: {args.task}, k = {args.k}, "
                      f"δ = {args.delta:g}, {args.trials} trials per cell, "
                      f"{_randomness(args)}.", "", f"Command: `{command}`", "",
                      *compare_ranked.markdown_rows(args.task, results), ""])
    with _open_private(os.path.join(args.output, RESULTS_MD)) as f:
        f.write(text.encode("utf-8"))
    summary = {"PRIVATE": NOT_PRIVATE_NOTE, "task": args.task, "k": args.k,
               "input": args.input, "delta": args.delta, "epsilons": epsilons,
               "trials": args.trials, "engine": "core", "command": command,
               "results": results, "plots": [], "seconds": round(time.time() - start, 1),
               "privacy_cost": args.privacy_cost,
               "not_private": "many runs on the same data: this comparison is not DP"}
    _write_json(os.path.join(args.output, RESULTS_JSON), summary)
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    from beam_dpsu.pipelines import runs
    return runs.main_wrapper(PROG, run, argv, ("input", "epsilons", "trials", "plots",
                                                 "seconds", "privacy_cost"))

