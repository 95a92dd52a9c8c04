"""Every sampler's resolution against the δ it serves, in exact arithmetic with no slack.

The release rules decide with ``noise.uniform_below`` (a Bernoulli trial whose success
probability is exactly the double it is given) on probabilities from ``noise_tail``
(rounded down where a release is rare, up where a drop is) and on the truncated
geometric's table (rounded step by step). So the probability that one added user's new
item is released is a known dyadic rational, and these tests compare it with the
per-item δ of each mechanism's proof, computed with mpmath at 80 digits, over a grid of
(ε, δ, Δ0) that reaches the smallest δ the constructors accept.
"""
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.randomness import noise
from beam_dpsu.dp.mechanisms.histogram_threshold import (CountGaussian, CountLaplace,
                                                         TruncatedGeometric, WeightedGaussian,
                                                         WeightedGaussianZcdp, WeightedLaplace)
from beam_dpsu.dp.mechanisms.policy import GW, PolicyGaussian, PolicyLaplace
from beam_dpsu.dp.mechanisms.sips import Sips
from beam_dpsu.dp.privacy.params import MIN_PER_ITEM_DELTA
from beam_dpsu.dp.randomness.release_rules import TAIL_MARGIN, TruncatedGeometricRule, noise_tail
from beam_dpsu.dp.randomness.noise import RunKey

DPS = 80


def mp(x) -> mpmath.mpf:
    """A double (or Fraction) as an exact mpmath number."""
    if isinstance(x, Fraction):
        return mpmath.mpf(x.numerator) / x.denominator
    return mpmath.mpf(float(x))


def exact_per_item_delta(delta, t) -> mpmath.mpf:
    """1 − (1 − δ)^(1/t), exact to 80 digits for the double δ."""
    return -mpmath.expm1(mpmath.log1p(-mp(delta)) / t)


# ---- the exact Bernoulli trial ---------------------------------------------------

def _u_below(head, width, blocks, q) -> bool:
    # U with its first width bits, then 19 blocks: q is a multiple of 2^-1074 and U is
    # known to 2^-(width + 64·19) < 2^-1074, so U < q iff this prefix is below q
    u = Fraction(head & ((1 << width) - 1), 1 << width)
    for j, b in enumerate(blocks, 1):
        u += Fraction(int(b), 1 << (width + 64 * j))
    return u < Fraction(q)


def _expansion_blocks(q, width, count):
    """The blocks of q's binary expansion after its first ``width`` bits."""
    rest = Fraction(q) * (1 << width)
    rest -= rest.numerator // rest.denominator
    out = []
    for _ in range(count):
        rest *= 1 << 64
        b = rest.numerator // rest.denominator
        out.append(b)
        rest -= b
    return out


@pytest.mark.parametrize("width", [63, 64])
def test_uniform_below_is_exactly_u_below_q(width):
    rng = np.random.default_rng(3)
    qs = [5e-324, 3 * 5e-324, 2.0 ** -1022, 1e-300, 2.0 ** -64, 2.0 ** -63,
          math.nextafter(2.0 ** -63, 1.0), 1e-20, 0.3, 0.5, 1 - 2.0 ** -53, 0.1 + 2 ** -60]
    qs += list(10.0 ** -rng.uniform(0, 323, 60))
    heads, blocks, qvals = [], [], []
    for q in qs:
        bound = int(Fraction(q) * (1 << width))
        exp = _expansion_blocks(q, width, noise.MAX_BLOCKS + 1)
        candidates = [(bound, exp), (bound, [b ^ 1 for b in exp])]      # deep ties
        for j in range(3):                                            # a tie up to block j
            tail = list(exp[:j]) + [int(rng.integers(0, 2 ** 64, dtype=np.uint64))] * 20
            candidates.append((bound, tail[:noise.MAX_BLOCKS + 1]))
        candidates += [(max(bound - 1, 0), exp), (bound + 1, exp),
                       (int(rng.integers(0, 2 ** 63)), exp)]
        for head, bl in candidates:
            heads.append(head % (1 << 64))
            blocks.append(bl)
            qvals.append(q)
    blocks = np.array(blocks, dtype=np.uint64)

    def more(indices, j):
        return blocks[indices, j - 1]

    got = noise.uniform_below(np.array(heads, np.uint64), width, np.array(qvals), more)
    want = [_u_below(h, width, b.tolist(), q) for h, b, q in zip(heads, blocks, qvals)]
    assert got.tolist() == want
    assert any(want) and not all(want)


