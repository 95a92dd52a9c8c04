"""Differentially private top-k items of a text file of user-keyed items (Durfee and Rogers).

Usage::

    python -m pipelines.top_k --input PATH --output PREFIX --k K [--k-bar KBAR]
        --epsilon E --delta D [--max-items-per-user N] [--with-counts] [--seed S]
        [any Beam pipeline option, e.g. --runner=DirectRunner]

Input: text files (glob allowed, ``.gz``/``.bz2`` decompressed), one
``user_id<TAB>item`` line per occurrence. Malformed lines are counted and
skipped.

Without ``--with-counts`` this is Algorithm 2 (Gumbel): ``--epsilon`` is the ε
of each bounded-range selection, and the query is charged ``ℓ + 1`` selections
(``k`` when it released ``ℓ = k`` items) and δ ("pay what you get", see
``beam_dpsu.accounting.PayWhatYouGetAccountant``); ``--max-items-per-user`` is
optional (Δ-restricted sensitivity). With ``--with-counts`` it is Algorithm 1
(Laplace, needs ``--max-items-per-user``): ``--epsilon`` is the ε of the whole
query and noisy counts (on a discrete grid) are released.

Output: ``PREFIX-items-00000-of-00001`` with lines ``rank<TAB>item`` (or
``rank<TAB>item<TAB>noisy_count``), rank 1 first; a JSON summary at
``PREFIX.json`` with the calibration, the query's stand-alone guarantee and its
charge. ``num_users`` and ``malformed_lines`` are exact counts for the data
owner: they are NOT differentially private and must not be published.

Bad parameters exit with status 2 and a one-line message before any data is
read; other failures exit with status 1 and a one-line message.
"""
from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_dpsu import __version__
from beam_dpsu.noise import RunKey
from beam_dpsu.textio import ReadUserItems, match_files
from beam_dpsu.topk import TopK, TopKMechanism, format_line
from pipelines.select_partitions import UsageError, _beam_option_parser, _counter, _Parser

PROG = "top_k"


def build_parser():
    p = _Parser(prog=PROG, description=__doc__.split("\n")[0], allow_abbrev=False,
                add_help=True)
    p.add_argument("--input", required=True, help="input file or glob of user<TAB>item lines")
    p.add_argument("--output", required=True,
                   help="output prefix: ranked items go to PREFIX-items-*, the summary to "
                        "PREFIX.json")
    p.add_argument("--k", type=int, required=True, help="the most items to release (>= 1)")
    p.add_argument("--k-bar", dest="k_bar", type=int,
                   help="candidates k̄ >= k (the true top k̄ are noised; default k)")
    p.add_argument("--epsilon", type=float, required=True,
                   help="ε > 0: per selection (Gumbel), or of the query (--with-counts)")
    p.add_argument("--delta", type=float, required=True, help="δ of the query (0 < δ < 1)")
    p.add_argument("--max-items-per-user", dest="max_items", type=int,
                   help="Δ, distinct items kept per user (integer >= 1); required by "
                        "--with-counts; default: unrestricted (Gumbel only)")
    p.add_argument("--with-counts", action="store_true",
                   help="Algorithm 1 (Laplace): also release noisy counts")
    p.add_argument("--seed", type=int,
                   help="TEST ONLY: derive all randomness from this seed (the run is then "
                        "not private against anyone who knows the seed)")
    return p


def _flag_names(message: str) -> str:
    message = message.replace("max_items_per_user", "--max-items-per-user")
    message = message.replace("with_counts", "--with-counts")
    message = re.sub(r"\bk_bar\b", "--k-bar", message)
    return re.sub(r"^(epsilon|delta|k) ", r"--\1 ", message)


def parse_args(argv: Sequence[str]) -> Tuple[object, TopKMechanism, List[str]]:
    """Parses and validates everything; raises UsageError for any user mistake."""
    args, beam_args = build_parser().parse_known_args(argv)
    _, unknown = _beam_option_parser().parse_known_args(beam_args)
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        mechanism = TopKMechanism(k=args.k, k_bar=args.k_bar, epsilon=args.epsilon,
                                  delta=args.delta, max_items=args.max_items,
                                  with_counts=args.with_counts)
    except ValueError as e:
        raise UsageError(_flag_names(str(e))) from None
    return args, mechanism, beam_args


class _CountUsers(beam.DoFn):
    def __init__(self):
        self._users = beam.metrics.Metrics.counter("beam_dpsu", "users")

    def process(self, element):
        self._users.inc()
        yield element


def _ranked_text(rows) -> List[str]:
    rows = sorted(rows, key=lambda r: r[0])
    return ["\n".join(format_line(r) for r in rows)] if rows else []


def build_pipeline(p: beam.Pipeline, input_pattern: str, output_prefix: str,
                   mechanism: TopKMechanism, run_key: RunKey) -> None:
    """Adds the read → top-k → write graph to ``p`` (one output file, rank order)."""
    (p
     | "ReadUserItems" >> ReadUserItems(input_pattern)
     | "CountUsers" >> beam.ParDo(_CountUsers())
     | "TopK" >> TopK(mechanism, run_key, per_user=True)
     | "Collect" >> beam.combiners.ToList()
     | "RankOrder" >> beam.FlatMap(_ranked_text)
     | "WriteItems" >> beam.io.WriteToText(output_prefix + "-items", num_shards=1))


def _count_output_lines(prefix: str) -> int:
    total = 0
    for path in match_files(prefix + "-items-*"):
        with FileSystems.open(path) as f:
            total += sum(1 for line in f if line.strip())
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
    build_pipeline(p, args.input, args.output, mechanism, run_key)
    result = p.run()
    result.wait_until_finish()
    wall = time.time() - start

    released = _counter(result, "released")
    if released is None:
        released = _count_output_lines(args.output)
    summary = dict(mechanism.describe())
    summary.update({
        "num_users": _counter(result, "users"),
        "num_released": released,
        "charge": mechanism.charge(released),
        "malformed_lines": _counter(result, "malformed_lines"),
        "seeded": run_key.seeded,
        "runner": runner,
        "wall_seconds": round(wall, 3),
        "input": args.input,
        "items_output": args.output + "-items-*",
        "beam_dpsu_version": __version__,
        "not_private": ["num_users", "malformed_lines"],
        "note": "num_users and malformed_lines are exact counts for the data owner; they are "
                "not differentially private. Only the ranked items (and, with --with-counts, "
                "their noisy counts) are covered by the guarantee.",
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
                                                "charge", "wall_seconds")},
                     ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
