"""Differentially private set union of a text file of user-keyed items.

Usage::

    beam-dpsu select --input PATH --output PREFIX --mechanism NAME
        [--epsilon E] [--delta D] [--rho R] [--max-items-per-user N] [--alpha A]
        [--rounds I] [--ratio r] [--public-counts PATH] [--tie-break T] [--eta H]
        [--variant cascade-free|published --allow-unproven] [--overwrite]
        [--dead-letter PATH] [--insecure-test-seed N]
        [--budget-epsilon E --budget-delta D [--top-k K [--top-k-bar KBAR]
         [--top-k-max-items N]] [--share select=F] [--share top-k=F]]
        [any Beam pipeline option, e.g. --runner=DirectRunner]

Input: text files (glob allowed, ``.gz``/``.bz2`` decompressed), one
``user_id<TAB>item`` line per occurrence. Malformed lines are counted and
skipped, with a one-line warning giving their number; input without a single
well-formed line exits with status 1 and releases nothing.

Output (see ``beam_dpsu.pipelines.outputs``):

* ``PREFIX-items-00000-of-00001``: the released items, one per line, sorted
  (the order depends on the released set alone);
* ``PREFIX.json``: what may be published with them: mechanism, guarantee,
  calibration, number released (per round for DP-SIPS), library version,
  whether an insecure test seed was used;
* ``PREFIX.PRIVATE-run-details.json`` (mode 0600): exact user and
  malformed-line counts, input, runner, timings: for the data owner, NEVER
  to be published.

One budget for several releases (``beam_dpsu.pipelines.run_budget``):
``--budget-epsilon E --budget-delta D`` states the total guarantee of the
run instead of ``--epsilon``/``--delta``; the key set is calibrated from its
``--share select=F`` (default: all of it, or an equal split). ``--top-k K``
also releases, from the same read, the differentially private top ``K``
items (Gumbel, Algorithm 2; ``--top-k-bar`` candidates, default K;
``--top-k-max-items`` Δ, default unrestricted) to
``PREFIX-top-k-00000-of-00001`` (``rank<TAB>item``, rank order), paid
for by its ``--share top-k=F`` as a pay-what-you-get pool of K selections and
one query. ``PREFIX.json`` then states the run's total (``epsilon``,
``delta``, with every part under ``budget``), the key set's own guarantee as
``release_epsilon``/``release_delta`` (and ``release_rho``,
``release_zcdp_delta``, ``release_guarantee``) and the top-k release under
``top_k``, with how many of ``K`` it released and why (``released_of_k``,
``stop_reason``: the query stops at the first candidate whose noisy count falls
below the noisy threshold, and pays only for the selections made; also a
progress line on stderr). The run's total is the exact sum of its parts rounded
up, and each share the fraction of the budget rounded down, so it is never
above the budget (stdout prints it readable: ``3.0``, ``1e-05``).

A stated ε above ``params.WARN_EPSILON_ABOVE`` or δ above
``params.WARN_DELTA_ABOVE`` (the run's total with a budget, else the release's
own) gets a one-line warning on stderr; the run goes on.

Outputs of an earlier run under ``PREFIX`` are refused unless ``--overwrite``
is given, which deletes them first. ``--insecure-test-seed N`` (tests only)
makes the run reproducible and NOT private.

Bad parameters and locations exit with status 2 and a one-line message before
any data is read; other failures exit with status 1 and a one-line message.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import apache_beam as beam

from beam_dpsu.dp.mechanisms import Mechanism
from beam_dpsu.dp.mechanisms.on_blocks import runs_columnar
from beam_dpsu.transforms.columnar import SelectFromText
from beam_dpsu.transforms.columnar_rank import RankFromText
from beam_dpsu.transforms.columnar_read import ActivityFromText
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms.write import ranked_lines
from beam_dpsu.dp.mechanisms.topk import TopKMechanism
from beam_dpsu.pipelines import arguments, run_budget, top_k as top_k_pipeline, outputs, runs

__all__ = ["PROG", "build_pipeline", "public_fields", "budget_fields", "run", "main"]


PROG = "select_partitions"


def build_pipeline(p: beam.Pipeline, input_pattern: str, output_prefix: str,
                   mechanism: Mechanism, run_key: RunKey,
                   dead_letter: Optional[str] = None,
                   top_k: Optional[TopKMechanism] = None) -> None:
    """Adds the read → select → write graph to ``p`` (one sorted items file).

    Every mechanism of the command line (``dp.mechanisms.on_blocks.runs_columnar``: the histogram
    mechanisms, DP-SIPS, the sequential policies) runs on the columnar path
    (``transforms.columnar.SelectFromText``: blocks of arrays from the files to the
    release), laid out for the input's size (``runs.columnar_layout``: user groups,
    item shards, and its shuffles staged through files where the runner holds a
    shuffle in memory). With ``top_k``, ``transforms.columnar_rank.RankFromText`` reads
    the files too and releases the top-k query to ``PREFIX-top-k-00000-of-00001``
    in rank order; both releases use the one ``run_key`` under distinct purposes
    (the set-union mechanisms' and top-k's subkeys differ), so their randomness is
    independent, as composition needs. Raises ValueError for a mechanism the
    columnar path does not run (use ``SelectPartitions`` in a pipeline of your own).
    """
    if not runs_columnar(mechanism):
        raise ValueError(f"the command line's pipeline runs the columnar path's mechanisms; "
                         f"got {mechanism!r}: use SelectPartitions")
    layout = runs.columnar_layout(p, input_pattern)
    items, malformed, users = p | "SelectFromText" >> SelectFromText(
        input_pattern, mechanism, run_key, **layout)
    outputs.tally_users(users)
    outputs.write_dead_letter(malformed, dead_letter)
    outputs.write_items(items, output_prefix)
    if top_k is not None:  # the same files again; their users and malformed lines once
        ranked, _, _ = p | "TopK" >> RankFromText(input_pattern, top_k, run_key, **layout)
        outputs.write_items(ranked, output_prefix, arrange=ranked_lines,
                           label="TopK", kind=outputs.TOPK_KIND)


def public_fields(mechanism: Mechanism, result, released: int) -> dict:
    """The publishable summary: the mechanism's ``describe()`` with, for DP-SIPS,
    the number released by each round."""
    fields = dict(mechanism.describe())
    for i, entry in enumerate(fields.get("per_round") or []):
        entry["released"] = runs.counter(result, f"released_round_{i}")
    return fields


def budget_fields(plan: arguments.Plan, fields: dict, output_prefix: str) -> dict:
    """``fields`` of the key set, restated for a run with a budget: ``epsilon``/``delta``
    become the run's total, the key set's own move to ``release_*``, the budget's
    statement goes under ``budget`` and the top-k release under ``top_k``."""
    if plan.top_k is not None:  # first, so that the budget's statement shows the charge
        released = outputs.count_output_lines(output_prefix, outputs.TOPK_KIND)
        plan.pool.record(plan.top_k.k, released)  # "spent" fields: information only
        topk = top_k_pipeline.public_fields(plan.top_k, released)
        topk.update(num_released=released,
                    items_file=f"{os.path.basename(output_prefix)}-{outputs.TOPK_KIND}"
                               f"{outputs.SHARD}")
        topk["epsilon_meaning"] = (
            "the guarantee of the whole top-k query (its part of the budget): the "
            "composition of k selections of epsilon_per_selection, calibrated from its share")
        fields["top_k"] = topk
    total = plan.budget.guarantee()
    for key in ("epsilon", "delta", "rho", "zcdp_delta", "guarantee"):
        fields["release_" + key] = fields.pop(key, None)
    fields["budget"] = plan.budget.describe()
    given = (fields["budget"].get("budget_epsilon"), fields["budget"].get("budget_delta"))
    if None not in given and total.epsilon <= given[0] and total.delta <= given[1]:
        # the budget as given is the statement (the parts' composition is at most it); the
        # spent total, lower by rounding or by pay-what-you-get, is stated beside it
        fields["epsilon"], fields["delta"] = given
        if (total.epsilon, total.delta) != given:
            fields["spent_epsilon"], fields["spent_delta"] = total.epsilon, total.delta
    else:
        fields["epsilon"], fields["delta"] = total.epsilon, total.delta
    fields["guarantee"] = total.note
    fields["epsilon_meaning"] = (
        "the guarantee of everything this run released (the items file"
        + (" and the top-k file" if plan.top_k is not None else "")
        + "): basic composition of the parts under 'budget'; the key set's own is "
          "release_epsilon/release_delta")
    units = dict(fields.get("units") or {})
    for key in ("epsilon", "delta", "rho", "zcdp_delta"):
        if key in units:
            units["release_" + key] = units.pop(key) + " (of the key set alone)"
    units.update({
        "epsilon": "ε of the (ε, δ)-DP guarantee of EVERYTHING this run released (the key "
                   "set and, when present, the top-k), per user: the budget's statement",
        "delta": "δ of that guarantee",
        "spent_epsilon": "present when below epsilon: the exact composition of the parts, "
                         "at most the budget (epsilon)",
        "spent_delta": "present with spent_epsilon: the δ of that composition",
        "guarantee": "how the run's (ε, δ) composes its releases",
        "release_guarantee": "how the key set's own guarantee was obtained",
        "budget": "the run's budget: total, every release's share and stated guarantee",
    })
    if plan.top_k is not None:
        units["top_k"] = ("the top-k release of this run (its own fields; its epsilon is the "
                          "whole query's, within its share)")
    fields["units"] = units
    return fields


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs the pipeline; returns the public summary (also written to PREFIX.json) with
    the owner-only details (PREFIX.PRIVATE-run-details.json) under "PRIVATE_run_details"."""
    args, plan, beam_args = arguments.parse_select(argv)
    stated = plan.mechanism.guarantee if plan.budget is None else plan.budget
    run_budget.warn_guarantee(stated.epsilon, stated.delta)

    def fields(result, released):
        out = public_fields(plan.mechanism, result, released)
        if plan.budget is None:
            return out
        out = budget_fields(plan, out, args.output)
        if "top_k" in out:
            args.progress_notes = ["top-k: " + out["top_k"]["stop_reason"]]
        return out

    release = runs.ReleaseRun(
        args, beam_args, sub_releases=(outputs.TOPK_KIND,) if plan.top_k is not None else ())

    def build(p, run_key):
        if getattr(plan.mechanism, "needs_calibration", False):
            plan.mechanism = calibrate(plan.mechanism, release)
            if plan.budget is not None:  # its statement shows the calibrated parameters
                plan.budget.restate("select", plan.mechanism)
        build_pipeline(p, args.input, args.output, plan.mechanism, run_key, args.dead_letter,
                       plan.top_k)

    return release.run(build, fields)


