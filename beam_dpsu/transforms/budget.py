"""The Beam expansion of a ``DeferredMechanism`` (calibrated after the graph is built).

A ``beam_dpsu.dp.mechanisms.budget.DeferredMechanism`` has the graph of a
histogram-and-threshold mechanism (Δ0 sampling, weighted histogram), known
before its share of a budget is; only its release rule waits for the share
(PipelineDP's ``compute_budgets()``, see ``beam_dpsu.transforms.pipelinedp``).
"""
from __future__ import annotations

from beam_dpsu.dp.mechanisms.budget import DeferredMechanism, ReleaseRuleOf
from beam_dpsu.transforms.bounding import SampleItems
from beam_dpsu.transforms.expansion import expand_mechanism, histogram_release

__all__ = []


__all__: list = []


@expand_mechanism.register
def _(mechanism: DeferredMechanism, per_user, run_key):
    # The same graph as a HistogramMechanism's; the rule is the calibrated one's.
    with mechanism.expanding():
        sampled = per_user | "SampleItems" >> SampleItems(mechanism.max_items, run_key, "sample/0")
        return histogram_release(sampled, mechanism.weighting, ReleaseRuleOf(mechanism), run_key)
