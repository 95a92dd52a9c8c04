"""Differentially private top-k items of a text file of user-keyed items (Durfee and Rogers).

Usage::

    beam-dpsu top-k --input PATH --output PREFIX --k K [--k-bar KBAR]
        (--epsilon E --delta D | --budget-epsilon E --budget-delta D)
        [--max-items-per-user N] [--with-counts] [--overwrite]
        [--dead-letter PATH] [--insecure-test-seed N]
        [any Beam pipeline option, e.g. --runner=DirectRunner]

Input: text files (glob allowed, ``.gz``/``.bz2`` decompressed), one
``user_id<TAB>item`` line per occurrence. Malformed lines are counted and
skipped, with a one-line warning; input without a well-formed line exits with
status 1 and releases nothing.

Without ``--with-counts`` this is Algorithm 2 (Gumbel): ``--epsilon`` is the ε
of each bounded-range selection, and the query is charged ``ℓ + 1`` selections
(``k`` when it released ``ℓ = k`` items) and δ ("pay what you get", see
``beam_dpsu.dp.accounting.PayWhatYouGetAccountant``); ``--max-items-per-user`` is
optional (Δ-restricted sensitivity). The summary's and stdout's ``epsilon`` is
the stand-alone guarantee of the whole query (k selections); the flag's value
is ``epsilon_per_selection``. With ``--with-counts`` it is Algorithm 1
(Laplace, needs ``--max-items-per-user``): ``--epsilon`` is the ε of the whole
query and noisy counts (on a discrete grid) are released.

``--budget-epsilon E --budget-delta D`` instead states the guarantee of the
whole query and lets the command calibrate it: Algorithm 2's per-selection ε
is the largest whose budget of ``k`` selections and one query is within
(E, D) (``beam_dpsu.dp.budget.pay_what_you_get_epsilon``); Algorithm 1 gets
(E, D). ``PREFIX.json`` then also holds the budget's statement under
``budget`` (see ``beam_dpsu.pipelines.run_budget``).

Output: ``PREFIX-items-00000-of-00001`` with lines ``rank<TAB>item`` (or
``rank<TAB>item<TAB>noisy_count``), rank 1 first (the rank order is part of
the private output); ``PREFIX.json``, publishable, with the calibration, the
query's guarantee and its charge; ``PREFIX.PRIVATE-run-details.json`` (mode
0600), the exact counts, input and timings for the data owner, NEVER to be
published. Outputs of an earlier run are refused unless ``--overwrite``.

Bad parameters exit with status 2 and a one-line message before any data is
read; other failures exit with status 1 and a one-line message.
"""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence, Tuple

import apache_beam as beam

from beam_dpsu.dp import params
from beam_dpsu.dp.noise import RunKey
from beam_dpsu.transforms.textio import ReadUserItems, match_sized, split_one_file
from beam_dpsu.transforms.topk import TopK
from beam_dpsu.dp.mechanisms.topk import TopKMechanism, format_line
from beam_dpsu.pipelines.cli import UsageError
from beam_dpsu.pipelines import run_budget, flags, outputs, runs

__all__ = ["PROG", "build_parser", "parse_args", "ranked_text", "build_pipeline", "public_fields",
           "run", "main"]


PROG = "top_k"


def build_parser():
    p = flags.ArgumentParser(PROG, __doc__.split("\n")[0])
    flags.add_io_arguments(p)
    params.add_arguments(p, ["k", "k_bar", "epsilon", "delta", "max_items"],
                         required=("k",), help={
        "epsilon": "ε > 0: per selection (Gumbel), or of the query (--with-counts)",
        "delta": "δ of the query (0 < δ < 1)",
        "max_items": "Δ, distinct items kept per user (integer >= 1); required by "
                     "--with-counts; default: unrestricted (Gumbel only)"})
    flags.add_dead_letter_argument(p)
    params.add_arguments(p, ["with_counts"])
    run_budget.add_arguments(p, ("top-k",))
    return p