def test_uniform_below_edges():
    more = lambda indices, j: np.zeros(len(indices), np.uint64)  # noqa: E731
    heads = np.array([0, 0, 0, 2 ** 64 - 1], np.uint64)
    got = noise.uniform_below(heads, 64, np.array([0.0, -1.0, float("nan"), 1.0]), more)
    assert got.tolist() == [False, False, False, True]   # q ≤ 0 or NaN never, q ≥ 1 always


# ---- the tails the release rules decide on ----------------------------------------

def _exact_tail(kind, scale, gap):
    if kind == "laplace":
        return mpmath.exp(-mp(gap) / mp(scale))
    return mpmath.erfc(mp(gap) / (mp(scale) * mpmath.sqrt(2)))


@pytest.mark.parametrize("kind,scale,top", [("laplace", 1.0, 746.0), ("laplace", 0.37, 280.0),
                                            ("gaussian", 1.0, 38.6), ("gaussian", 2.9, 112.0)])
def test_noise_tail_is_rounded_the_safe_way_everywhere(kind, scale, top):
    rng = np.random.default_rng(11)
    gaps = np.concatenate([[0.0, 1e-300, 1e-12], rng.uniform(0, top, 3000),
                           np.linspace(top * 0.9, top, 200)])
    down = noise_tail(kind, scale, gaps)
    up = noise_tail(kind, scale, gaps, upward=True)
    with mpmath.workdps(DPS):
        for g, d, u in zip(gaps.tolist(), down.tolist(), up.tolist()):
            exact = min(_exact_tail(kind, scale, g), mpmath.mpf(1))
            assert mp(d) <= exact <= mp(u), (g, d, u)
            if exact > mpmath.mpf(2) ** -1000:     # and close: the margin, not more
                assert mp(d) >= exact * (1 - 2 * TAIL_MARGIN), g
                assert mp(u) <= exact * (1 + 2 * TAIL_MARGIN), g
    assert down[-1] >= 0.0 and up[0] == 1.0


# ---- one added user's new items, per mechanism -------------------------------------

GRID = [(eps, delta, dmax) for eps in (1e-2, 1.0, 10.0)
        for delta in (1e-298, 1e-30, 1e-12, 1e-6, 0.3) for dmax in (1, 100, 10 ** 6)]


def _threshold_mechanisms(eps, delta, dmax):
    """(mechanism, δ share of its new items, zcdp) for each threshold mechanism."""
    out = [(CountLaplace(eps, delta, dmax), delta), (WeightedLaplace(eps, delta, dmax), delta),
           (CountGaussian(eps, delta, dmax), delta / 2),
           (WeightedGaussian(eps, delta, dmax), delta / 2),
           (PolicyLaplace(eps, delta, dmax), delta), (PolicyGaussian(eps, delta, dmax), delta / 2),
           (WeightedGaussianZcdp(eps / 10, delta, dmax), delta)]
    sips = Sips.from_dp(eps, delta, dmax)
    out += [(sips, r.delta) for r in sips.rounds]
    return out


def _ts(dmax):
    ts = set(range(1, min(dmax, 60) + 1)) | {dmax}
    ts |= {int(round(x)) for x in np.geomspace(1, dmax, 40)}
    return sorted(ts)


def _new_item_weight(weighting, t):
    return {"count": 1.0, "l1": 1.0 / t, "l2": 1.0 / math.sqrt(t)}[weighting]


