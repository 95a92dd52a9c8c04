"""Complete mechanisms: stated calibration, Beam == Beam-free core, registry."""
import math

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.mechanisms.base import run_local
from beam_dpsu.dp.data.contribution import per_user_counts
from beam_dpsu.dp.privacy.accounting import zcdp_to_dp_delta
from beam_dpsu.dp.mechanisms import (CountGaussian, CountLaplace, TruncatedGeometric,
                                     WeightedGaussian, WeightedGaussianZcdp, WeightedLaplace)
from beam_dpsu.transforms.select import SelectPartitions
from beam_dpsu.dp.mechanisms.registry import REGISTRY, make_mechanism
from beam_dpsu.dp.randomness.noise import RunKey

from conftest import local_pipeline

E10 = math.exp(-10)

ALL = [
    TruncatedGeometric(1.0, 1e-5, 3), CountLaplace(1.0, 1e-5, 3), CountGaussian(1.0, 1e-5, 3),
    WeightedLaplace(1.0, 1e-5, 3), WeightedGaussian(1.0, 1e-5, 3), WeightedGaussianZcdp(0.5, 1e-5, 3),
]


def small_dataset():
    """Popular items every user has, mid items, and one rare item per user."""
    occ = []
    for u in range(120):
        user = f"user{u}"
        occ += [(user, "common"), (user, "common"), (user, "everyone")]
        occ += [(user, f"mid{u % 4}")]
        occ += [(user, f"rare{u}")]
        if u % 10 == 0:
            occ += [(user, f"x{j}") for j in range(20)]    # heavy users, sampled down
    return occ


def test_calibration_is_stated_before_running():
    m = WeightedGaussian(3, E10, 100)
    d = m.describe()
    assert d["mechanism"] == "weighted-gaussian" and d["epsilon"] == 3 and d["delta"] == E10
    assert d["threshold"] == [pytest.approx(6.82366098102885, rel=1e-8)]
    assert d["noise_scale"] == pytest.approx(1.33279132940618, rel=1e-8)
    assert d["max_items_per_user"] == 100 and d["rho"] is None

    z = WeightedGaussianZcdp(0.1, 1e-5, 100)
    assert z.calibration.threshold == pytest.approx(11.7260702142162, rel=1e-8)
    assert z.guarantee.rho == 0.1 and z.guarantee.delta == 2e-5
    assert zcdp_to_dp_delta(0.1, 1e-5, z.guarantee.epsilon) <= 2e-5

    c = CountLaplace(2, 1e-6, 10)
    assert c.calibration.noise_scale == 5.0
    assert c.calibration.threshold == cal.count_laplace_threshold(2, 1e-6, 10)


@pytest.mark.parametrize("mechanism", ALL, ids=lambda m: type(m).__name__)
def test_beam_and_core_release_the_same_set(mechanism):
    occ = small_dataset()
    rk = RunKey.from_test_seed(11)
    expected = run_local(per_user_counts(occ), mechanism, rk)
    # The popular items are released and the per-user rare items are not. The key is
    # a fixed test seed, so this outcome is deterministic; with a random key a rare
    # item would be released with probability at most δ.
    assert "common" in expected and "everyone" in expected
    assert not any(i.startswith("rare") for i in expected)
    with local_pipeline() as p:
        out = p | beam.Create(occ) | SelectPartitions(mechanism, rk)
        assert_that(out, equal_to(sorted(expected)))


def test_empty_input_releases_nothing():
    with local_pipeline() as p:
        out = p | beam.Create([]) | SelectPartitions(WeightedGaussian(1, 1e-5, 3))
        assert_that(out, equal_to([]))


def test_non_string_items_pass_through_unchanged():
    occ = [(u, 7) for u in range(200)] + [(u, ("a", 1)) for u in range(200)]
    rk = RunKey.from_test_seed(1)
    with local_pipeline() as p:
        out = p | beam.Create(occ) | SelectPartitions(CountGaussian(1, 1e-5, 2), rk)
        assert_that(out, equal_to([7, ("a", 1)]))


def test_registry_builds_every_name_and_rejects_mistakes():
    for name in ("truncated-geometric", "count-laplace", "count-gaussian", "weighted-laplace",
                 "weighted-gaussian"):
        assert name in REGISTRY
        assert make_mechanism(name, epsilon=1, delta=1e-6).name == name
    assert isinstance(make_mechanism("weighted-gaussian", rho=0.1, delta=1e-5),
                      WeightedGaussianZcdp)
    assert make_mechanism("count-gaussian", epsilon=1, delta=1e-6).max_items == 100
    with pytest.raises(ValueError, match="unknown mechanism"):
        make_mechanism("magic", epsilon=1, delta=1e-6)
    with pytest.raises(ValueError, match="needs --delta"):
        make_mechanism("count-gaussian", epsilon=1)
    with pytest.raises(ValueError, match="--alpha does not apply"):
        make_mechanism("count-gaussian", epsilon=1, delta=1e-6, alpha=3)
    with pytest.raises(ValueError, match="not both"):
        make_mechanism("weighted-gaussian", epsilon=1, rho=1, delta=1e-6)
    with pytest.raises(ValueError, match="--rho does not apply"):
        make_mechanism("count-laplace", rho=1, delta=1e-6)


def test_constructors_validate():
    with pytest.raises(ValueError, match="epsilon"):
        WeightedGaussian(0, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        WeightedLaplace(1, 0)
    with pytest.raises(ValueError, match="max_items_per_user"):
        CountGaussian(1, 1e-5, 0)
    with pytest.raises(ValueError, match="mechanism"):
        SelectPartitions("weighted-gaussian")
