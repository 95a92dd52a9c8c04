"""Differentially private set union of a text file of user-keyed items.

Usage::

    python -m pipelines.select_partitions --input PATH --output PREFIX --mechanism NAME
        [--epsilon E] [--delta D] [--rho R] [--max-items-per-user N] [--alpha A]
        [--rounds I] [--ratio r] [--public-counts PATH] [--tie-break T] [--seed S]
        [--eta H] [--variant cascade-free|published --allow-unproven]
        [any Beam pipeline option, e.g. --runner=DirectRunner]

Input: text files (glob allowed, ``.gz``/``.bz2`` decompressed), one
``user_id<TAB>item`` line per occurrence. Malformed lines are counted and
skipped.

Output: the released items, one per line, in ``PREFIX-items-*``; a JSON summary
at ``PREFIX.json`` with the guarantee, the calibration and run statistics.
``num_users`` and ``malformed_lines`` in the summary are exact counts for the
data owner: they are NOT differentially private and must not be published.

Bad parameters exit with status 2 and a one-line message before any data is
read; other failures exit with status 1 and a one-line message.
"""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence, Tuple

import apache_beam as beam

from beam_dpsu.mechanisms import Mechanism, SelectPartitions
from beam_dpsu.noise import RunKey
from beam_dpsu.registry import REGISTRY, MechanismParams, make_mechanism
from beam_dpsu.textio import ReadUserItems
from pipelines import common
from pipelines.common import UsageError  # noqa: F401  (re-exported for callers)

PROG = "select_partitions"


def build_parser() -> common.ArgumentParser:
    p = common.ArgumentParser(PROG, __doc__.split("\n")[0])
    common.add_io_arguments(p)
    p.add_argument("--mechanism", required=True,
                   help="one of: " + ", ".join(sorted(REGISTRY)))
    p.add_argument("--epsilon", type=float, help="ε of the (ε, δ)-DP guarantee (> 0)")
    p.add_argument("--delta", type=float, help="δ (0 < δ < 1); for zCDP, the approximate-zCDP δ")
    p.add_argument("--rho", type=float, help="ρ of ρ-zCDP (> 0), for zCDP mechanisms")
    p.add_argument("--max-items-per-user", dest="max_items", type=int,
                   help="Δ0, distinct items kept per user (integer >= 1; default 100)")
    p.add_argument("--alpha", type=float, help="cutoff multiplier α of the sequential policies")
    p.add_argument("--rounds", type=int, help="number of DP-SIPS rounds I (>= 1)")
    p.add_argument("--ratio", type=float, help="DP-SIPS budget ratio r (> 0)")
    p.add_argument("--public-counts", help="file of item<TAB>count lines (gw-kt)")
    p.add_argument("--tie-break", dest="tie_break",
                   help="gw, gw-kt: order of a user's items of equal frequency, 'item-hash' "
                        "(default, keyed hash) or 'first-occurrence' (the user's record "
                        "order, as the authors' code); no privacy effect")
    p.add_argument("--variant", help="gw, gw-kt: 'cascade-free' (default, proven) or "
                   "'published' (NOT proven private; needs --allow-unproven)")
    p.add_argument("--eta", type=float, help="gw, gw-kt: step-1 budget η in (0, 1) (default 0.001)")
    p.add_argument("--allow-unproven", action="store_true", default=None,
                   help="research only: allow a variant whose privacy is not proven")
    common.add_dead_letter_argument(p)
    return p


def parse_args(argv: Optional[Sequence[str]]) -> Tuple[object, Mechanism, List[str]]:
    """Parses and validates everything; raises UsageError for any user mistake."""
    args, beam_args = common.parse_known(build_parser(), argv)
    params = MechanismParams.from_namespace(args)
    try:
        mechanism = make_mechanism(args.mechanism, params)
    except ValueError as e:
        raise UsageError(common.flag_names(str(e))) from None
    return args, mechanism, beam_args


def _to_line(item) -> str:
    return item if isinstance(item, str) else str(item)


def build_pipeline(p: beam.Pipeline, input_pattern: str, output_prefix: str,
                   mechanism: Mechanism, run_key: RunKey,
                   dead_letter: Optional[str] = None) -> None:
    """Adds the read → select → write graph to ``p``."""
    reader = ReadUserItems(input_pattern, keep_order=mechanism.needs_record_order)
    per_user = (p
                | "ReadUserItems" >> reader
                | "CountUsers" >> beam.ParDo(common.CountUsers()))
    common.write_dead_letter(reader.malformed, dead_letter)
    items = per_user | "SelectPartitions" >> SelectPartitions(mechanism, run_key, per_user=True)
    (items
     | "ToLine" >> beam.Map(_to_line)
     | "WriteItems" >> beam.io.WriteToText(output_prefix + "-items"))


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs the pipeline; returns the summary (also written to PREFIX.json)."""
    args, mechanism, beam_args = parse_args(argv)
    common.check_locations(args.input, args.output, args.dead_letter)
    run_key = common.make_run_key(args.seed)
    result, wall, runner = common.run_pipeline(
        beam_args, lambda p: build_pipeline(p, args.input, args.output, mechanism, run_key,
                                            args.dead_letter))
    summary = dict(mechanism.describe())
    for i, entry in enumerate(summary.get("per_round") or []):
        entry["released"] = common.counter(result, f"released_round_{i}")
    summary.update(common.run_summary(result, args, run_key, runner, wall))
    summary.update(common.dead_letter_summary(args.dead_letter))
    summary["note"] = (common.NOT_PRIVATE_NOTE + " Only the released items are covered by the "
                       "guarantee." + (common.DEAD_LETTER_NOTE if args.dead_letter else ""))
    common.write_summary(args.output, summary)
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.main_wrapper(PROG, run, argv,
                               ("mechanism", "epsilon", "delta", "num_released", "wall_seconds"))


if __name__ == "__main__":
    sys.exit(main())
