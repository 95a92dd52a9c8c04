"""Interoperation with PipelineDP: one budget accountant for selection and aggregation.

Install with ``pip install 'beam-dpsu[pipelinedp]'`` (``pipeline-dp``).

``from_accountant(accountant, 'weighted-gaussian', max_items=20)`` requests a
share of a PipelineDP ``NaiveBudgetAccountant`` for a beam_dpsu partition
selection, exactly as a PipelineDP aggregation does (``request_budget``), and
returns a mechanism for ``SelectPartitions``. One ``compute_budgets()`` then
fixes every share, the selection's and the aggregations'; the beam_dpsu
mechanism is calibrated from its share after that, before the pipeline runs.
The released keys can be passed to PipelineDP's aggregations as
``public_partitions``: they are the output of a DP release, so using them is
post-processing and costs no budget.

The order is PipelineDP's: build the pipeline (select, aggregate), call
``accountant.compute_budgets()``, run. Running before ``compute_budgets()``
raises ValueError and releases nothing.

Why not ``PLDBudgetAccountant``: it is refused. PipelineDP marks it
experimental, and for a ``GENERIC`` mechanism (the only kind that can stand for
a beam_dpsu mechanism) it hands out ε₀ = √2·weight/(sensitivity·σ) but composes
the privacy loss distribution with ε₀ = √2/σ, ignoring the weight; with
weight 3 next to one Laplace aggregation at total (1, 1e-6) it hands the
generic mechanism (1.5, 1.5e-6), more than the whole budget (measured with
pipeline-dp 0.3.1; docs/budget.md). A share whose composition the accountant
does not account for correctly cannot be stated soundly.
"""
from __future__ import annotations

from typing import Tuple

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.mechanisms.budget import DEFERRABLE_WEIGHTING, DeferredMechanism
from beam_dpsu.dp.privacy.params import DEFAULT_MAX_ITEMS

__all__ = ["PLD_REFUSAL", "AccountantMechanism", "from_accountant", "accountant_total"]


PLD_REFUSAL = (
    "PLDBudgetAccountant is not supported: for a GENERIC mechanism PipelineDP's PLD "
    "accountant composes with ε₀ = √2/σ but hands out ε₀ = √2·weight/(sensitivity·σ), so "
    "the share a beam_dpsu mechanism would receive is not the one accounted for (with "
    "weight 3 it exceeds the total budget); use NaiveBudgetAccountant (basic composition)")


def _pipeline_dp():
    try:
        import pipeline_dp
    except ImportError as e:  # pragma: no cover - exercised when the extra is absent
        raise ImportError("PipelineDP interoperation needs the pipeline-dp package: "
                          "pip install 'beam-dpsu[pipelinedp]'") from e
    return pipeline_dp


class _SpecShare:
    """``() -> (ε, δ)`` of a PipelineDP MechanismSpec, once compute_budgets() has run."""

    def __init__(self, accountant, spec):
        self._accountant = accountant
        self.spec = spec

    def __call__(self) -> Tuple[float, float]:
        if not self._accountant.finalized or self.spec._eps is None:
            raise ValueError(
                "the beam_dpsu mechanism's budget has not been computed: call "
                "accountant.compute_budgets() after building the pipeline and before running it")
        eps, delta = self.spec.eps, self.spec.delta
        if not eps or not delta:
            raise ValueError(f"PipelineDP gave the beam_dpsu mechanism (ε={eps!r}, δ={delta!r}); "
                             "partition selection needs ε > 0 and δ > 0")
        return float(eps), float(delta)


class AccountantMechanism(DeferredMechanism):
    """A beam_dpsu mechanism whose share comes from a PipelineDP accountant.

    Build it with ``from_accountant``. ``spec`` is PipelineDP's
    ``MechanismSpec`` (its ``eps``/``delta`` are the share after
    ``compute_budgets()``).
    """

    def __init__(self, mechanism: str, max_items: int, accountant, spec):
        self.spec = spec
        super().__init__(mechanism, max_items, _SpecShare(accountant, spec))


def from_accountant(accountant, mechanism: str = "weighted-gaussian", *, max_items: int = DEFAULT_MAX_ITEMS,
                    weight: float = 1.0, name: str = "") -> AccountantMechanism:
    """Requests a share of a PipelineDP budget accountant for a beam_dpsu selection.

    Args:
      accountant: a ``pipeline_dp.NaiveBudgetAccountant`` on which
        ``compute_budgets()`` has not been called yet. ``PLDBudgetAccountant``
        is refused (see the module docstring).
      mechanism: an (ε, δ)-DP histogram mechanism name: ``'weighted-gaussian'``
        (default), ``'weighted-laplace'``, ``'count-gaussian'``,
        ``'count-laplace'`` or ``'truncated-geometric'``.
      max_items: Δ0 ≥ 1 (default 100), distinct keys kept per user; utility only.
      weight: the share's budget weight > 0 (default 1), relative to the
        weights of the accountant's other requests (PipelineDP's meaning:
        within an enclosing ``accountant.scope`` it is relative to that scope).
      name: the name PipelineDP records for the request (default
        ``'beam_dpsu:<mechanism>'``).

    Privacy: the accountant splits its (total_epsilon, total_delta) by basic
    composition; this mechanism is (spec.eps, spec.delta)-DP, and the
    aggregations are PipelineDP's own guarantee with their shares. Requested
    as PipelineDP's ``GENERIC`` mechanism type, which receives a share of δ.
    """
    pipeline_dp = _pipeline_dp()
    if isinstance(accountant, pipeline_dp.PLDBudgetAccountant):
        raise ValueError(PLD_REFUSAL)
    if not isinstance(accountant, pipeline_dp.NaiveBudgetAccountant):
        raise ValueError(f"accountant must be a pipeline_dp.NaiveBudgetAccountant, "
                         f"got {accountant!r}")
    if accountant.finalized:
        raise ValueError("compute_budgets() was already called on this accountant: request the "
                         "beam_dpsu share before computing the budgets")
    if mechanism not in DEFERRABLE_WEIGHTING:
        raise ValueError(f"mechanism {mechanism!r} cannot take a PipelineDP share; choose one of "
                         f"{', '.join(sorted(DEFERRABLE_WEIGHTING))}")
    cal.check_max_items(max_items)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        raise ValueError(f"weight must be a number > 0, got {weight!r}")
    from pipeline_dp.aggregate_params import MechanismType
    spec = accountant.request_budget(MechanismType.GENERIC, weight=float(weight),
                                     name=name or f"beam_dpsu:{mechanism}")
    return AccountantMechanism(mechanism, max_items, accountant, spec)


def accountant_total(accountant) -> Tuple[float, float]:
    """(Σ ε_i·count_i, Σ δ_i·count_i) over every share a computed accountant handed out.

    For a ``NaiveBudgetAccountant`` this is basic composition of all its
    releases and is at most (total_epsilon, total_delta). Raises ValueError
    before ``compute_budgets()``.
    """
    if not accountant.finalized:
        raise ValueError("call compute_budgets() first")
    eps = delta = 0.0
    for spec in accountant.mechanism_specs:
        eps += spec.eps * spec.count
        delta += (spec.delta or 0.0) * spec.count
    return eps, delta
