"""Policy mechanisms on the shared datasets against the authors' published means.

As in ``test_reference_numbers.py``, each run contributes the *expected*
number of released items given its finished histogram,
Σ_items P(weight + noise > T), and the mean over runs is compared with the
authors' mean of 5 runs (ε = 3, δ = e^-10) within 3%. The run-to-run spread of
that expectation comes only from the keys (Δ0 sample, user order, item ids).
Measured standard deviations per run (5 runs each) and the runs used here give these margins
(3% band minus the measured offset, in standard deviations of the mean):
policy-laplace Δ0=10: sd 4-8, 12 runs, > 6.4; policy-gaussian Δ0=300: sd 1.6,
5 runs, > 30; Δ0=100: sd 1.9, > 30; gw (item hash): sd about 9 pooled over
65 runs (the mean, about 703-708, sits 1.5% below the authors), 40 runs,
7.4 (4.8 even at sd 14, the largest 5-run estimate); gw-kt: sd 5.8-6.9, > 10; reddit policy-gaussian: sd 1.6, > 20.
Even with the true sd 30% above the measured one, the false-failure
probability is below 1e-6 for each case.

GW's tie-break. The authors' code breaks ties in C_i[u] by each user's record
order; ``tie_break='first-occurrence'`` does the same and is checked two-sided
on both datasets (measured expected-count sd per run: rails 6.0, 8 runs,
margin 7.9 sd of the mean; reddit 5.1, 5 runs, margin 8.6). The
library's default (docs/gw.md), a keyed item hash shared by all users, gives about
795-815 on reddit-titles (sd 20-23 per run), 6-8% above the authors: on
reddit almost every count is 1, so that one ranking decides every walk. The
default is checked only for not being more than 3% *below* the authors there
(margin 8.5 sd of the mean of 5 runs).

The GW and GW-KT cases are the published variant (``variant='published'``,
not proven private; ``docs/gw.md``), which is what the authors measured; the
cascade-free default is compared with it in ``benchmarks/RESULTS.md`` section 7.

Skipped when ../shared/data is absent. Slow (a few minutes): it runs 92
sequential passes over the data.
"""
import math

import numpy as np
import pytest
from scipy import stats

from beam_dpsu.transforms import textio
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.mechanisms.policy import GW, GWKT, PolicyGaussian, PolicyLaplace

from conftest import shared_dataset

E10 = math.exp(-10)


def load(name):
    return textio.read_per_user(str(shared_dataset(name)))   # record order kept


@pytest.fixture(scope="module")
def rails():
    return load("commits-rails.pairs.tsv.gz")


@pytest.fixture(scope="module")
def reddit():
    return load("reddit-titles.pairs.tsv.gz")


@pytest.fixture(scope="module")
def ansible_public_counts():
    """Public counts for gw-kt: distinct users per item in commits-ansible."""
    counts = {}
    for items in load("commits-ansible.pairs.tsv.gz").values():
        for item in items:
            counts[item] = counts.get(item, 0) + 1
    return counts


def expected_release(mechanism, per_user, runs):
    r = mechanism.calibration
    dist = stats.norm(scale=r.noise_scale) if r.noise == "gaussian" \
        else stats.laplace(scale=r.noise_scale)
    out = []
    for _ in range(runs):
        hist = mechanism.histogram_local(per_user, RunKey.fresh())
        out.append(float(dist.sf(r.threshold - np.fromiter(hist.values(), float)).sum()))
    return float(np.mean(out))


CASES = [  # (id, dataset fixture, mechanism factory, runs, authors' mean of 5 runs)
    ("rails-policy-laplace-10", "rails", lambda pub: PolicyLaplace(3, E10, 10), 12, 562.0),
    ("rails-policy-gaussian-300-a5", "rails", lambda pub: PolicyGaussian(3, E10, 300, 5), 5,
     1250.2),
    ("rails-policy-gaussian-100-a3", "rails", lambda pub: PolicyGaussian(3, E10, 100, 3), 5,
     1161.4),
    ("rails-gw", "rails", lambda pub: GW(3, E10, variant="published"), 40, 713.4),
    ("rails-gw-first-occurrence", "rails",
     lambda pub: GW(3, E10, tie_break="first-occurrence", variant="published"), 8, 713.4),
    ("reddit-gw-first-occurrence", "reddit",
     lambda pub: GW(3, E10, tie_break="first-occurrence", variant="published"), 5, 750.6),
    ("rails-gw-kt", "rails", lambda pub: GWKT(3, E10, pub, variant="published"), 5, 986.8),
    ("reddit-policy-gaussian-50-a5", "reddit", lambda pub: PolicyGaussian(3, E10, 50, 5), 5,
     821.2),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_expected_release_within_3_percent_of_authors(case, request):
    _, data, factory, runs, authors = case
    pub = request.getfixturevalue("ansible_public_counts") if "kt" in case[0] else None
    mean = expected_release(factory(pub), request.getfixturevalue(data), runs)
    assert abs(mean - authors) <= 0.03 * authors, (mean, authors)


def test_reddit_gw_not_below_authors(reddit):
    mean = expected_release(GW(3, E10, variant="published"), reddit, 5)
    assert mean >= 0.97 * 750.6, mean
