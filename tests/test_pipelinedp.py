"""beam_dpsu selections taking their share from PipelineDP's budget accountant."""
import glob
import math

import apache_beam as beam
import pytest

pipeline_dp = pytest.importorskip("pipeline_dp")

from beam_dpsu.transforms.select import SelectPartitions
from beam_dpsu.dp.mechanisms import WeightedGaussian  # noqa: E402
from beam_dpsu.dp.randomness.noise import RunKey  # noqa: E402
from beam_dpsu.transforms.pipelinedp import AccountantMechanism, accountant_total, from_accountant  # noqa: E402
from conftest import local_pipeline  # noqa: E402

# 200 users share "a" and "b"; each has one rare key (values 0..3). Each test
# states its selection (ε, δ) and its false-failure probability.
ROWS = [(f"u{u}", key, float(u % 4)) for u in range(200) for key in ("a", "b", f"rare{u}")]


def _read(prefix):
    out = []
    for path in glob.glob(prefix + "*"):
        with open(path, encoding="utf-8") as f:
            out.extend(line.rstrip("\n") for line in f)
    return out


def _select_then_aggregate(tmp_path, accountant, select, seed, compute=True):
    with local_pipeline() as p:
        data = p | "Rows" >> beam.Create(ROWS)
        keys = (data | "UserKey" >> beam.Map(lambda r: (r[0], r[1]))
                | "Select" >> SelectPartitions(select, run_key=RunKey.from_test_seed(seed)))
        keys | "WriteKeys" >> beam.io.WriteToText(str(tmp_path / "keys"))
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            metrics=[pipeline_dp.Metrics.COUNT, pipeline_dp.Metrics.SUM],
            max_partitions_contributed=3, max_contributions_per_partition=1,
            min_value=0.0, max_value=3.0)
        extractors = pipeline_dp.DataExtractors(
            privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1],
            value_extractor=lambda r: r[2])
        stats = engine.aggregate(data, params, extractors, public_partitions=keys)
        (stats | "Key" >> beam.Map(lambda kv: kv[0])
         | "WriteStats" >> beam.io.WriteToText(str(tmp_path / "stats")))
        if compute:
            accountant.compute_budgets()
    return sorted(_read(str(tmp_path / "keys"))), sorted(_read(str(tmp_path / "stats")))


def test_one_compute_budgets_covers_selection_and_aggregation(tmp_path):
    # Selection weight 2, the aggregation (count and sum in one scope) weight 1:
    # the selection gets ε = 3·2/3 = 2 and all of δ = 1e-9 (Laplace uses no δ).
    # Weighted Gaussian at (2, 1e-9), Δ0 = 3: "a" and "b" have weight 200/√3 ≈ 115
    # against T ≈ 19 (never missed); a rare key (1/√3) is released with
    # probability 1.7e-10 each, 3.4e-8 for all 200 (the false-failure probability).
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=3.0, total_delta=1e-9)
    select = from_accountant(accountant, "weighted-gaussian", max_items=3, weight=2)
    assert isinstance(select, AccountantMechanism) and not select.calibrated
    keys, stat_keys = _select_then_aggregate(tmp_path / "one", accountant, select, seed=7)
    assert keys == ["a", "b"] and stat_keys == ["a", "b"]
    g = select.guarantee
    assert (g.epsilon, g.delta) == pytest.approx((2.0, 1e-9), rel=1e-12)
    assert (select.spec.eps, select.spec.delta) == (g.epsilon, g.delta)
    # The stated total is basic composition of the three shares and is the budget.
    specs = accountant.mechanism_specs
    assert len(specs) == 3
    assert accountant_total(accountant) == pytest.approx(
        (math.fsum(s.eps for s in specs), math.fsum(s.delta for s in specs)), rel=1e-15)
    assert accountant_total(accountant) == pytest.approx((3.0, 1e-9), rel=1e-12)
    assert select.describe() == WeightedGaussian(2.0, 1e-9, 3).describe()


def test_deferred_calibration_releases_what_the_eager_mechanism_releases(tmp_path):
    # Same seed, same data, same (ε, δ): the deferred mechanism's job graph is the
    # eager one's, so the released sets are identical (deterministic, no chance).
    # A large δ share keeps the threshold low so that some rare keys are released.
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=0.3)
    select = from_accountant(accountant, "weighted-gaussian", max_items=3)
    deferred, _ = _select_then_aggregate(tmp_path / "deferred", accountant, select, seed=3)
    eps, delta = select.spec.eps, select.spec.delta
    eager = WeightedGaussian(eps, delta, 3)
    with local_pipeline() as p:
        (p | beam.Create([(r[0], r[1]) for r in ROWS])
         | SelectPartitions(eager, run_key=RunKey.from_test_seed(3))
         | beam.io.WriteToText(str(tmp_path / "eager")))
    assert deferred == sorted(_read(str(tmp_path / "eager")))
    assert any(k.startswith("rare") for k in deferred)   # a non-trivial comparison


def test_running_before_compute_budgets_is_refused(tmp_path):
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=1e-6)
    select = from_accountant(accountant, "count-gaussian", max_items=3)
    for read in (lambda: select.guarantee, select.describe, select.calibrate):
        with pytest.raises(ValueError, match="compute_budgets"):
            read()
    with pytest.raises(Exception) as info:
        _select_then_aggregate(tmp_path, accountant, select, seed=1, compute=False)
    chain, e = [], info.value
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__
    assert any(isinstance(x, ValueError) and "compute_budgets" in str(x) for x in chain)
    assert not glob.glob(str(tmp_path / "keys*"))     # nothing was released


def test_bad_requests_are_refused_before_anything_runs():
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=1e-6)
    for mechanism in ("sips", "gw", "policy-gaussian", "nope"):
        with pytest.raises(ValueError, match="cannot take a PipelineDP share"):
            from_accountant(accountant, mechanism)
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="weight"):
            from_accountant(accountant, weight=bad)
    with pytest.raises(ValueError):
        from_accountant(accountant, max_items=0)
    with pytest.raises(ValueError, match="NaiveBudgetAccountant"):
        from_accountant(object())
    from_accountant(accountant)
    accountant.compute_budgets()
    with pytest.raises(ValueError, match="already called"):
        from_accountant(accountant)


def test_pld_accountant_is_refused_and_why():
    pytest.importorskip("dp_accounting")
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld
    from pipeline_dp.aggregate_params import MechanismType
    with pytest.raises(ValueError, match="PLDBudgetAccountant is not supported"):
        from_accountant(pipeline_dp.PLDBudgetAccountant(total_epsilon=1.0, total_delta=1e-6))
    # The reason, measured: a GENERIC request of weight 3 next to one Laplace
    # request is handed more than the whole (1, 1e-6) budget, and the handed-out
    # shares compose (dp-accounting PLD) to ε = ∞ at δ = 1e-6.
    acc = pipeline_dp.PLDBudgetAccountant(total_epsilon=1.0, total_delta=1e-6)
    generic = acc.request_budget(MechanismType.GENERIC, weight=3)
    laplace = acc.request_budget(MechanismType.LAPLACE, weight=1)
    acc.compute_budgets()
    assert generic.eps > 1.0 and generic.delta > 1e-6
    composed = pld.from_privacy_parameters(
        common.DifferentialPrivacyParameters(generic.eps, generic.delta)).compose(
        pld.from_laplace_mechanism(laplace.noise_standard_deviation / math.sqrt(2)))
    assert composed.get_epsilon_for_delta(1e-6) > 1.0