def parse_args(argv: Optional[Sequence[str]]) -> Tuple[object, TopKMechanism, List[str]]:
    """Parses and validates everything; raises UsageError for any user mistake.

    With the budget flags, ``args.budget`` is the ``PrivacyBudget`` the query
    was calibrated from (else None).
    """
    args, beam_args = flags.parse_known(build_parser(), argv)
    planned = run_budget.plan(args, ("top-k",), replaced=("epsilon", "delta"))
    args.budget = args.pool = None
    try:
        if planned is None:
            if args.epsilon is None or args.delta is None:
                raise UsageError("give --epsilon and --delta, or the query's total with "
                                 "--budget-epsilon and --budget-delta")
            epsilon, delta = args.epsilon, args.delta
        else:
            args.budget, fractions = planned
            if args.with_counts:
                share = args.budget.take("top-k", fraction=fractions["top-k"])
                epsilon, delta = share.epsilon, share.delta
            else:
                args.pool = args.budget.pay_what_you_get(
                    "top-k", max_selections=args.k, max_queries=1, fraction=fractions["top-k"])
                epsilon, delta = args.pool.epsilon, args.pool.delta
        mechanism = TopKMechanism(k=args.k, k_bar=args.k_bar, epsilon=epsilon,
                                  delta=delta, max_items=args.max_items,
                                  with_counts=args.with_counts)
    except ValueError as e:
        raise UsageError(params.as_flags(str(e))) from None
    return args, mechanism, beam_args


def ranked_text(rows) -> List[str]:
    rows = sorted(rows, key=lambda r: r[0])
    return ["\n".join(format_line(r) for r in rows)] if rows else []


def build_pipeline(p: beam.Pipeline, input_pattern: str, output_prefix: str,
                   mechanism: TopKMechanism, run_key: RunKey,
                   dead_letter: Optional[str] = None) -> None:
    """Adds the read → top-k → write graph to ``p`` (one output file, rank order).

    One input file on the DirectRunner's several workers is read with
    ``split_files=True`` (``textio.split_one_file``); the users are the same."""
    per_user, malformed = p | "ReadUserItems" >> ReadUserItems(
        input_pattern, with_malformed=True,
        split_files=split_one_file(p, match_sized(input_pattern)))
    outputs.write_dead_letter(malformed, dead_letter)
    ranked = (per_user
              | "CountUsers" >> beam.ParDo(runs.CountUsers())
              | "TopK" >> TopK(mechanism, run_key, per_user=True))
    outputs.write_items(ranked, output_prefix, arrange=ranked_text)


def public_fields(mechanism: TopKMechanism, released: int) -> dict:
    """The publishable summary: ``epsilon``/``delta`` are the whole query's guarantee."""
    fields = dict(mechanism.describe())
    query = fields["query_guarantee"]
    fields["epsilon_per_selection"] = None if mechanism.with_counts else mechanism.epsilon
    fields["epsilon"], fields["delta"] = query["epsilon"], query["delta"]
    fields["epsilon_meaning"] = (
        "the stand-alone guarantee of the whole query" +
        ("" if mechanism.with_counts else
         f" ({mechanism.k} selections of epsilon_per_selection each); its pay-what-you-get "
         f"charge is in 'charge'"))
    fields["charge"] = mechanism.charge(released)
    return fields


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs the pipeline; returns the public summary (also written to PREFIX.json) with
    the owner-only details (PREFIX.PRIVATE-run-details.json) under "PRIVATE_run_details"."""
    args, mechanism, beam_args = parse_args(argv)

    def fields(result, released):
        out = public_fields(mechanism, released)
        if args.budget is not None:
            if args.pool is not None:
                args.pool.record(mechanism.k, released)  # "spent" fields: information only
            out["budget"] = args.budget.describe()
            out["units"] = dict(out.get("units") or {}, budget=(
                "the budget the query was calibrated from: total, share, stated guarantee"))
        return out

    return runs.run_release(
        args, beam_args,
        lambda p, run_key: build_pipeline(p, args.input, args.output, mechanism, run_key,
                                          args.dead_letter), fields)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return runs.main_wrapper(PROG, run, argv, ("mechanism", "epsilon", "delta",
                                                 "epsilon_per_selection", "num_released",
                                                 "charge"))


if __name__ == "__main__":
    # Runs the importable module (not this __main__ copy), so that what a runner
    # pickles refers to beam_dpsu.pipelines.top_k, one name on every worker.
    from beam_dpsu.pipelines import cli as _cli
    sys.exit(_cli.run_module("top_k", sys.argv[1:]))