@pytest.mark.slow
@pytest.mark.parametrize("eps,delta,dmax", GRID)
def test_new_items_of_an_added_user_never_exceed_the_stated_delta(eps, delta, dmax):
    # The release probability of an item only the added user holds, through the
    # production rule: the noise's sign is positive (½) and U < noise_tail(T − w)
    # (exactly that double); the proof needs it ≤ δ_t = 1 − (1 − share)^(1/t) for the
    # t items the user spreads over (so that 1 − (1 − p)^t ≤ share), in exact arithmetic.
    with mpmath.workdps(DPS):
        for mechanism, share in _threshold_mechanisms(eps, delta, dmax):
            rounds = mechanism.rounds
            for i, r in enumerate(rounds):
                ts = [dmax] if r.weighting == "count" else _ts(dmax)
                weights = np.array([_new_item_weight(r.weighting, t) for t in ts])
                q = noise_tail(r.noise, r.noise_scale, r.threshold - weights)
                for t, qt in zip(ts, q.tolist()):
                    p = mp(Fraction(qt) / 2)
                    assert p <= exact_per_item_delta(share if len(rounds) == 1 else r.delta, t), (
                        mechanism.name, i, t)


@pytest.mark.slow
@pytest.mark.parametrize("eps,delta,dmax", [(e, d, m) for e, d, m in GRID if d < 0.5 and m <= 100])
def test_cascade_free_gw_new_items_never_exceed_the_stated_delta(eps, delta, dmax):
    # The worst case of docs/gw.md: one new item of weight 1 and Δ0 − 1 of weight → 0.
    gw = GW(eps, delta, max_items=dmax)
    r = gw.rounds[0]
    q_one, q_zero = noise_tail("laplace", r.noise_scale, [r.threshold - 1.0, r.threshold])
    with mpmath.workdps(DPS):
        escape = (1 - mp(Fraction(q_one) / 2)) * (1 - mp(Fraction(q_zero) / 2)) ** (dmax - 1)
        assert 1 - escape <= mp(delta)


# ---- the review's examples ---------------------------------------------------------

def test_weighted_laplace_at_delta_1e_30_has_no_floor():
    # T = 69.38: an item of 25 users was never released (below the old sampler's reach),
    # one of 26 users with probability 5.4e-20. Now both have their Laplace tail.
    m = WeightedLaplace(1.0, 1e-30, 1)
    r = m.rounds[0]
    p25, p26 = (noise_tail("laplace", r.noise_scale, [r.threshold - h]) / 2 for h in (25, 26))
    assert p25[0] > 0 and p26[0] / p25[0] == pytest.approx(math.e, rel=1e-9)
    with mpmath.workdps(DPS):
        assert mp(p25[0]) <= mpmath.exp(-(mp(r.threshold) - 25)) / 2


def _truncated_geometric_per_item_delta(eps, delta, dmax, table):
    """The exact per-item δ of the production keep table at ε' = ε/Δ0: the largest
    excess of P(keep) or P(drop) with one more (or one fewer) user over e^ε' times it."""
    grow = mpmath.exp(mp(eps) / dmax)
    p = [mp(x) for x in table]
    worst = p[1]   # n = 0 → 1: P(keep) goes from 0 to p(1)
    for a, b in zip(p[:-1], p[1:]):
        worst = max(worst, b - grow * a, a - grow * b,
                    (1 - a) - grow * (1 - b), (1 - b) - grow * (1 - a))
    return worst


@pytest.mark.parametrize("eps,delta,dmax,size", [
    (1.0, 1e-12, 10 ** 6, 3000),       # the review's example: 222 times δ before
    (1.0, 1e-10, 10 ** 6, 3000),       # 2.2 times δ before
    (1.0, 1e-14, 100, 6000),           # 2.2 times δ before; reaches p = 1
    (1.0, 1e-6, 4, 400), (0.1, 1e-30, 1, 2000), (5.0, 1e-300, 10, 3000),
    (1e-3, 0.3, 1, 50), (3.0, 1e-20, 1, 40)])
