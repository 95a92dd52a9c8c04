"""Differentially private k-hitting set of a text file of user-keyed items (discovery, then user peeling).

Usage::

    beam-dpsu hitting-set --input PATH --output PREFIX --k K --epsilon E --delta D
        [--max-items-per-user N] [--discovery-share F] [--overwrite]
        [--dead-letter PATH] [--insecure-test-seed N]
        [any Beam pipeline option, e.g. --runner=DirectRunner]

Chooses at most k items that together are held by as many users as possible:
Weighted Gaussian discovers a domain with the share F of (E, D) (default 1/2,
``--max-items-per-user`` is its Δ0, default 100), then k rounds each choose
the discovered item held by the most users not yet hit, plus Gumbel noise,
and remove the users who hold it (``docs/mechanisms.md`` section 10). The k
rounds run on one worker, over each user's discovered items.

``--epsilon E --delta D`` is the guarantee of the WHOLE release (both
stages), as on every command.

Input: text files (glob allowed, ``.gz``/``.bz2`` decompressed), one
``user_id<TAB>item`` line per occurrence.

Output: ``PREFIX-items-00000-of-00001`` with lines ``rank<TAB>item`` in the
order chosen (the order is part of the private output); ``PREFIX.json``,
publishable; ``PREFIX.PRIVATE-run-details.json`` (mode 0600), never to be
published. Bad parameters exit with status 2 and a one-line message before any
data is read; other failures exit with status 1 and a one-line message.
"""
from __future__ import annotations

from typing import Optional, Sequence

from beam_dpsu.dp.mechanisms.peeling import DiscoverThenPeel
from beam_dpsu.pipelines import arguments, run_budget, runs, top_k

__all__ = ["PROG", "public_fields", "run", "main"]

PROG = "hitting_set"


def public_fields(mechanism: DiscoverThenPeel, released: int) -> dict:
    """The publishable summary: the guarantee of the whole release and both stages."""
    fields = dict(mechanism.describe())
    fields["released_of_k"] = f"{released} of {mechanism.k}"
    fields["units"] = dict(fields.get("units") or {}, released_of_k=(
        "how many items were chosen out of k (fewer only when fewer were discovered)"))
    return fields


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs the pipeline; returns the public summary (also written to PREFIX.json) with
    the owner-only details under "PRIVATE_run_details"."""
    args, mechanism, beam_args = arguments.parse_hitting_set(argv)
    run_budget.warn_guarantee(mechanism.epsilon, mechanism.delta)
    # The same read -> count -> release -> write graph as top-k's discover-peel method.
    return runs.ReleaseRun(args, beam_args).run(
        lambda p, run_key: top_k.build_pipeline(p, args.input, args.output, mechanism,
                                                run_key, args.dead_letter),
        lambda result, released: public_fields(mechanism, released))


def main(argv: Optional[Sequence[str]] = None) -> int:
    return runs.main_wrapper(PROG, run, argv, ("mechanism", "epsilon", "delta", "k",
                                                 "num_released", "released_of_k"))

