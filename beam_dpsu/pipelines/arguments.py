"""Each release command's flags, parsed and checked before Apache Beam is imported.

``beam-dpsu select``, ``top-k`` and ``hitting-set`` declare their flags here
(``select_parser``, ``top_k_parser``, ``hitting_set_parser``) and turn them into
the mechanisms they run (``parse_select``, ``parse_top_k``,
``parse_hitting_set``), with the dp layer only. ``check(command, argv)`` is what
the console command runs before it imports the command's pipeline: a
parameter mistake is one line and exit status 2 in a fraction of a second,
without the seconds Beam takes to import (Beam is imported here only to check
arguments left over for it, see ``flags.parse``). ``compare`` keeps its flags in
its own module, which imports Beam only to run; ``generate``, ``audit`` and
``setup-engines`` import no Beam at all. The pipelines
(``beam_dpsu.pipelines.select_partitions``, ``top_k``, ``hitting_set``) parse
with the same functions, so what is checked early is what runs.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from beam_dpsu.dp.privacy import params
from beam_dpsu.dp.privacy.accounting import PayWhatYouGetAccountant
from beam_dpsu.dp.mechanisms.budget import PrivacyBudget
from beam_dpsu.dp.mechanisms import Mechanism
from beam_dpsu.dp.mechanisms.peeling import (DiscoverPeelHittingSet, DiscoverPeelTopK,
                                             DiscoverThenPeel)
from beam_dpsu.dp.mechanisms.topk import TopKMechanism
from beam_dpsu.dp.mechanisms.registry import REGISTRY, MechanismParams, make_mechanism
from beam_dpsu.pipelines import console, flags, run_budget
from beam_dpsu.pipelines.console import UsageError

__all__ = ["select_parser", "RELEASES", "Plan", "parse_select", "top_k_parser", "parse_top_k",
           "discover_peel", "hitting_set_parser", "parse_hitting_set", "PARSERS", "check"]


def _prog(command: str) -> str:
    """The name a command's messages use outside the console command: its module's
    (``select_partitions``), as ``python -m pipelines.select_partitions`` runs it."""
    return next(m for m, c in console.MODULE_COMMANDS.items() if c == command)


def _describe(command: str) -> str:
    """The one-line description of ``beam-dpsu --help`` (``console.COMMANDS``)."""
    text = console.COMMANDS[command][1]
    return text[:1].upper() + text[1:] + "."


def select_parser() -> flags.ArgumentParser:
    """``beam-dpsu select``'s flags."""
    p = flags.ArgumentParser(_prog("select"), _describe("select"))
    flags.add_io_arguments(p)
    p.add_argument("--mechanism", required=True,
                   help="one of: " + ", ".join(sorted(REGISTRY)))
    params.add_arguments(p, list(params.MECHANISM_PARAMS))
    flags.add_dead_letter_argument(p)
    run_budget.add_arguments(p, RELEASES)
    g = p.add_argument_group("a top-k release in the same run (needs the budget flags)")
    g.add_argument("--top-k", dest="top_k", type=int, metavar="K",
                   help="also release the differentially private top K items (at most K: "
                        "the query stops at the first candidate below its noisy threshold) "
                        "to PREFIX-top-k-00000-of-00001. Privacy: paid from --share top-k "
                        "(the whole query's guarantee)")
    g.add_argument("--top-k-bar", dest="top_k_bar", type=int, metavar="KBAR",
                   help="top-k candidates k̄ >= K (default 10·K). Privacy: none (the "
                        "threshold grows with log(k̄/δ)/ε)")
    g.add_argument("--top-k-max-items", dest="top_k_max_items", type=int, metavar="N",
                   help="top-k: Δ, distinct items kept per user (default unrestricted). "
                        "Privacy: none")
    return p


#: the releases a run can make, as ``--share`` names them
RELEASES = ("select", "top-k")


@dataclasses.dataclass
class Plan:
    """What one run releases: the key set's mechanism and, optionally, a top-k query
    and the budget both were calibrated from."""
    mechanism: Mechanism
    top_k: Optional[TopKMechanism] = None
    budget: Optional[PrivacyBudget] = None
    #: the top-k query's pay-what-you-get pool (k selections, one query)
    pool: Optional[PayWhatYouGetAccountant] = None