def test_truncated_geometric_actual_delta_is_at_most_the_stated(eps, delta, dmax, size):
    table = cal.truncated_geometric_keep_probabilities(eps, delta, dmax, size)
    rule = TruncatedGeometricRule(eps, delta, dmax, RunKey.from_test_seed(0))
    rule.probability(size - 1)
    assert np.array_equal(rule._table[:size + 1], table[:len(rule._table)][:size + 1])
    with mpmath.workdps(DPS):
        per_item = _truncated_geometric_per_item_delta(eps, delta, dmax, table)
        assert per_item <= exact_per_item_delta(delta, dmax)
        # Δ0 independent decisions: 1 − (1 − δ')^Δ0 ≤ δ
        assert 1 - (1 - max(per_item, 0)) ** dmax <= mp(delta)
    assert table[1] > 0                                   # no probability rounded to 0


def test_truncated_geometric_stops_short_of_one_where_delta_is_below_resolution():
    # δ' = 1e-20 is below the doubles' step near 1 (1.1e-16): the keep probability
    # rises to just below 1 and stays there; p = 1 would need 1 − p(n−1) ≤ δ'.
    table = cal.truncated_geometric_keep_probabilities(3.0, 1e-20, 1, 200)
    assert table[-1] < 1.0 and table[-1] > 1 - 1e-15
    assert table[-1] == table[-2]
    loose = cal.truncated_geometric_keep_probabilities(3.0, 1e-3, 1, 200)
    k = int(np.argmax(loose >= 1.0))
    assert k > 0 and Fraction(1) - Fraction(loose[k - 1]) <= Fraction(
        cal.truncated_geometric_parameters(3.0, 1e-3, 1)[1])


def test_truncated_geometric_parameters_are_rounded_down():
    for eps, delta, dmax in [(1.0, 1e-6, 3), (0.7, 1e-12, 10 ** 6), (2.0, 0.3, 7)]:
        e1, d1 = cal.truncated_geometric_parameters(eps, delta, dmax)
        assert Fraction(e1) * dmax <= Fraction(eps)
        with mpmath.workdps(DPS):
            assert mp(d1) <= exact_per_item_delta(delta, dmax)


# ---- refusals at the resolution's end ----------------------------------------------

@pytest.mark.parametrize("build,accepted", [
    (lambda d: CountLaplace(1.0, d, 10 ** 6), 1e-300),
    (lambda d: WeightedGaussian(1.0, d, 10 ** 6), 1e-300),
    (lambda d: TruncatedGeometric(1.0, d, 10 ** 6), 1e-300),
    (lambda d: GW(1.0, d, max_items=10 ** 6), 1e-300),
    (lambda d: WeightedGaussianZcdp(0.1, d, 10 ** 6), 1e-300),
    (lambda d: Sips.from_dp(1.0, d, 10 ** 6), 1e-298)])
def test_a_delta_below_the_resolution_is_refused_with_the_smallest_supported(build, accepted):
    with pytest.raises(ValueError, match=r"the smallest delta supported here is (\S+)") as err:
        build(1e-303)
    smallest = float(err.value.args[0].rsplit(" ", 1)[1])
    assert 1e-303 < smallest <= accepted
    build(accepted)
    build(smallest)                                     # the number named is accepted
    with pytest.raises(ValueError, match="too small"):
        build(smallest / 1.02)                        # 3 digits rounded up: within 1%
    assert cal.per_item_delta(1e-300 / 2, 10 ** 6) >= MIN_PER_ITEM_DELTA


# ---- the Gumbel samplers' tails -----------------------------------------------------