def calibrate(mechanism, release: runs.ReleaseRun):
    """A mechanism whose parameters come from a DP estimate of the users' activity
    (``--max-items-per-user auto``; GW-KT's calibration share): runs the small pipeline
    that counts the input's users by their number of distinct items in the mechanism's
    buckets (``columnar_read.ActivityFromText``, on the same runner), releases that
    histogram at the mechanism's ``calibration_epsilon`` (``mechanism.estimate``: under
    the test seed's key with ``--insecure-test-seed``, so that the run equals
    ``run_local``; else under a fresh OS-random key drawn here) and returns the
    calibrated mechanism. The
    exact counts pass through this process only, in owner-only files deleted at once,
    like the run's other counts (``release.count``)."""
    def count(p):
        groups = p | "ActivityFromText" >> ActivityFromText(release.input, mechanism.layout)
        for b in range(mechanism.layout.count):
            outputs.tally(groups | f"Bucket{b}" >> beam.Map(lambda h, b=b: (None, h[b])),
                          f"activity_users_{b}", counts_second=True)
    counts = release.count(count)  # every file it wrote, deleted
    key = (RunKey.from_test_seed(release.seed)
           if release.seed is not None else RunKey.fresh())
    histogram = [counts[f"activity_users_{b}"] for b in range(mechanism.layout.count)]
    return mechanism.calibrated(mechanism.estimate(histogram, key))


def main(argv: Optional[Sequence[str]] = None) -> int:
    return runs.main_wrapper(PROG, run, argv,
                               ("mechanism", "epsilon", "delta", "num_released"),
                               nested={"top_k": ("num_released", "released_of_k", "epsilon",
                                                 "charge")})

