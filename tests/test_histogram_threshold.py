"""Weighted histograms and the release rules."""
import functools
import math

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to
from scipy import stats

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.transforms.histogram import WeightedHistogram
from beam_dpsu.dp.data.weights import add_user_to_histogram, user_weight
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms.release import NoisyThreshold
from beam_dpsu.dp.randomness.release_rules import NoisyThresholdRule, TruncatedGeometricRule

from conftest import bernstein_radius, local_pipeline


def test_user_weight():
    assert user_weight(4, "count") == 1
    assert user_weight(4, "l1") == 0.25
    assert user_weight(4, "l2") == 0.5
    with pytest.raises(ValueError):
        user_weight(0, "l2")
    with pytest.raises(ValueError):
        user_weight(3, "linf")


def test_user_contribution_norms():
    for n in (1, 3, 17):
        h = {}
        add_user_to_histogram(h, [f"i{j}" for j in range(n)], "l2")
        assert math.isclose(math.sqrt(sum(w * w for w in h.values())), 1.0)
        h = {}
        add_user_to_histogram(h, [f"i{j}" for j in range(n)], "l1")
        assert math.isclose(sum(h.values()), 1.0)


@pytest.mark.parametrize("weighting", ["count", "l1", "l2"])
def test_weighted_histogram_in_beam(weighting):
    users = [("u1", {"a": 3, "b": 1}), ("u2", {"a": 1}), ("u3", {"a": 1, "b": 1, "c": 1, "d": 1})]
    expected = {}
    for _, c in users:
        add_user_to_histogram(expected, list(c), weighting)
    with local_pipeline() as p:
        out = p | beam.Create(users) | WeightedHistogram(weighting, flush_items=2)

        def close(actual):
            got = dict(actual)
            assert set(got) == set(expected)
            for k, v in expected.items():
                assert math.isclose(got[k], v, rel_tol=1e-12)
        assert_that(out, close)


def _zeros(indices, j):
    return np.zeros(len(indices), np.uint64)


def test_release_decisions_are_the_tail_probabilities_of_the_noise():
    # The noise's sign is the top bit; the low 63 bits start the uniform U. An item
    # below T is released iff Z > 0 and U < 2·P(Z > T − w); one above T is dropped iff
    # Z < 0 and U < 2·P(Z > w − T); weights <= 0 never.
    rule = NoisyThresholdRule("laplace", 1.0, 1.0, RunKey.from_test_seed(0))
    sign = 1 << 63
    below = math.exp(-0.5) * 2 ** 63          # w = 0.5: 2·P(Z > 0.5) = e^-0.5
    d = 2 ** 25                               # beyond the rounding margin (2^-40 relative)
    cases = [(int(below) - d, 0.5, True), (int(below) + d, 0.5, False),
             (0, 0.5, True), (sign | 0, 0.5, False),   # negative noise never lifts w <= T
             (sign | (int(below) - d), 1.5, False), (sign | (int(below) + d), 1.5, True),
             (2 ** 63 - 1, 1.5, True),                 # positive noise keeps w > T
             (0, 1.0, True), (sign, 1.0, False),       # w = T: the sign decides
             (0, 0.0, False), (0, -1.0, False)]
    for bits, weight, want in cases:
        got = rule.decide_bits(np.array([bits], np.uint64), [weight], _zeros)[0]
        assert got == want, (bits, weight)


def test_zero_weight_items_are_never_noised_or_released():
    rule = NoisyThresholdRule("laplace", 1e6, -1e9, RunKey.fresh())   # anything positive passes
    assert rule("x", 1e-9)
    assert not rule("x", 0.0) and not rule("x", -5.0) and not rule("x", float("nan"))


@pytest.mark.parametrize("kind,scale,weight,threshold", [
    ("gaussian", 1.0, 2.0, 3.0), ("laplace", 2.0, 5.0, 4.0), ("gaussian", 0.5, 1.0, 1.0)])
def test_release_probability_matches_the_noise_cdf(kind, scale, weight, threshold):
    # 20,000 items with the same weight: the released count is Binomial(n, p);
    # Bernstein radius at false-failure probability 1e-7.
    n = 20000
    dist = stats.norm(scale=scale) if kind == "gaussian" else stats.laplace(scale=scale)
    p = dist.sf(threshold - weight)
    rule = NoisyThresholdRule(kind, scale, threshold, RunKey.fresh())
    count = sum(rule(f"item{i}", weight) for i in range(n))
    assert abs(count - n * p) <= bernstein_radius(n * p * (1 - p), 1e-7)


def test_truncated_geometric_rule_keeps_with_probability_p():
    eps, delta, dmax = 1.0, 1e-3, 1
    rule = TruncatedGeometricRule(eps, delta, dmax, RunKey.fresh())
    n = 20000
    for users in (1, 3, 8):
        p = cal.truncated_geometric_keep_probability(eps, delta, dmax, users)
        count = sum(rule(f"i{i}", users) for i in range(n))
        assert abs(count - n * p) <= bernstein_radius(n * p * (1 - p), 1e-7)
    assert not rule("x", 0)
    assert rule("x", 10 ** 6)          # p(n) = 1 for large n
    assert rule.probability(10 ** 7) == 1.0