def test_gumbel_upper_tail_is_the_exact_one_far_beyond_64_bits():
    # P(G > x) for the production sampler: G > x iff 1 − U < v*, v* found on the doubles;
    # 1 − U is full precision (half_uniform), so P = v* within 2^-52 relative.
    def g_of_v(v):
        return -math.log(-math.log1p(-v))
    with mpmath.workdps(DPS):
        for x in (5.0, 40.0, 50.0, 200.0, 700.0):
            lo, hi = 5e-324, 0.5           # g_of_v decreasing... find v* = sup{v: G > x}
            for _ in range(2000):
                mid = (lo + hi) / 2
                if mid in (lo, hi):
                    break
                if g_of_v(mid) < x:        # G(v) grows as v shrinks
                    hi = mid
                else:
                    lo = mid
            exact = -mpmath.expm1(-mpmath.exp(-mp(x)))
            assert abs(mp(lo) / exact - 1) < 1e-12, x
    # the old 52-bit sampler stopped at 36.7 scales
    assert noise.gumbel_from_stream((1 << 63) | (2 ** 63 - 1), lambda j: 2 ** 64 - 1, 1.0) > 700


def _gumbel_tail_bound(scale, x):
    """An upper bound on P(G > x) for the production Gumbel(0, scale) (the upper branch of
    ``noise.gumbel_from_stream``, evaluated in floats as it is): G > x iff 1 − U < v*
    for the v* found on the doubles, and 1 − U is a full-precision uniform rounded to
    nearest (``half_uniform``), so the probability is at most v*·(1 + 2^-52)."""
    def above(v):
        return -scale * math.log(-math.log1p(-v)) > x
    lo, hi = 5e-324, 0.5
    if not above(lo):
        return 0.0
    while True:
        mid = math.sqrt(lo) * math.sqrt(hi) if hi / lo > 4 else (lo + hi) / 2
        if mid in (lo, hi):
            return hi
        lo, hi = (mid, hi) if above(mid) else (lo, mid)


@pytest.mark.parametrize("eps", [0.1, 1.0, 10.0])
@pytest.mark.parametrize("delta", [1e-298, 1e-30, 1e-12, 1e-6, 0.3])
@pytest.mark.parametrize("m", [1, 20, 1000])
def test_gumbel_offset_tail_is_at_most_delta_over_m(eps, delta, m):
    # top-k's Algorithm 2: a candidate's Gumbel(1/ε) must pass offset − 1 = log(m/δ)/ε
    # with probability at most δ/m; the offset is rounded up, the production tail checked
    offset = cal.gumbel_threshold_offset(eps, delta, m)
    bound = _gumbel_tail_bound(1.0 / eps, offset - 1.0)
    with mpmath.workdps(DPS):
        assert mp(bound) * (1 + mpmath.mpf(2) ** -52) <= mp(delta) / m


def test_the_vectorised_half_uniform_is_the_scalar_one_to_the_bit():
    rng = np.random.default_rng(4)
    tails = np.concatenate([rng.integers(2 ** 53, 2 ** 63, 20000, dtype=np.uint64),
                            np.array([2 ** 53, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 60 + 12345],
                                     np.uint64)])
    got = noise.half_uniform_many(tails, None)
    assert all(got[i] == noise.half_uniform(int(t), None) for i, t in enumerate(tails.tolist()))


def test_the_scale_estimates_noise_never_spends_more_than_its_epsilon():
    rng = np.random.default_rng(6)
    for eps in list(10 ** rng.uniform(-6, 2, 5000)) + [0.06, 3.0, 1 / 3]:
        scale = cal.scale_estimate_noise_scale(float(eps))
        assert Fraction(1) / Fraction(scale) <= Fraction(float(eps))


def test_the_keep_table_grows_only_as_far_as_it_must():
    rule = TruncatedGeometricRule(1.0, 1e-5, 1, RunKey.from_test_seed(0))
    assert rule("a", 1e12)                       # p(n) = 1 there, without a huge table
    assert len(rule._table) <= 2048
    slow = TruncatedGeometricRule(0.01, 1e-12, 1000, RunKey.from_test_seed(0))
    slow.probability(5000)
    assert 5000 < len(slow._table) <= 16384


# ---- top-k at large counts: the offset is never rounded away ---------------------------

