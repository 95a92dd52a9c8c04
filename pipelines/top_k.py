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

import sys
from typing import List, Optional, Sequence, Tuple

import apache_beam as beam

from beam_dpsu.noise import RunKey
from beam_dpsu.textio import ReadUserItems
from beam_dpsu.topk import TopK, TopKMechanism, format_line
from pipelines import common
from pipelines.common import UsageError

PROG = "top_k"


def build_parser():
    p = common.ArgumentParser(PROG, __doc__.split("\n")[0])
    common.add_io_arguments(p)
    p.add_argument("--k", type=int, required=True, help="the most items to release (>= 1)")
    p.add_argument("--k-bar", dest="k_bar", type=int,
                   help="candidates k̄ >= k (the true top k̄ are noised; default k)")
    p.add_argument("--epsilon", type=float, required=True,
                   help="ε > 0: per selection (Gumbel), or of the query (--with-counts)")
    p.add_argument("--delta", type=float, required=True, help="δ of the query (0 < δ < 1)")
    p.add_argument("--max-items-per-user", dest="max_items", type=int,
                   help="Δ, distinct items kept per user (integer >= 1); required by "
                        "--with-counts; default: unrestricted (Gumbel only)")
    common.add_dead_letter_argument(p)
    p.add_argument("--with-counts", action="store_true",
                   help="Algorithm 1 (Laplace): also release noisy counts")
    return p


def parse_args(argv: Optional[Sequence[str]]) -> Tuple[object, TopKMechanism, List[str]]:
    """Parses and validates everything; raises UsageError for any user mistake."""
    args, beam_args = common.parse_known(build_parser(), argv)
    try:
        mechanism = TopKMechanism(k=args.k, k_bar=args.k_bar, epsilon=args.epsilon,
                                  delta=args.delta, max_items=args.max_items,
                                  with_counts=args.with_counts)
    except ValueError as e:
        raise UsageError(common.flag_names(str(e), ("k_bar", "with_counts"))) from None
    return args, mechanism, beam_args


def _ranked_text(rows) -> List[str]:
    rows = sorted(rows, key=lambda r: r[0])
    return ["\n".join(format_line(r) for r in rows)] if rows else []


def build_pipeline(p: beam.Pipeline, input_pattern: str, output_prefix: str,
                   mechanism: TopKMechanism, run_key: RunKey,
                   dead_letter: Optional[str] = None) -> None:
    """Adds the read → top-k → write graph to ``p`` (one output file, rank order)."""
    reader = ReadUserItems(input_pattern)
    per_user = p | "ReadUserItems" >> reader
    common.write_dead_letter(reader.malformed, dead_letter)
    (per_user
     | "CountUsers" >> beam.ParDo(common.CountUsers())
     | "TopK" >> TopK(mechanism, run_key, per_user=True)
     | "Collect" >> beam.combiners.ToList()
     | "RankOrder" >> beam.FlatMap(_ranked_text)
     | "WriteItems" >> beam.io.WriteToText(output_prefix + "-items", num_shards=1))


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs the pipeline; returns the summary (also written to PREFIX.json)."""
    args, mechanism, beam_args = parse_args(argv)
    common.check_locations(args.input, args.output, args.dead_letter)
    run_key = common.make_run_key(args.seed)
    result, wall, runner = common.run_pipeline(
        beam_args, lambda p: build_pipeline(p, args.input, args.output, mechanism, run_key,
                                            args.dead_letter))
    summary = dict(mechanism.describe())
    summary.update(common.run_summary(result, args, run_key, runner, wall))
    summary["charge"] = mechanism.charge(summary["num_released"])
    summary.update(common.dead_letter_summary(args.dead_letter))
    summary["note"] = (common.NOT_PRIVATE_NOTE + " Only the ranked items (and, with "
                       "--with-counts, their noisy counts) are covered by the guarantee." +
                       (common.DEAD_LETTER_NOTE if args.dead_letter else ""))
    common.write_summary(args.output, summary)
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.main_wrapper(PROG, run, argv, ("mechanism", "epsilon", "delta", "num_released",
                                                 "charge", "wall_seconds"))


if __name__ == "__main__":
    sys.exit(main())
