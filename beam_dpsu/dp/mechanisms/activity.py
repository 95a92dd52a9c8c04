"""The users' activity, estimated with differential privacy: how many users hold how many
distinct items.

A mechanism whose parameters should follow the private data (GW-KT's Δ0, M and κ;
``--max-items-per-user auto``'s Δ0, ``dp.mechanisms.auto_bound``) reads them from this
estimate, never from the exact data. The users are counted in geometric buckets of
their number n ≥ 1 of distinct items, [B^b, B^(b+1)) for b < K − 1 and [B^(K−1), ∞)
last; each user is in exactly one bucket, so adding or removing a user moves exactly
one count by 1 (ℓ1 sensitivity 1), and each count plus its own grid Laplace noise of
scale 1/ε is ε-DP (up to the samplers' 2^-1074 floor: the grid Laplace's exponential
stops at 744 scales). Reading the noisy counts (``ScaleEstimate``) is post-processing.
The argument is in docs/gw.md section 3 ("Δ0, M and κ from a DP estimate") and, for
every mechanism, docs/mechanisms.md ("Δ0 chosen from the data").
"""
from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any, Iterable

import numpy as np

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.privacy.params import (ACTIVITY_BUCKET_BASE, ACTIVITY_BUCKETS,
                                         ACTIVITY_EMPTY_BELOW, CALIBRATED_MIN_SCALES)
from beam_dpsu.dp.randomness.noise import KeyedGridLaplace, RunKey

__all__ = ["ActivityBuckets", "SCALE_BUCKETS", "activity_buckets", "activity_histogram",
           "ScaleEstimate", "scale_statistics", "release_scale", "check_estimate_epsilon",
           "estimate_delta_tail", "estimate_delta_room"]

#: The largest ε of an estimate (e^ε must stay a finite double in ``estimate_delta_tail``).
MAX_ESTIMATE_EPSILON = 700.0


def check_estimate_epsilon(epsilon: float) -> float:
    """The estimate's ε₁, or ValueError when its noise scale 1/ε₁ would not be a finite
    double far from overflow (a tiny share of a tiny ε) or ε₁ > ``MAX_ESTIMATE_EPSILON``:
    refused when the mechanism is built, never after the data is read."""
    epsilon = cal.check_epsilon(epsilon, "the activity estimate's epsilon")
    if epsilon > MAX_ESTIMATE_EPSILON:
        raise ValueError(f"the activity estimate's epsilon (share × ε) must be at most "
                         f"{MAX_ESTIMATE_EPSILON:g}, got {epsilon!r}")
    scale = cal.scale_estimate_noise_scale(epsilon) if epsilon >= 1e-300 else math.inf
    if not scale <= 1e300:
        raise ValueError(f"the activity estimate's epsilon (share × ε) is {epsilon!r}: too "
                         "small for its noise scale 1/ε to be a double; give a larger share")
    return epsilon


def estimate_delta_tail(epsilon: float) -> Fraction:
    """A bound on the δ the estimate spends: its sampler's exponential stops at 744 scales
    (below 2^-1074), so on neighbouring datasets an output may lie up to one count beyond
    the other's support: δ₁ ≤ (e^ε₁ + 2)·2^-1074, exact (a rational)."""
    epsilon = check_estimate_epsilon(epsilon)
    return (Fraction(math.ceil(math.exp(epsilon))) + 2) * Fraction(2) ** -1074


def estimate_delta_room(delta: float, epsilon: float) -> float:
    """The δ₂ a release after an ε₁ estimate is calibrated to: the largest double with
    δ₂ + ``estimate_delta_tail(ε₁)`` ≤ δ in exact arithmetic (one ulp below δ, or a few,
    for every δ the mechanisms accept)."""
    delta = cal.check_delta(delta)
    tail = estimate_delta_tail(epsilon)
    room = float(Fraction(delta) - tail)
    while room > 0.0 and Fraction(room) + tail > Fraction(delta):
        room = math.nextafter(room, 0.0)
    if not room > 0.0:
        raise ValueError("delta is too small to hold the activity estimate's share of it "
                         f"({float(tail):.3g}): give a larger delta")
    return room