def _discrete_laplace_difference_tail(t, k):
    """P(Z₁ − Z₂ > k) for independent Z with P(Z = z) ∝ r^|z|, r = e^(−1/t), integer k ≥ 0:
    P(Z₁ − Z₂ = d) = a²·r^d·(d + (1 + r²)/(1 − r²)) for d ≥ 0, a = (1 − r)/(1 + r), summed
    in closed form (independent of the sampler's code)."""
    r = mpmath.exp(-1 / t)
    a, c, n = (1 - r) / (1 + r), (1 + r * r) / (1 - r * r), k + 1
    return a * a * r ** n * (n / (1 - r) + r / (1 - r) ** 2 + c / (1 - r))


@pytest.mark.parametrize("eps,delta,dmax", [(3.0, 1e-10, 1), (1.0, 1e-6, 10), (0.1, 1e-12, 5)])
@pytest.mark.parametrize("h_bottom", [0, 1000, 10 ** 8, 3 * 10 ** 9, 3 * 10 ** 9 + 7, 2 ** 52])
def test_topk_laplace_escape_at_large_counts_is_at_most_delta_over_max_items(
        eps, delta, dmax, h_bottom):
    # Algorithm 1: an item at h_b + 1 clears the threshold iff Z_j − Z_⊥ exceeds the grid
    # steps between its index and the threshold's; that tail, exact for the discrete
    # noise, is at most δ/Δ at every h_b (a double h_b + c made it 1.000000152·δ/Δ)
    from beam_dpsu.dp.mechanisms.topk import laplace_threshold_index
    b = cal.topk_laplace_scale(eps, dmax)
    g = noise.grid_granularity(b)
    c = cal.laplace_threshold_offset(eps, delta, dmax)
    steps = laplace_threshold_index(h_bottom, c, g) - noise.round_to_grid(h_bottom + 1, g)
    assert Fraction(steps) * Fraction(g) >= Fraction(c) - 1       # the offset, rounded up
    with mpmath.workdps(DPS):
        t = mp(Fraction(b) / Fraction(g))
        assert _discrete_laplace_difference_tail(t, steps) <= mp(delta) / dmax


@pytest.mark.parametrize("eps,delta,m", [(3.0, 1e-10, 1), (1.0, 1e-6, 20), (0.1, 1e-12, 1000)])
@pytest.mark.parametrize("h_bottom", [10 ** 8, 3 * 10 ** 9, 2 ** 52])
def test_topk_gumbel_threshold_at_large_counts_keeps_the_whole_offset(eps, delta, m, h_bottom):
    # Algorithm 2: the candidate at h_b + 1 clears iff (h_j − h_b) + G_j > offset + G_⊥,
    # in exact rationals: the offset the tail bound uses is the one the decision applies
    from beam_dpsu.dp.mechanisms.topk import gumbel_margin
    offset = cal.gumbel_threshold_offset(eps, delta, m)
    for g_bottom in (0.0, -1.5, 3.25, 0.1):
        bottom = Fraction(offset) + Fraction(g_bottom)
        g = float(bottom - 1)                                    # nearest double
        while Fraction(1) + Fraction(g) > bottom:
            g = math.nextafter(g, -math.inf)
        assert not gumbel_margin(h_bottom + 1, h_bottom, g) > bottom
        assert gumbel_margin(h_bottom + 1, h_bottom, math.nextafter(g, math.inf)) > bottom
        assert gumbel_margin(h_bottom + 1, h_bottom, g) == 1 + Fraction(g)
    bound = _gumbel_tail_bound(1.0 / eps, offset - 1.0)
    with mpmath.workdps(DPS):
        assert mp(bound) * (1 + mpmath.mpf(2) ** -52) <= mp(delta) / m


class _StubNoise:
    """Chosen noise for ``TopKMechanism.release``: Gumbel values, or grid integers."""

    def __init__(self, values, scale):
        self.values, self.scale = values, scale
        self.granularity = noise.grid_granularity(scale)

    def __call__(self, *args):
        if len(args) == 1:                                      # KeyedNoise(item)
            return self.values[args[0]]
        value, item = args                                      # KeyedGridLaplace
        return float(self.index(value, item)) * self.granularity

    def index(self, value, item):
        return noise.round_to_grid(value, self.granularity) + self.values[item]