def parse_select(argv: Optional[Sequence[str]]) -> Tuple[object, Plan, List[str]]:
    """``beam-dpsu select``'s flags, parsed and validated: (args, what the run
    releases, Beam's arguments). Raises UsageError for any user mistake."""
    return flags.parse(select_parser(), argv, _select_plan)


def _select_plan(args, beam_args: List[str]) -> Tuple[object, Plan, List[str]]:
    if args.top_k is None:
        for name in ("top_k_bar", "top_k_max_items"):
            if getattr(args, name) is not None:
                raise UsageError(f"--{name.replace('_', '-')} needs --top-k")
        if any(str(t).partition("=")[0].strip() == "top-k" for t in args.share or ()):
            raise UsageError("--share top-k=F needs --top-k K (the top-k release)")
    releases = ["select"] + (["top-k"] if args.top_k is not None else [])
    planned = run_budget.plan(args, releases)
    if planned is None:
        if args.top_k is not None:
            raise UsageError("--top-k makes a second release in this run: state the run's "
                             "total with --budget-epsilon and --budget-delta (and optionally "
                             "--share select=F --share top-k=F)")
        try:
            mechanism = make_mechanism(args.mechanism, MechanismParams.from_namespace(args))
        except ValueError as e:
            raise UsageError(params.as_flags(str(e))) from None
        return args, Plan(mechanism), beam_args
    budget, fractions = planned
    values = {k: v for k, v in
              dataclasses.asdict(MechanismParams.from_namespace(args)).items()
              if k not in ("epsilon", "delta", "rho")}
    try:
        mechanism = budget.mechanism("select", args.mechanism, fraction=fractions["select"],
                                     **values)
    except ValueError as e:
        raise UsageError(params.as_flags(str(e))) from None
    topk = pool = None
    if args.top_k is not None:
        if args.top_k < 1 or (args.top_k_bar is not None and args.top_k_bar < args.top_k):
            raise UsageError("--top-k must be an integer >= 1 and --top-k-bar >= --top-k")
        try:
            pool = budget.pay_what_you_get("top-k", max_selections=args.top_k, max_queries=1,
                                           fraction=fractions["top-k"])
            # The pool (k selections, one query) is the whole query's calibration, as
            # beam-dpsu top-k --epsilon E --delta D: its per-selection ε is given here.
            topk = TopKMechanism(k=args.top_k, k_bar=args.top_k_bar,
                                 epsilon_per_selection=pool.epsilon, delta=pool.delta,
                                 max_items=args.top_k_max_items)
        except ValueError as e:
            raise UsageError("--top-k: " + _top_k_flags(str(e))) from None
    return args, Plan(mechanism, topk, budget, pool), beam_args


def _top_k_flags(message: str) -> str:
    """A top-k validation message with select's own top-k flags (``--top-k-max-items``,
    not the key set's ``--max-items-per-user``)."""
    for name, flag in (("max_items_per_user", "--top-k-max-items"), ("max_items", "--top-k-max-items"),
                       ("k_bar", "--top-k-bar")):
        message = message.replace(name, flag)
    return message


def top_k_parser() -> flags.ArgumentParser:
    """``beam-dpsu top-k``'s flags."""
    p = flags.ArgumentParser(_prog("top-k"), _describe("top-k"))
    flags.add_io_arguments(p)
    params.add_arguments(p, ["k", "method", "k_bar", "epsilon", "epsilon_per_selection",
                             "delta", "max_items", "discovery_share"],
                         required=("k",), help={
        "epsilon": f"ε > 0 of the whole query's (ε, δ)-DP guarantee, with or without "
                   f"--with-counts; Algorithm 2's per-selection ε is calibrated from it (a "
                   f"warning above {params.WARN_EPSILON_ABOVE:g}). Privacy: the stated ε",
        "delta": f"δ in (0, 1) of the whole query (with --epsilon-per-selection: the "
                 f"query's threshold δ; a warning above {params.WARN_DELTA_ABOVE:g}). "
                 f"Privacy: the stated δ",
        "method": "'limited-domain' (default: Durfee and Rogers, the true top k̄ ranked, "
                  "pay what you get) or 'discover-peel' (Weighted Gaussian discovers a "
                  "domain, then the peeling exponential mechanism ranks it). Privacy: none: "
                  "--epsilon and --delta are the whole query's with either",
        "max_items": f"Δ, distinct items kept per user (integer in [1, "
                     f"{params.MAX_MAX_ITEMS:,}]); limited-domain: required by "
                     f"--with-counts, default unrestricted (Gumbel only); discover-peel: "
                     f"the discovery's Δ0 (default {params.DEFAULT_MAX_ITEMS}). "
                     f"Privacy: none"})
    flags.add_dead_letter_argument(p)
    params.add_arguments(p, ["with_counts"])
    run_budget.add_arguments(p, ("top-k",))
    return p