@dataclasses.dataclass(frozen=True)
class ActivityBuckets:
    """A bucket layout of the activity histogram: ``count`` buckets of base ``base``,
    [base^b, base^(b+1)) for b < count − 1, the last open.

    Attributes:
      base: B ≥ 2 (integer).
      count: K ≥ 1 (integer).
    """
    base: int
    count: int

    def __post_init__(self):
        for name, value, low in (("base", self.base, 2), ("count", self.count, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"an activity bucket {name} is an integer >= {low}, "
                                 f"got {value!r}")

    def of(self, distinct_items) -> np.ndarray:
        """Each user's bucket from its number n ≥ 1 of distinct items: ⌊log_B n⌋, at most
        K − 1. Exact in integers."""
        n = np.asarray(distinct_items, dtype=np.int64)
        if n.size and int(n.min()) < 1:
            raise ValueError("every user holds at least one item")
        b = np.zeros(n.shape, np.int64)
        edge = self.base
        for _ in range(1, self.count):
            b += n >= edge
            edge *= self.base
        return b

    def histogram(self, distinct_items) -> np.ndarray:
        """The exact histogram (K int64 counts) of users by bucket. Private: release it
        only through ``release_scale``."""
        return np.bincount(self.of(distinct_items), minlength=self.count)


#: GW-KT's layout: [1, 4), [4, 16), [16, 64), [64, ∞).
SCALE_BUCKETS = ActivityBuckets(ACTIVITY_BUCKET_BASE, ACTIVITY_BUCKETS)


def activity_buckets(distinct_items: np.ndarray) -> np.ndarray:
    """``SCALE_BUCKETS.of``: GW-KT's bucket of each user."""
    return SCALE_BUCKETS.of(distinct_items)


def activity_histogram(distinct_items: np.ndarray,
                       buckets: ActivityBuckets = SCALE_BUCKETS) -> np.ndarray:
    """The exact histogram of users by bucket of ``buckets`` (default GW-KT's), from each
    user's number of distinct items. Private: release it only through ``release_scale``."""
    return buckets.histogram(distinct_items)


@dataclasses.dataclass(frozen=True)
class ScaleEstimate:
    """A differentially private estimate of the users' activity: the users counted by
    their number of distinct items, in the buckets of base ``base``.

    Attributes:
      buckets: the bucket counts of ``activity_histogram``, each plus its own grid
        Laplace noise of scale ``calibration.scale_estimate_noise_scale(epsilon)``.
      epsilon: the ε it was released with (one user is in one bucket): ε-DP up to the
        samplers' 2^-1074 floor (the grid Laplace's exponential stops at 744 scales).
      base: the buckets' base B (default GW-KT's, ``params.ACTIVITY_BUCKET_BASE``); the
        layout is ``ActivityBuckets(base, len(buckets))``.
    """
    buckets: tuple
    epsilon: float
    base: int = ACTIVITY_BUCKET_BASE

    def __post_init__(self):
        b = tuple(float(x) for x in self.buckets)
        ActivityBuckets(self.base, max(1, len(b)))  # checks the base
        if not b or not all(math.isfinite(x) for x in b):
            raise ValueError(f"a ScaleEstimate holds finite bucket counts, got {self.buckets!r}")
        if self.base == ACTIVITY_BUCKET_BASE and len(b) != ACTIVITY_BUCKETS:
            raise ValueError(f"GW-KT's estimate (base {ACTIVITY_BUCKET_BASE}) holds "
                             f"{ACTIVITY_BUCKETS} bucket counts, got {self.buckets!r}")
        object.__setattr__(self, "buckets", b)
        object.__setattr__(self, "epsilon", cal.check_epsilon(self.epsilon))

    @property
    def layout(self) -> ActivityBuckets:
        return ActivityBuckets(self.base, len(self.buckets))

    def kept(self, empty_below: float = ACTIVITY_EMPTY_BELOW) -> np.ndarray:
        """The buckets read by the rules: a noisy count below ``empty_below`` noise
        scales (GW-KT's ``ACTIVITY_EMPTY_BELOW``; ``--max-items-per-user auto``'s
        ``AUTO_EMPTY_BELOW``) counts as 0 (post-processing: noise alone rarely reaches
        it, so empty buckets add little error to the sums)."""
        empty_below = float(empty_below)
        if not empty_below >= 0.0 or not math.isfinite(empty_below):
            raise ValueError(f"empty_below is a finite number >= 0, got {empty_below!r}")
        b = np.array(self.buckets)
        floor = empty_below * cal.scale_estimate_noise_scale(self.epsilon)
        return np.where(b < floor, 0.0, b)

    @property
    def users(self) -> float:
        """N̂, the estimated number of users: the kept buckets' sum, at least 1."""
        return max(1.0, float(self.kept().sum()))

    @property
    def informative(self) -> bool:
        """``holds_enough_users()`` at GW-KT's floor (``ACTIVITY_EMPTY_BELOW``)."""
        return self.holds_enough_users()

    def holds_enough_users(self, empty_below: float = ACTIVITY_EMPTY_BELOW) -> bool:
        """Whether the buckets kept at ``empty_below`` noise scales hold at least
        ``CALIBRATED_MIN_SCALES`` noise scales of users: below, the noise is comparable
        to the counts, and a rule reading the estimate keeps its fixed fallback."""
        return float(self.kept(empty_below).sum()) >= CALIBRATED_MIN_SCALES * \
            cal.scale_estimate_noise_scale(self.epsilon)

    def activity_quantile(self, q: float, empty_below: float = ACTIVITY_EMPTY_BELOW) -> float:
        """The q-quantile (0 < q < 1) of the users' number of distinct items, read from
        the buckets kept at ``empty_below`` noise scales: geometric interpolation inside
        the bucket [B^b, B^(b+1)) where the cumulative count crosses q·N̂ (the last
        bucket read as [B^(K-1), B^K)); 1 when every bucket is empty."""
        if not 0.0 < q < 1.0:
            raise ValueError(f"a quantile is in (0, 1), got {q!r}")
        c = self.kept(empty_below)
        total = float(c.sum())
        if total <= 0.0:
            return 1.0
        target = q * total
        cum = np.cumsum(c)
        last = len(c) - 1
        b = min(int(np.searchsorted(cum, target, side="left")), last)
        before = float(cum[b - 1]) if b else 0.0
        inside = 0.0 if c[b] <= 0 else min(1.0, max(0.0, (target - before) / float(c[b])))
        return float(self.base) ** (b + inside)


def scale_statistics(per_user_items: Iterable[Any],
                     buckets: ActivityBuckets = SCALE_BUCKETS) -> np.ndarray:
    """The exact ``activity_histogram`` of ``per_user_items`` (one collection of
    distinct items per user, e.g. ``{item: count}``; a user without items is not
    counted). Private: release it only through ``release_scale``."""
    n = np.fromiter((len(items) for items in per_user_items), dtype=np.int64)
    return buckets.histogram(n[n > 0])


def release_scale(histogram, epsilon: float, run_key: RunKey,
                  base: int = ACTIVITY_BUCKET_BASE, purpose: str = "scale") -> ScaleEstimate:
    """``histogram`` (``activity_histogram``'s counts, in buckets of ``base``) released
    with ε-DP: each bucket plus grid Laplace noise of scale
    ``calibration.scale_estimate_noise_scale(ε)`` ≥ 1/ε, drawn from ``run_key`` under
    ``purpose`` (GW-KT's ``scale``; ``--max-items-per-user auto``'s ``activity``), one
    independent draw per bucket. Adding or removing one user moves exactly one bucket by
    1 (ℓ1 sensitivity 1)."""
    counts = np.asarray(histogram, dtype=np.int64)
    if counts.ndim != 1 or not counts.size or int(counts.min(initial=0)) < 0:
        raise ValueError(f"the histogram holds bucket counts >= 0, got {histogram!r}")
    noise = KeyedGridLaplace(run_key, cal.scale_estimate_noise_scale(epsilon), purpose)
    return ScaleEstimate(tuple(noise(float(n), b"users/%d" % b) for b, n in enumerate(counts)),
                         float(epsilon), base)
