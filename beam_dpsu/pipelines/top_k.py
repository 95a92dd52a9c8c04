"""Differentially private top-k items of a text file of user-keyed items.

Usage::

    beam-dpsu top-k --input PATH --output PREFIX --k K
        [--method limited-domain|discover-peel] [--k-bar KBAR] [--discovery-share F]
        (--epsilon E --delta D | --epsilon-per-selection E --delta D
         | --budget-epsilon E --budget-delta D)
        [--max-items-per-user N] [--with-counts] [--overwrite]
        [--dead-letter PATH] [--insecure-test-seed N]
        [any Beam pipeline option, e.g. --runner=DirectRunner]

Input: text files (glob allowed, ``.gz``/``.bz2`` decompressed), one
``user_id<TAB>item`` line per occurrence. Malformed lines are counted and
skipped, with a one-line warning; input without a well-formed line exits with
status 1 and releases nothing.

Two methods. ``--method limited-domain`` (the default: Durfee and Rogers)
ranks the true top k̄ and releases at most k of them, fewer when the candidates'
noisy counts fall below a noisy threshold. ``--method discover-peel`` (Dick,
Joseph and Raman): Weighted Gaussian discovers a domain with the share
``--discovery-share`` (default 1/2) of (E, D), with ``--max-items-per-user``
its Δ0 (default 100), then the peeling exponential mechanism ranks the
discovered items by their users (``docs/mechanisms.md`` section 10); it
releases min(k, discovered) items and takes no ``--k-bar``, ``--with-counts``
or ``--epsilon-per-selection``.

``--epsilon E --delta D`` is the guarantee of the WHOLE query, as on every
command. With limited-domain and without ``--with-counts`` this is Algorithm 2 (Gumbel): each released
item and the stop is one bounded-range selection, and the per-selection ε
(printed and in the summary as ``epsilon_per_selection``) is calibrated from
(E, D): the largest whose composition over ``k`` selections is within (E, D)
(``beam_dpsu.dp.privacy.accounting.pay_what_you_get_epsilon``; δ/2 goes to the
threshold, δ/2 to the conversion). The query stops at the first candidate whose
noisy count falls below the noisy threshold, and is then charged only the
``ℓ + 1`` selections made ("pay what you get"): stderr and the summary say how
many of ``k`` were released and why. ``--max-items-per-user`` is optional
(Δ-restricted sensitivity). With ``--with-counts`` it is Algorithm 1 (Laplace,
needs ``--max-items-per-user``): noisy counts (on a discrete grid) are released.

``--epsilon-per-selection E --delta D`` (Algorithm 2 only, instead of
``--epsilon``) gives each selection's ε directly, with ``D`` the query's
threshold δ; the summary then states the composition of ``k`` such selections
(at δ₁ = D, so up to 2D), which is larger than E.

``--budget-epsilon E --budget-delta D`` states the same whole-query guarantee
through a one-release budget (the same calibration as ``--epsilon E --delta
D``); ``PREFIX.json`` then also holds the budget's statement under ``budget``
(see ``beam_dpsu.pipelines.run_budget``).

A stated ε above ``params.WARN_EPSILON_ABOVE`` or δ above
``params.WARN_DELTA_ABOVE`` gets a one-line warning on stderr.

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

from typing import Optional, Sequence

import apache_beam as beam

from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms.columnar_rank import RankFromText
from beam_dpsu.dp.mechanisms.peeling import DiscoverThenPeel
from beam_dpsu.dp.mechanisms.topk import TopKMechanism
from beam_dpsu.transforms.write import ranked_lines
from beam_dpsu.pipelines import arguments, run_budget, outputs, runs

__all__ = ["PROG", "build_pipeline", "public_fields", "run", "main"]


PROG = "top_k"


def build_pipeline(p: beam.Pipeline, input_pattern: str, output_prefix: str,
                   mechanism, run_key: RunKey, dead_letter: Optional[str] = None) -> None:
    """Adds the read → rank → write graph to ``p`` (one output file, rank order): the
    columnar path (``transforms.columnar_rank.RankFromText``) for a ``TopKMechanism`` and
    for discovery then peeling (top-k or hitting set), laid out for the input's size
    (``runs.columnar_layout``)."""
    rows, malformed, users = p | "RankFromText" >> RankFromText(
        input_pattern, mechanism, run_key,
        **runs.columnar_layout(p, input_pattern))
    outputs.tally_users(users)
    outputs.write_dead_letter(malformed, dead_letter)
    outputs.write_items(rows, output_prefix, arrange=ranked_lines)


def public_fields(mechanism: TopKMechanism, released: int) -> dict:
    """The publishable summary: ``epsilon``/``delta`` are the whole query's guarantee;
    ``released_of_k`` and ``stop_reason`` say how many of k were released and why."""
    fields = dict(mechanism.describe())
    if isinstance(mechanism, DiscoverThenPeel):
        fields["released_of_k"] = f"{released} of {mechanism.k}"
        fields["stop_reason"] = (None if released >= mechanism.k else
                                 f"the discovered domain held {released} items")
        fields["units"] = dict(fields.get("units") or {}, released_of_k=(
            "how many items were released out of k"), stop_reason=(
            "why fewer than k items were released: the discovery found fewer"))
        return fields
    fields["charge"] = mechanism.charge(released)
    fields["released_of_k"] = f"{released} of {mechanism.k}"
    fields["stop_reason"] = mechanism.release_note(released)
    fields["units"] = dict(fields.get("units") or {}, released_of_k=(
        "how many items were released out of k"), stop_reason=(
        "why fewer than k items were released, when they were: the query stops at the "
        "first candidate whose noisy count falls below the noisy threshold"))
    return fields


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs the pipeline; returns the public summary (also written to PREFIX.json) with
    the owner-only details (PREFIX.PRIVATE-run-details.json) under "PRIVATE_run_details"."""
    args, mechanism, beam_args = arguments.parse_top_k(argv)
    if args.budget is not None:
        run_budget.warn_guarantee(args.budget.epsilon, args.budget.delta)
    else:
        run_budget.warn_guarantee(mechanism.epsilon, mechanism.delta)

    def fields(result, released):
        out = public_fields(mechanism, released)
        args.progress_notes = [out["stop_reason"]] if out.get("stop_reason") else []
        if args.budget is not None:
            if args.pool is not None:
                args.pool.record(mechanism.k, released)  # "spent" fields: information only
            out["budget"] = args.budget.describe()
            out["units"] = dict(out.get("units") or {}, budget=(
                "the budget the query was calibrated from: total, share, stated guarantee"))
        return out

    return runs.ReleaseRun(args, beam_args).run(
        lambda p, run_key: build_pipeline(p, args.input, args.output, mechanism, run_key,
                                          args.dead_letter), fields)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return runs.main_wrapper(PROG, run, argv, ("mechanism", "epsilon", "delta",
                                                 "epsilon_per_selection", "num_released",
                                                 "released_of_k", "charge"))