def parse_top_k(argv: Optional[Sequence[str]]
                ) -> Tuple[object, Union[TopKMechanism, DiscoverThenPeel], List[str]]:
    """``beam-dpsu top-k``'s flags, parsed and validated: (args, the query's mechanism,
    Beam's arguments); raises UsageError for any user mistake.

    With the budget flags, ``args.budget`` is the ``PrivacyBudget`` the query
    was calibrated from (else None).
    """
    return flags.parse(top_k_parser(), argv, _top_k_mechanism)


def _fixed_max_items(args, command: str) -> None:
    """Top-k and hitting sets take a fixed Δ: ``auto`` is refused in one line."""
    if args.max_items == params.AUTO:
        raise UsageError(f"--max-items-per-user auto applies to select's mechanisms; "
                         f"{command} takes an integer (default {params.DEFAULT_MAX_ITEMS})")


def _top_k_mechanism(args, beam_args: List[str]):
    _fixed_max_items(args, "top-k")
    method = args.method or params.DEFAULT_TOPK_METHOD
    if method not in params.TOPK_METHODS:
        raise UsageError(f"--method must be one of {', '.join(params.TOPK_METHODS)}, "
                         f"got {method!r}")
    if method == "discover-peel":
        return _parse_discover_peel(args, beam_args)
    if args.discovery_share is not None:
        raise UsageError("--discovery-share applies to --method discover-peel only")
    planned = run_budget.plan(args, ("top-k",),
                              replaced=("epsilon", "epsilon_per_selection", "delta"))
    args.budget = args.pool = None
    if args.epsilon is not None and args.epsilon_per_selection is not None:
        raise UsageError("--epsilon (the whole query's guarantee) cannot be given with "
                         "--epsilon-per-selection: give one")
    if args.epsilon_per_selection is not None and args.with_counts:
        raise UsageError("--epsilon-per-selection applies to Algorithm 2 only (without "
                         "--with-counts): Algorithm 1's --epsilon is the whole query's")
    try:
        kwargs = {}
        if planned is None:
            if (args.epsilon is None and args.epsilon_per_selection is None) \
                    or args.delta is None:
                raise UsageError("give --epsilon and --delta (the whole query's guarantee), "
                                 "or the query's total with --budget-epsilon and "
                                 "--budget-delta")
            if args.epsilon_per_selection is not None:
                kwargs["epsilon_per_selection"] = args.epsilon_per_selection
            else:
                kwargs["epsilon"] = args.epsilon
            delta = args.delta
        else:
            args.budget, fractions = planned
            if args.with_counts:
                share = args.budget.take("top-k", fraction=fractions["top-k"])
                kwargs["epsilon"], delta = share.epsilon, share.delta
            else:
                # The pool of k selections and one query is exactly the calibration of
                # --epsilon E --delta D (pay_what_you_get_epsilon(E, D, k, 1)).
                args.pool = args.budget.pay_what_you_get(
                    "top-k", max_selections=args.k, max_queries=1, fraction=fractions["top-k"])
                kwargs["epsilon_per_selection"], delta = args.pool.epsilon, args.pool.delta
        mechanism = TopKMechanism(k=args.k, k_bar=args.k_bar, delta=delta,
                                  max_items=args.max_items, with_counts=bool(args.with_counts),
                                  **kwargs)
    except ValueError as e:
        raise UsageError(params.as_flags(str(e))) from None
    return args, mechanism, beam_args


