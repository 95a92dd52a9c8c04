"""Released counts on the shared datasets against the authors' published means.

The number of released items is a sum of independent Bernoulli draws given the
sampled histogram, so the test compares the *expected* count
(Σ_items P(weight + noise > T), computed exactly from the noise CDF and averaged
over 5 independent Δ0 samples) with the authors' mean of 5 runs. That
expectation varies far less between runs than one run's count (its spread
comes only from the Δ0 sampling, below 0.5% here), so a 3% tolerance leaves a
false-failure probability far below 1e-6. One actual release is also checked
against its own expectation with a Bernstein bound (false failure 1e-7).

Skipped when ../shared/data is absent.
"""
import math

import numpy as np
import pytest
from scipy import stats

from beam_dpsu.dp.mechanisms.base import run_local
from beam_dpsu.dp.mechanisms.histogram_threshold import histogram_local
from beam_dpsu.dp.data import lines
from beam_dpsu.dp.mechanisms import (CountGaussian, WeightedGaussian, WeightedGaussianZcdp,
                                     WeightedLaplace)
from beam_dpsu.dp.randomness.noise import RunKey

from conftest import bernstein_radius, shared_dataset

E10 = math.exp(-10)

CASES = [  # (mechanism, authors' mean of 5 runs)
    (WeightedGaussian(3, E10, 300), 971.0),
    (WeightedGaussian(3, E10, 100), 921.4),
    (WeightedLaplace(3, E10, 10), 302.6),
    (CountGaussian(3, E10, 50), 701.8),
    (WeightedGaussianZcdp(0.1, 1e-5, 100), 588.0),
]


@pytest.fixture(scope="module")
def rails():
    path = shared_dataset("commits-rails.pairs.tsv.gz")
    per_user = {}
    for kind, value in lines.read_user_items(str(path)):
        if kind == "user":
            per_user[value[0]] = value[1]
    return per_user


def release_probabilities(hist, mechanism):
    r = mechanism.calibration
    w = np.fromiter(hist.values(), dtype=float)
    dist = stats.norm(scale=r.noise_scale) if r.noise == "gaussian" \
        else stats.laplace(scale=r.noise_scale)
    return dist.sf(r.threshold - w)


@pytest.mark.parametrize("mechanism,authors", CASES, ids=lambda x: getattr(x, "name", str(x)))
def test_expected_release_within_3_percent_of_authors(rails, mechanism, authors):
    expected = []
    for _ in range(5):
        hist = histogram_local(rails, mechanism, RunKey.fresh())
        expected.append(release_probabilities(hist, mechanism).sum())
    mean = float(np.mean(expected))
    assert abs(mean - authors) <= 0.03 * authors, (mean, authors)


def test_one_release_matches_its_expectation(rails):
    mechanism = WeightedGaussian(3, E10, 300)
    rk = RunKey.fresh()
    hist = histogram_local(rails, mechanism, rk)
    p = release_probabilities(hist, mechanism)
    got = len(run_local(rails, mechanism, rk))
    assert abs(got - p.sum()) <= bernstein_radius(float((p * (1 - p)).sum()), 1e-7)
