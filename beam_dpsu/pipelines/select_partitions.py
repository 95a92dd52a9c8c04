"""Differentially private set union of a text file of user-keyed items.

Usage::

    beam-dpsu select --input PATH --output PREFIX --mechanism NAME
        [--epsilon E] [--delta D] [--rho R] [--max-items-per-user N] [--alpha A]
        [--rounds I] [--ratio r] [--public-counts PATH] [--tie-break T] [--eta H]
        [--variant cascade-free|published --allow-unproven] [--overwrite]
        [--dead-letter PATH] [--insecure-test-seed N]
        [any Beam pipeline option, e.g. --runner=DirectRunner]

Input: text files (glob allowed, ``.gz``/``.bz2`` decompressed), one
``user_id<TAB>item`` line per occurrence. Malformed lines are counted and
skipped, with a one-line warning giving their number; input without a single
well-formed line exits with status 1 and releases nothing.

Output (see ``beam_dpsu.pipelines.common``):

* ``PREFIX-items-00000-of-00001``: the released items, one per line, sorted
  (the order depends on the released set alone);
* ``PREFIX.json``: what may be published with them: mechanism, guarantee,
  calibration, number released (per round for DP-SIPS), library version,
  whether an insecure test seed was used;
* ``PREFIX.PRIVATE-run-details.json`` (mode 0600): exact user and
  malformed-line counts, input, runner, timings: for the data owner, NEVER
  to be published.

Outputs of an earlier run under ``PREFIX`` are refused unless ``--overwrite``
is given, which deletes them first. ``--insecure-test-seed N`` (tests only)
makes the run reproducible and NOT private.

Bad parameters and locations exit with status 2 and a one-line message before
any data is read; other failures exit with status 1 and a one-line message.
"""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence, Tuple

import apache_beam as beam

from beam_dpsu.mechanisms import Mechanism, SelectPartitions, params
from beam_dpsu.noise import RunKey
from beam_dpsu.registry import REGISTRY, MechanismParams, make_mechanism
from beam_dpsu.textio import ReadUserItems
from beam_dpsu.pipelines import common
from beam_dpsu.pipelines.common import UsageError  # noqa: F401  (re-exported for callers)

PROG = "select_partitions"


def build_parser() -> common.ArgumentParser:
    p = common.ArgumentParser(PROG, __doc__.split("\n")[0])
    common.add_io_arguments(p)
    p.add_argument("--mechanism", required=True,
                   help="one of: " + ", ".join(sorted(REGISTRY)))
    params.add_arguments(p, list(params.MECHANISM_PARAMS))
    common.add_dead_letter_argument(p)
    return p


def parse_args(argv: Optional[Sequence[str]]) -> Tuple[object, Mechanism, List[str]]:
    """Parses and validates everything; raises UsageError for any user mistake."""
    args, beam_args = common.parse_known(build_parser(), argv)
    try:
        mechanism = make_mechanism(args.mechanism, MechanismParams.from_namespace(args))
    except ValueError as e:
        raise UsageError(params.as_flags(str(e))) from None
    return args, mechanism, beam_args


def _to_line(item) -> str:
    return item if isinstance(item, str) else str(item)


def build_pipeline(p: beam.Pipeline, input_pattern: str, output_prefix: str,
                   mechanism: Mechanism, run_key: RunKey,
                   dead_letter: Optional[str] = None) -> None:
    """Adds the read → select → write graph to ``p`` (one sorted items file).

    The users of a single input file read whole (``ReadUserItems(...,
    complete_users=True)``) go to the mechanism without the per-user merge;
    the others are merged first. Each user is in exactly one of the two parts.
    """
    users, complete, malformed = p | "ReadUserItems" >> ReadUserItems(
        input_pattern, keep_order=mechanism.needs_record_order, with_malformed=True,
        complete_users=True)
    per_user = users | "CountUsers" >> beam.ParDo(common.CountUsers())
    complete = complete | "CountCompleteUsers" >> beam.ParDo(common.CountUsers())
    common.write_dead_letter(malformed, dead_letter)
    items = ((per_user, complete)
             | "SelectPartitions" >> SelectPartitions(mechanism, run_key, per_user=True))
    common.write_items(items | "ToLine" >> beam.Map(_to_line), output_prefix)


def public_fields(mechanism: Mechanism, result, released: int) -> dict:
    """The publishable summary: the mechanism's ``describe()`` with, for DP-SIPS,
    the number released by each round."""
    fields = dict(mechanism.describe())
    for i, entry in enumerate(fields.get("per_round") or []):
        entry["released"] = common.counter(result, f"released_round_{i}")
    return fields


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs the pipeline; returns the public summary (also written to PREFIX.json) with
    the owner-only details (PREFIX.PRIVATE-run-details.json) under "PRIVATE_run_details"."""
    return common.run_query(argv, parse_args, build_pipeline, public_fields)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.main_wrapper(PROG, run, argv,
                               ("mechanism", "epsilon", "delta", "num_released"))


if __name__ == "__main__":  # python -m beam_dpsu.pipelines.X: see beam_dpsu.cli
    sys.exit(main())