def _parse_discover_peel(args, beam_args):
    """``--method discover-peel``: its flags, its mechanism (the whole query's ε, δ)."""
    given = [f for f, v in (("--k-bar", args.k_bar), ("--with-counts", args.with_counts),
                            ("--epsilon-per-selection", args.epsilon_per_selection)) if v]
    if given:
        raise UsageError(f"{', '.join(given)} does not apply to --method discover-peel (it "
                         f"ranks the discovered domain; --epsilon and --delta are the whole "
                         f"query's)")
    planned = run_budget.plan(args, ("top-k",), replaced=("epsilon", "delta"))
    args.budget = args.pool = None
    try:
        if planned is None:
            if args.epsilon is None or args.delta is None:
                raise UsageError("give --epsilon and --delta (the whole query's guarantee), "
                                 "or the query's total with --budget-epsilon and "
                                 "--budget-delta")
            epsilon, delta = args.epsilon, args.delta
        else:
            args.budget, fractions = planned
            share = args.budget.take("top-k", fraction=fractions["top-k"])
            epsilon, delta = share.epsilon, share.delta
        mechanism = discover_peel(DiscoverPeelTopK, args, epsilon, delta)
    except ValueError as e:
        raise UsageError(params.as_flags(str(e))) from None
    return args, mechanism, beam_args


def discover_peel(cls, args, epsilon: float, delta: float) -> DiscoverThenPeel:
    """A discovery-then-peel mechanism from the command line's ``--k``,
    ``--max-items-per-user`` and ``--discovery-share`` (their defaults when absent)."""
    return cls(args.k, epsilon, delta,
               params.DEFAULT_MAX_ITEMS if args.max_items is None else args.max_items,
               params.DEFAULT_DISCOVERY_SHARE if args.discovery_share is None
               else args.discovery_share)


def hitting_set_parser() -> flags.ArgumentParser:
    """``beam-dpsu hitting-set``'s flags."""
    p = flags.ArgumentParser(_prog("hitting-set"), _describe("hitting-set"))
    flags.add_io_arguments(p)
    params.add_arguments(p, ["k", "epsilon", "delta", "max_items", "discovery_share"],
                         required=("k", "epsilon", "delta"), help={
        "k": "the number of items to choose (integer >= 1): k peeling rounds, each the "
             "item that hits the most users not hit yet (always k items when the discovered "
             "domain has k). Privacy: none; the peeling's ε is split over the k rounds",
        "epsilon": "ε > 0 of the whole release's (ε, δ)-DP guarantee (discovery and "
                   "peeling). Privacy: the stated ε",
        "delta": "δ in (0, 1) of the whole release. Privacy: the stated δ",
        "max_items": f"Δ0 of the discovery stage: distinct items each user contributes to "
                     f"it (integer >= 1; default {params.DEFAULT_MAX_ITEMS}); the peeling "
                     f"stage counts every item. Privacy: none"})
    flags.add_dead_letter_argument(p)
    return p


def parse_hitting_set(argv: Optional[Sequence[str]]
                      ) -> Tuple[object, DiscoverThenPeel, List[str]]:
    """``beam-dpsu hitting-set``'s flags, parsed and validated: (args, the release's
    mechanism, Beam's arguments); raises UsageError for any user mistake."""
    return flags.parse(hitting_set_parser(), argv, _hitting_set_mechanism)


def _hitting_set_mechanism(args, beam_args: List[str]):
    _fixed_max_items(args, "hitting-set")
    try:
        mechanism = discover_peel(DiscoverPeelHittingSet, args, args.epsilon,
                                        args.delta)
    except ValueError as e:
        raise UsageError(params.as_flags(str(e))) from None
    return args, mechanism, beam_args


#: command → the function that parses and validates its arguments
PARSERS: Dict[str, Callable[[Optional[Sequence[str]]], tuple]] = {
    "select": parse_select, "top-k": parse_top_k, "hitting-set": parse_hitting_set}


def check(command: str, argv: Sequence[str]) -> None:
    """Raises UsageError when ``argv`` cannot run as ``beam-dpsu COMMAND`` (no data is
    read, nothing is written; ``--help`` prints the help and exits 0, as argparse
    does). Nothing for a command without a parser here (``compare`` parses its own
    flags; the others import no Beam)."""
    parse = PARSERS.get(command)
    if parse is not None:
        parse(list(argv))
