"""Differentially private set union of a text file of user-keyed items.

Usage::

    python -m pipelines.select_partitions --input PATH --output PREFIX --mechanism NAME
        [--epsilon E] [--delta D] [--rho R] [--max-items-per-user N] [--alpha A]
        [--rounds I] [--ratio r] [--public-counts PATH] [--seed S]
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

import argparse
import json
import logging
import re
import sys
import time
from typing import List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam import coders
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_dpsu import __version__
from beam_dpsu.mechanisms import Mechanism, SelectPartitions
from beam_dpsu.registry import REGISTRY, MechanismParams, make_mechanism
from beam_dpsu.noise import RunKey
from beam_dpsu.textio import ReadUserItems, match_files

PROG = "select_partitions"


class UsageError(Exception):
    """A user mistake: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n")[0], allow_abbrev=False,
                add_help=True)
    p.add_argument("--input", required=True, help="input file or glob of user<TAB>item lines")
    p.add_argument("--output", required=True,
                   help="output prefix: items go to PREFIX-items-*, the summary to PREFIX.json")
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
    p.add_argument("--dead-letter", dest="dead_letter",
                   help="write the malformed input lines to files PATH-* for the data owner "
                        "(they are private input, not a release)")
    p.add_argument("--seed", type=int,
                   help="TEST ONLY: derive all randomness from this seed (the run is then "
                        "not private against anyone who knows the seed)")
    return p


def _beam_option_parser() -> argparse.ArgumentParser:
    """A parser that knows every registered Beam pipeline option."""
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    seen = set()
    stack = list(PipelineOptions.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
        try:
            cls._add_argparse_args(parser)
        except argparse.ArgumentError:
            pass  # an option registered by two classes
    return parser


def parse_args(argv: Sequence[str]) -> Tuple[argparse.Namespace, Mechanism, List[str]]:
    """Parses and validates everything; raises UsageError for any user mistake."""
    args, beam_args = build_parser().parse_known_args(argv)
    _, unknown = _beam_option_parser().parse_known_args(beam_args)
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")
    params = MechanismParams(epsilon=args.epsilon, delta=args.delta, rho=args.rho,
                             max_items=args.max_items, alpha=args.alpha, rounds=args.rounds,
                             ratio=args.ratio, public_counts=args.public_counts)
    try:
        mechanism = make_mechanism(args.mechanism, params)
    except ValueError as e:
        raise UsageError(_flag_names(str(e))) from None
    return args, mechanism, beam_args


def _flag_names(message: str) -> str:
    """Names parameters in a validation message as the command-line flags."""
    message = message.replace("max_items_per_user", "--max-items-per-user")
    return re.sub(r"^(epsilon|delta|rho|alpha|rounds|ratio) ", r"--\1 ", message)


class _CountUsers(beam.DoFn):
    def __init__(self):
        self._users = beam.metrics.Metrics.counter("beam_dpsu", "users")

    def process(self, element):
        self._users.inc()
        yield element


def _repeat_line(element):
    line, n = element
    return [line] * n


def build_pipeline(p: beam.Pipeline, input_pattern: str, output_prefix: str,
                   mechanism: Mechanism, run_key: RunKey,
                   dead_letter: Optional[str] = None) -> None:
    """Adds the read → select → write graph to ``p``."""
    reader = ReadUserItems(input_pattern)
    per_user = (p
                | "ReadUserItems" >> reader
                | "CountUsers" >> beam.ParDo(_CountUsers()))
    if dead_letter:
        (reader.malformed
         | "RepeatMalformed" >> beam.FlatMap(_repeat_line)
         | "WriteDeadLetter" >> beam.io.WriteToText(dead_letter, coder=coders.BytesCoder()))
    items = per_user | "SelectPartitions" >> SelectPartitions(mechanism, run_key, per_user=True)
    (items
     | "ToLine" >> beam.Map(_to_line)
     | "WriteItems" >> beam.io.WriteToText(output_prefix + "-items"))


def _to_line(item) -> str:
    return item if isinstance(item, str) else str(item)


def _counter(result, name: str) -> Optional[int]:
    try:
        counters = result.metrics().query(MetricsFilter().with_namespace("beam_dpsu")
                                          .with_name(name))["counters"]
    except Exception:  # a runner without metrics support
        return None
    if not counters:
        return 0
    return int(sum((c.committed if c.committed is not None else c.attempted) or 0
                   for c in counters))


def _count_output_lines(prefix: str) -> int:
    total = 0
    for path in match_files(prefix + "-items-*"):
        with FileSystems.open(path) as f:
            total += sum(1 for _ in f)
    return total


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs the pipeline; returns the summary (also written to PREFIX.json)."""
    args, mechanism, beam_args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if not match_files(args.input):
        raise UsageError(f"no input file matches {args.input!r}")
    run_key = RunKey.from_test_seed(args.seed) if args.seed is not None else RunKey.fresh()
    if run_key.seeded:
        logging.warning("seeded run (--seed): NOT private against anyone who knows the seed")
    options = PipelineOptions(beam_args)
    runner = options.view_as(StandardOptions).runner or "DirectRunner"

    start = time.time()
    p = beam.Pipeline(options=options)
    build_pipeline(p, args.input, args.output, mechanism, run_key, args.dead_letter)
    result = p.run()
    result.wait_until_finish()
    wall = time.time() - start

    released = _counter(result, "released")
    if released is None:
        released = _count_output_lines(args.output)
    summary = dict(mechanism.describe())
    for i, entry in enumerate(summary.get("per_round") or []):
        entry["released"] = _counter(result, f"released_round_{i}")
    summary.update({
        "num_users": _counter(result, "users"),
        "num_released": released,
        "malformed_lines": _counter(result, "malformed_lines"),
        "seeded": run_key.seeded,
        "runner": runner,
        "wall_seconds": round(wall, 3),
        "input": args.input,
        "items_output": args.output + "-items-*",
        "beam_dpsu_version": __version__,
        "not_private": ["num_users", "malformed_lines"],
        "dead_letter": (args.dead_letter + "-*") if args.dead_letter else None,
        "note": "num_users and malformed_lines are exact counts for the data owner; they are "
                "not differentially private. Only the released items are covered by the "
                "guarantee." + (" The dead-letter files hold private input lines: they are "
                                "not a release and must not be published."
                                if args.dead_letter else ""),
    })
    with FileSystems.create(args.output + ".json") as f:
        f.write((json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        summary = run(argv)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a failure while running: one line, details in the log
        logging.debug("pipeline failed", exc_info=True)
        msg = str(e).strip().splitlines()
        print(f"{PROG}: failed: {type(e).__name__}: {msg[-1] if msg else ''}", file=sys.stderr)
        return 1
    print(json.dumps({k: summary[k] for k in ("mechanism", "epsilon", "delta", "num_released",
                                                "wall_seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
