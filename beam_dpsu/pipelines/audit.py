"""``beam-dpsu audit``: the empirical privacy auditor's command line.

The auditor itself (datasets, scenarios, bounds) is ``beam_dpsu.dp.evaluation.audit``;
this module parses the flags, builds the mechanism and prints one JSON report.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Mapping, Optional, Sequence

from beam_dpsu.dp.evaluation.audit import (ALL_SCENARIOS, DEFAULT_CONFIDENCE, FAST_TRIALS, POSITIONS,
                                SCENARIOS, THOROUGH_TRIALS, audit, default_plan)
from beam_dpsu.dp.evaluation.audit import __doc__ as _AUDIT_DOC
from beam_dpsu.dp.privacy import params
from beam_dpsu.dp.mechanisms import Mechanism
from beam_dpsu.dp.mechanisms.peeling import DiscoverPeelHittingSet, DiscoverPeelTopK
from beam_dpsu.pipelines import console
from beam_dpsu.pipelines.console import UsageError, run_main

__all__ = ["main", "build_parser", "parse_args"]

PROG = "beam_dpsu.pipelines.audit"


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _csv(choices):
    def parse(text):
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(
                f"choose from {', '.join(choices)} (comma-separated), got {text!r}")
        return values
    return parse


def build_parser(broken: Optional[Mapping[str, Callable]] = None) -> argparse.ArgumentParser:
    """The auditor's parser; ``--broken`` exists only when ``broken`` variants are given."""
    from beam_dpsu.dp.mechanisms.registry import REGISTRY
    p = _Parser(prog=console.command_prog(PROG), description=_AUDIT_DOC.split("\n")[0],
                allow_abbrev=False)
    console.add_output_flags(p)
    p.add_argument("--mechanism", required=True, help="one of: " + ", ".join(
        sorted(REGISTRY) + sorted(RANKED)))
    params.add_arguments(p, list(params.MECHANISM_PARAMS))
    params.add_arguments(p, ["k", "discovery_share"], help={
        "k": f"{', '.join(sorted(RANKED))}: the most items released (integer >= 1)"})
    p.add_argument("--trials", type=int, default=FAST_TRIALS,
                   help=f"runs per dataset and scenario (default {FAST_TRIALS}; thorough: "
                        f"{THOROUGH_TRIALS})")
    p.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE,
                   help="joint confidence of all bounds (default 0.95)")
    p.add_argument("--scenarios", type=_csv(ALL_SCENARIOS), default=list(SCENARIOS),
                   help="default: " + ",".join(SCENARIOS) + " (cascade: sequential policies, "
                        "Γ with fractional part in (0.5, 0.99])")
    p.add_argument("--positions", type=_csv(POSITIONS), default=None,
                   help="canary positions (default: all three for sequential policies)")
    if broken:
        p.add_argument("--broken", choices=sorted(broken),
                       help="TEST ONLY: audit a deliberately broken (non-private) variant")
    return p


#: The discovery-then-peel mechanisms, which the registry (set union) does not build.
RANKED = {"top-k-discover-peel": DiscoverPeelTopK, "hitting-set": DiscoverPeelHittingSet}


def _ranked(args):
    """A discovery-then-peel mechanism from the auditor's flags (ValueError when bad)."""
    if args.k is None or args.epsilon is None or args.delta is None:
        raise ValueError(f"{args.mechanism} needs --k, --epsilon and --delta")
    return RANKED[args.mechanism](
        args.k, args.epsilon, args.delta,
        params.DEFAULT_MAX_ITEMS if args.max_items is None else args.max_items,
        params.DEFAULT_DISCOVERY_SHARE if args.discovery_share is None
        else args.discovery_share)


def parse_args(argv: Sequence[str], broken: Optional[Mapping[str, Callable]] = None):
    from beam_dpsu.dp.mechanisms.registry import MechanismParams, make_mechanism
    args = build_parser(broken).parse_args(argv)
    if args.trials < 1:
        raise UsageError(f"--trials must be an integer >= 1, got {args.trials}")
    if not (0 < args.confidence < 1):
        raise UsageError(f"--confidence must be in (0, 1), got {args.confidence}")
    if args.max_items == params.AUTO:
        raise UsageError("--max-items-per-user auto: audit the release at a fixed Δ0 (the "
                         "activity estimate is a separate ε-DP stage, docs/mechanisms.md "
                         "section 12)")
    try:
        if args.mechanism in RANKED:
            mechanism = _ranked(args)
        elif args.k is not None or args.discovery_share is not None:
            raise ValueError(f"--k and --discovery-share apply to "
                             f"{', '.join(sorted(RANKED))} only")
        else:
            mechanism = make_mechanism(args.mechanism, MechanismParams.from_namespace(args))
        if getattr(args, "broken", None):
            mechanism = broken[args.broken](mechanism)
    except ValueError as e:
        raise UsageError(params.as_flags(str(e).splitlines()[0])) from None
    return args, mechanism


def main(argv: Optional[Sequence[str]] = None,
         broken: Optional[Mapping[str, Callable[[Mechanism], Mechanism]]] = None) -> int:
    """The auditor's command line; prints one JSON report.

    Args:
      argv: the arguments (default ``sys.argv[1:]``).
      broken: TEST ONLY: deliberately broken variants ``{name: wrap(mechanism)}``
        selectable with ``--broken`` (``benchmarks/audit_variants.BROKEN``);
        default None: no ``--broken`` flag.
    """
    def body() -> int:
        args, mechanism = parse_args(list(sys.argv[1:] if argv is None else argv), broken)
        plan = default_plan(mechanism, args.scenarios, args.positions)
        progress = console.Progress(console.command_prog(PROG), args.quiet)
        progress(f"auditing {mechanism.name}: {args.trials} trials per dataset and scenario")
        report = audit(mechanism, args.trials, args.confidence, plan=plan,
                       name=mechanism.name)
        report["broken"] = getattr(args, "broken", None)
        progress("audit finished")
        print(json.dumps(report, ensure_ascii=False))
        return 0

    return run_main(PROG, body)