def test_noisy_threshold_in_beam_is_deterministic_under_a_key():
    hist = [(f"i{i}", float(i % 7)) for i in range(200)]
    rk = RunKey.from_test_seed(2)
    rule = NoisyThresholdRule("gaussian", 1.0, 3.0, rk)
    expected = [item for item, w in hist if rule(item, w)]
    assert 0 < len(expected) < len(hist)
    with local_pipeline() as p:
        out = p | beam.Create(hist) | NoisyThreshold("gaussian", 1.0, 3.0, rk)
        assert_that(out, equal_to(expected))


def test_noisy_threshold_validates_at_construction():
    with pytest.raises(ValueError, match="noise"):
        NoisyThreshold("cauchy", 1.0, 3.0)
    with pytest.raises(ValueError, match="scale"):
        NoisyThreshold("laplace", -1.0, 3.0)
    with pytest.raises(ValueError, match="threshold"):
        NoisyThreshold("laplace", 1.0, float("inf"))


@pytest.mark.parametrize("num_shards,flush", [(1, 1000), (7, 3), (1024, 1000)])
@pytest.mark.parametrize("in_parts", [False, True])
def test_sharded_histogram_holds_the_same_weights(num_shards, flush, in_parts):
    from beam_dpsu.transforms.histogram import ShardedHistogram
    from beam_dpsu.dp.data.weights import item_shard
    users = [(f"u{i}", {f"i{j}": 1 for j in range(i % 9 + 1)}) for i in range(60)]
    expected = {}
    for _, c in users:
        add_user_to_histogram(expected, list(c), "l2")
    with local_pipeline() as p:
        if in_parts:  # per-user parts (each user in one): partials of each, summed together
            per_user = (p | "A" >> beam.Create(users[::2]), p | "B" >> beam.Create(users[1::2]))
        else:
            per_user = p | beam.Create(users)
        out = per_user | ShardedHistogram("l2", num_shards, flush_items=flush)

        def check(shards):
            keys = [s for s, _ in shards]
            assert len(keys) == len(set(keys))              # one dict per shard
            merged = {}
            for s, part in shards:
                assert all(item_shard(item, num_shards) == s for item in part)
                merged.update(part)
            assert set(merged) == set(expected)
            for k, v in expected.items():
                assert math.isclose(merged[k], v, rel_tol=1e-12)
        assert_that(out, check)


def test_sharded_release_equals_per_item_release():
    from beam_dpsu.transforms.release import ApplyReleaseRule
    hist = {f"i{i}": float(i % 7) for i in range(300)}
    rk = RunKey.from_test_seed(8)
    rule = NoisyThresholdRule("laplace", 1.0, 3.0, rk)
    expected = sorted(i for i, w in hist.items() if rule(i, w))
    shards = [(0, dict(list(hist.items())[:100])), (1, dict(list(hist.items())[100:]))]
    make_rule = functools.partial(NoisyThresholdRule, "laplace", 1.0, 3.0)
    with local_pipeline() as p:
        out = p | beam.Create(shards) | ApplyReleaseRule(make_rule, rk, sharded=True)
        assert_that(out, equal_to(expected))


def test_release_rule_decides_as_weight_plus_noise_above_the_threshold():
    # Every decision must equal weight > 0 and weight + noise(item) > T, the noise
    # computed here from the item's own SipHash-2-4 (the scalar reference,
    # dp.randomness.siphash.siphash24), its further blocks, and the scalar samplers.
    from beam_dpsu.dp.randomness.noise import (ItemBits, RunKey, encode_value, gaussian_from_stream,
                                    laplace_from_stream)
    from beam_dpsu.dp.randomness.release_rules import NoisyThresholdRule
    from beam_dpsu.dp.randomness.siphash import siphash24
    rk = RunKey.from_test_seed(11)
    items = [f"i{k}" for k in range(1000)] + list(range(200)) + [b"\xff", ("t", 1), 2.5]
    key = rk.subkey("noise/0")[:16]
    bits = [siphash24(key, encode_value(item)) for item in items]
    blocks = ItemBits(rk, "noise/0")
    for kind in ("gaussian", "laplace"):
        sampler = gaussian_from_stream if kind == "gaussian" else laplace_from_stream
        for threshold in (-1.0, 0.5, 4.0, 9.0):
            rule = NoisyThresholdRule(kind, 2.0, threshold, rk)
            for weight in (0.0, -1.0, 0.3, threshold, threshold + 1e-9, 12.0):
                got = rule.decide(items, np.full(len(items), weight))
                for k, item in enumerate(items):
                    noise = sampler(bits[k], lambda j, item=item: blocks.block(j).one(item), 2.0)
                    full = weight > 0 and weight + noise > threshold
                    # the inverse CDF and the tail agree but within rounding at the boundary
                    if abs(weight + noise - threshold) > 1e-9:
                        assert got[k] == full, (kind, threshold, item, weight)
                assert rule(items[0], weight) == got[0]