def _release_with_noise(monkeypatch, mechanism, top, values):
    from beam_dpsu.dp.mechanisms import topk
    stub = _StubNoise(values, mechanism.noise_scale)
    monkeypatch.setattr(topk, "KeyedNoise", lambda *a, **k: stub)
    monkeypatch.setattr(topk, "KeyedGridLaplace", lambda *a, **k: stub)
    return mechanism.release(top, RunKey.from_test_seed(0))


def test_topk_releases_decide_exactly_at_large_counts(monkeypatch):
    # the candidate one user above h_b, its noise just short of the threshold's offset;
    # at these h_b the doubles h_b + offset and h_j + G_j round it across the threshold
    from beam_dpsu.dp.mechanisms.topk import BOTTOM, TopKMechanism
    item = noise.encode_value("x")
    gumbel = TopKMechanism(1, 3.0, 1e-10, k_bar=1)             # h_b: the second item
    laplace = TopKMechanism(1, 3.0, 1e-10, k_bar=1, max_items=1, with_counts=True)
    g = noise.grid_granularity(laplace.noise_scale)
    c = laplace.threshold_offset
    crossed = {"gumbel": 0, "laplace": 0}
    for h_b in range(10 ** 8, 10 ** 8 + 40):
        top = [("x", h_b + 1), ("y", h_b)]
        for g_bottom in (0.0, 0.37, -1.9, 2.71):
            bottom = Fraction(gumbel.threshold_offset) + Fraction(g_bottom)
            short = float(bottom - 1)
            while 1 + Fraction(short) > bottom:
                short = math.nextafter(short, -math.inf)
            assert _release_with_noise(monkeypatch, gumbel, top,
                                       {BOTTOM: g_bottom, item: short}) == []
            crossed["gumbel"] += ((h_b + 1) + short
                                  > h_b + gumbel.threshold_offset + g_bottom)
            assert _release_with_noise(monkeypatch, gumbel, top, {
                BOTTOM: g_bottom, item: math.nextafter(short, math.inf)}) == [(1, "x")]
    for h_b in range(3 * 10 ** 9, 3 * 10 ** 9 + 40):
        top = [("x", h_b + 1), ("y", h_b)]
        z = math.ceil(Fraction(c) / Fraction(g)) - int(1 / g)   # the item lands on the threshold
        assert _release_with_noise(monkeypatch, laplace, top, {BOTTOM: 0, item: z}) == []
        crossed["laplace"] += (noise.round_to_grid(h_b + 1, g) + z
                               > noise.round_to_grid(h_b + c, g))
        got = _release_with_noise(monkeypatch, laplace, top, {BOTTOM: 0, item: z + 1})
        assert [r[:2] for r in got] == [(1, "x")]
        assert got[0][2] == float(Fraction(h_b + 1) + (z + 1) * Fraction(g))  # rounded once
    assert crossed["gumbel"] > 0 and crossed["laplace"] > 0   # the doubles would release


def test_top_k_with_counts_refuses_a_laplace_scale_whose_grid_step_exceeds_one():
    # Algorithm 1 keeps integer counts on the grid Laplace's grid: its step (a power of
    # two at or below b/2^40) must be at most 1, so b = (Δ + 1)/ε below 2^41.
    from beam_dpsu.dp.privacy.calibration import TOPK_MAX_LAPLACE_SCALE, topk_laplace_scale
    from beam_dpsu.dp.randomness.noise import grid_granularity
    assert grid_granularity(math.nextafter(TOPK_MAX_LAPLACE_SCALE, 0)) == 1.0
    assert grid_granularity(TOPK_MAX_LAPLACE_SCALE) == 2.0
    eps_edge = 11 / TOPK_MAX_LAPLACE_SCALE                  # b = 2^41 exactly at Δ = 10
    with pytest.raises(ValueError, match="2\\^41"):
        topk_laplace_scale(eps_edge, 10)
    assert grid_granularity(topk_laplace_scale(eps_edge * 1.0001, 10)) <= 1.0
