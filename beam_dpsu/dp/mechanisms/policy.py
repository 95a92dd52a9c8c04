"""The sequential policy mechanisms (``docs/mechanisms.md`` section 4; GW in ``docs/gw.md``).

Each mechanism is a sequential update policy (``beam_dpsu.dp.data.sequential``) run
over the users in a keyed order, followed by noise and the threshold T.
The Beam expansion runs the policy with ``ordered.OrderedUserPolicy`` and
applies the release rule with ``transforms.release.ApplyReleaseRule``, the histogram
passing between them in shards (one element per shard, not per item); the Beam-free
run (``run_local``, next to it) runs the same policy with
``sequential.run_sequential`` in the same order, so both release the same set
under the same key.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import math
from typing import Any, Dict, Hashable, Mapping, Optional

import numpy as np

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.data import sequential as policies
from beam_dpsu.dp.privacy.accounting import PrivacyGuarantee
from beam_dpsu.dp.mechanisms.activity import (SCALE_BUCKETS, ScaleEstimate,
                                              check_estimate_epsilon, estimate_delta_room,
                                              release_scale, scale_statistics)
from beam_dpsu.dp.mechanisms.base import RoundCalibration, ThresholdMechanism
from beam_dpsu.dp.mechanisms.histogram_threshold import WeightedGaussian, WeightedLaplace
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.privacy.params import (DEFAULT_MAX_ITEMS, gw_default_max_items, gwkt_default_max_items,
                                 DEFAULT_ALPHA, DEFAULT_GW_ETA, DEFAULT_GWKT_SELECTION,
                                 DEFAULT_FRONT_SCALE, DEFAULT_FRONT_MARGIN,
                                 DEFAULT_EMBEDDED_TIE_BREAK, FRONT_SCALE_FACTOR,
                                 MAX_MAX_ITEMS, CALIBRATED_WIDTH_DIVISOR,
                                 CALIBRATED_WIDTH_RANGE, CALIBRATED_MARGIN_FRACTION)


__all__ = ["STATES", "PolicyMechanism", "PolicyLaplace", "PolicyGaussian", "VARIANTS",
           "check_variant", "GW", "GWKT", "FRONT_SCALE_RANGE", "front_scale_from_estimate",
           "max_items_from_estimate", "front_margin_for"]



#: How the Beam expansion (``transforms.ordered.OrderedUserPolicy``) keeps the users
#: in order: ``'auto'``, ``'ordered_list'``, ``'bag'`` or ``'gbk'`` (no privacy effect).
STATES = ("auto", "ordered_list", "bag", "gbk")


class PolicyMechanism(ThresholdMechanism):
    """A sequential policy followed by noise and the threshold T (``docs/mechanisms.md`` section 4).

    Subclasses set the calibration and build the policy; this class runs it
    with ``OrderedUserPolicy`` in Beam and with ``sequential.run_sequential`` in
    the Beam-free core (``dp.mechanisms.base.run_local``), with the same functions and order.

    Attributes (besides those of ``Mechanism``):
      alpha: α, the cutoff multiplier.
      cutoff: Γ = T + α·(λ or σ).
      state: the ``OrderedUserPolicy`` state choice (no privacy effect).
    """

    public_counts = None
    policy_name = ""
    #: The histogram mechanism whose calibration (T, noise) this policy shares.
    _calibrated_as = None

    def __init__(self, name: str, guarantee: PrivacyGuarantee, round_: RoundCalibration,
                 alpha: float, state: str):
        self.name = name
        self.guarantee = guarantee
        self.rounds = [round_]
        self.alpha = _check_alpha(alpha)
        self.cutoff = cal.policy_cutoff(round_.threshold, round_.noise_scale, self.alpha)
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        self.state = state

    def policy(self, run_key: RunKey) -> policies.UserPolicy:
        """The update policy of this run (its keys derive from ``run_key``)."""
        raise NotImplementedError

    _policy_weights = True  # units.threshold_meaning: weights go to items below the cutoff

    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d.update({"alpha": self.alpha, "cutoff": self.cutoff, "policy": self.policy_name})
        return d

    def threshold_for(self, epsilon: float, delta: float) -> float:
        if self._calibrated_as is None:
            return super().threshold_for(epsilon, delta)
        return self._calibrated_as.calibrate(epsilon, delta, self.max_items)[1].threshold

    def _public_counts_local(self):
        return None

    def histogram_local(self, per_user, run_key: RunKey) -> Dict[Hashable, float]:
        """The finished policy histogram ``{item: weight > 0}`` (not private)."""
        return policies.run_sequential(per_user, self.policy(run_key), run_key,
                                       self._public_counts_local())

def _check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) \
            or not (float(alpha) >= 0 and math.isfinite(float(alpha))):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    return float(alpha)


class _DescentMechanism(PolicyMechanism):
    """Δ0 sampling, a descent policy to Γ, then the noise and T of a weighted mechanism.

    Declared by ``_name``, ``policy_name``, ``_calibrated_as`` (the weighted
    histogram mechanism whose calibration it shares) and ``_policy_class``.
    """

    _name = ""
    _policy_class = None

    def __init__(self, epsilon: float, delta: float, max_items: int = DEFAULT_MAX_ITEMS,
                 alpha: float = DEFAULT_ALPHA, state: str = "auto"):
        super().__init__(self._name, *self._calibrated_as.calibrate(epsilon, delta, max_items),
                         alpha, state)

    def policy(self, run_key):
        return self._policy_class(self.cutoff, self.max_items, run_key.subkey("sample/0"),
                                  run_key.subkey("item-order"))


class PolicyLaplace(_DescentMechanism):
    """Policy Laplace (Gopi et al.): Δ0 sampling, ℓ1-descent to Γ, Laplace noise.

    λ = 1/ε; T as Weighted Laplace, ``max_t [1/t + λ·log(1/(2δ_t))]``;
    Γ = T + α·λ. Guarantee: (ε, δ)-DP.

    Args:
      epsilon: ε > 0 of the (ε, δ)-DP guarantee of the release.
      delta: 0 < δ < 1, its δ.
      max_items: Δ0 ≥ 1, distinct items kept per user (default 100). A larger
        Δ0 raises T slightly (δ_t for more t) and lets users reach more items;
        no effect on the guarantee (the calibration accounts for it).
      alpha: α ≥ 0 (default 3): the cutoff Γ = T + α·λ. Larger α wastes less
        budget on items that would be released anyway only when it is small;
        no privacy effect.
      state: ``OrderedUserPolicy`` state choice (default ``'auto'``); no privacy
        effect.
    """

    _name, policy_name = "policy-laplace", "l1-descent"
    _calibrated_as, _policy_class = WeightedLaplace, policies.L1DescentPolicy


class PolicyGaussian(_DescentMechanism):
    """Policy Gaussian (Gopi et al.): Δ0 sampling, ℓ2-descent to Γ, Gaussian noise.

    σ = AGM(ε, δ/2, 1); T as Weighted Gaussian,
    ``max_t [1/√t + σ·Φ⁻¹(1 − δ'_t)]`` with δ' from δ/2; Γ = T + α·σ.
    Guarantee: (ε, δ)-DP.

    Args:
      epsilon: ε > 0 of the (ε, δ)-DP guarantee of the release.
      delta: 0 < δ < 1, its δ.
      max_items: Δ0 ≥ 1, distinct items kept per user (default 100); no effect on
        the guarantee (the calibration accounts for it).
      alpha: α ≥ 0 (default 3), Γ = T + α·σ; no privacy effect.
      state: ``OrderedUserPolicy`` state choice (default ``'auto'``); no privacy
        effect.
    """

    _name, policy_name = "policy-gaussian", "l2-descent"
    composition = "gaussian"
    _calibrated_as, _policy_class = WeightedGaussian, policies.L2DescentPolicy


VARIANTS = ("cascade-free", "published")


def check_variant(variant) -> str:
    """Validates GW's variant: ``'cascade-free'`` (proven) or ``'published'`` (unproven)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return variant


class GW(PolicyMechanism):
    """GW (greedy weighting, after Carvalho et al.): by default the cascade-free greedy.

    ``variant='cascade-free'`` (default; ``docs/mechanisms.md`` section 4, proof in
    ``docs/gw.md``). User i keeps K_i, the first Δ0 items of their walk order
    (their item frequencies descending, ties by the tie-break), and spends a
    budget of 1 on K_i in two steps: ℓ1-descent with budget η (every item of
    K_i below Γ gains a strictly positive weight), then the greedy walk with
    budget 1 − η. λ = 1/ε; T = the smallest T with
    ``1 − (1 − ½e^(−ε(T−1)))·(1 − ½e^(−εT))^(Δ0−1) ≤ δ``
    (``calibration.gw_cascade_free_threshold``); Γ = T + α·λ. Guarantee:
    (ε, δ)-DP for a user order that depends on no user's data. The proof rests
    on the support condition: only the added user's own K_i can become
    non-zero, which step 1 guarantees.

    ``variant='published'`` (research only, NOT PROVEN PRIVATE): the greedy of
    Carvalho et al., no Δ0, every distinct item of a user takes part, T =
    1 − λ·log(2δ). Its published δ argument is false: with an added user x, a
    later user can find an item x filled to Γ, skip it and spend budget on an
    item it never reached without x (a "cascade"), so items x does not hold
    become non-zero and nothing bounds how many. ``describe()`` reports
    ``"proven": false``; the command-line tools run it only with
    ``--allow-unproven``.

    Args:
      epsilon: ε > 0 of the (ε, δ)-DP guarantee of the release.
      delta: 0 < δ < 1/2 (so that T ≥ 1), its δ.
      alpha: α ≥ 0 (default 3), Γ = T + α·λ; no privacy effect.
      state: ``OrderedUserPolicy`` state choice (default ``'auto'``); no
        privacy effect.
      tie_break: ``'item-hash'`` (``docs/gw.md`` section 1: items of equal
        frequency are walked in the order of a keyed hash; the default here,
        ``params.DEFAULT_EMBEDDED_TIE_BREAK``, since an embedded pipeline's pairs may
        carry no record order) or ``'first-occurrence'`` (in the order they first
        occur in the user's records, as the authors' reference code does; the
        command line's default, ``params.DEFAULT_TIE_BREAK``, as it reads the record
        order). ``'first-occurrence'`` releases more on every shared dataset left out
        of the tuning (``docs/gw.md`` section 5). No privacy effect: both
        orders depend on the user's own data only. ``'first-occurrence'``
        needs per-user counts in record order: ``ReadUserItems(keep_order=True)``
        (the command-line pipeline does this when ``--tie-break
        first-occurrence`` is given) or ``dp.data.contribution.per_user_counts``; see
        ``needs_record_order``.
      max_items: Δ0, the size of K_i, an integer in [1, ``params.MAX_MAX_ITEMS`` =
        10^6] (cascade-free only; default ``params.gw_default_max_items(ε)``,
        1 + 5ε rounded: 16 at ε = 3). Privacy:
        the guarantee holds for any such Δ0 because T grows with it, by at most
        ``log(1 + (Δ0 − 1)·e^(−ε))/ε`` over the published T (at ε = 3: 0.22 for
        Δ0 = 20, 0.59 for 100). Utility: a small Δ0 wastes the budget of users whose
        K_i is all at Γ, a large one raises T and Γ; on the five shared datasets
        (δ = e^-10, α = 3; ``docs/gw.md`` section 5) releases peak at Δ0 ≈ 6 at
        ε = 1, 16-21 at ε = 3 and 30-38 at ε = 5, which the rule follows.
      eta: η in [``params.MIN_ETA`` = 1e-12, 1), the step-1 budget (cascade-free
        only; default ``DEFAULT_GW_ETA`` = 0.001). Privacy: none on T; η > 0 is
        what makes the support condition hold, provided step 1's raise of at
        least η/Δ0 is not lost in floating point: with η ≥ 1e-12 and Δ0 ≤ 10^6 it
        is ≥ 1e-18, a normal double (``docs/gw.md``, "η in floating point"); a
        smaller η is refused here, when the mechanism is built.
        Utility: budget spread evenly over K_i is mostly wasted on items that
        are never released, so η should be small; the sweep shows 0.2 clearly
        worse everywhere and 0.001, 0.01 and 0.05 within noise of each other.
      variant: ``'cascade-free'`` (default) or ``'published'`` (unproven).
    """

    def __init__(self, epsilon: float, delta: float, alpha: float = DEFAULT_ALPHA,
                 state: str = "auto", tie_break: str = DEFAULT_EMBEDDED_TIE_BREAK, *,
                 max_items: Optional[int] = None, eta: Optional[float] = None,
                 variant: str = "cascade-free", _name: str = "gw"):
        self.variant = check_variant(variant)
        lam = cal.weighted_laplace_scale(epsilon)
        if self.variant == "published":
            if max_items is not None or eta is not None:
                raise ValueError("max_items and eta apply to the cascade-free GW only, "
                                 "not to variant='published'")
            self.eta = None
            t = cal.gw_threshold(epsilon, delta)
            note = ("(ε, δ)-DP as claimed by Carvalho et al.; NOT PROVEN: the published δ "
                    "argument ignores cascades (docs/gw.md)")
        else:
            if max_items is None:
                max_items = gw_default_max_items(float(epsilon))
            max_items = cal.check_max_items(max_items)
            self.eta = cal.check_eta(DEFAULT_GW_ETA if eta is None else eta)
            t = cal.gw_cascade_free_threshold(epsilon, delta, max_items)
            note = "(ε, δ)-DP"
        super().__init__(_name, PrivacyGuarantee(float(epsilon), float(delta), note=note),
                         RoundCalibration(t, "laplace", lam, max_items, "l1"), alpha, state)
        self.tie_break = policies.check_tie_break(tie_break)
        self.policy_name = self._policy_names[self.variant]

    _policy_names = {"cascade-free": "cascade-free-greedy", "published": "greedy"}
    _public = False

    def threshold_for(self, epsilon: float, delta: float) -> float:
        if self.variant == "published":
            return cal.gw_threshold(epsilon, delta)
        return cal.gw_cascade_free_threshold(epsilon, delta, self.max_items)

    @property
    def proven(self) -> bool:
        """False for ``variant='published'``: its δ argument does not hold."""
        return self.variant != "published"

    @property
    def needs_record_order(self) -> bool:
        """True when the per-user counts must iterate in the users' record order."""
        return self.tie_break == "first-occurrence"

    #: The tie-break to use instead where the input has no record order, or None
    #: (refuse such input). ``registry.make_mechanism`` sets it to
    #: ``params.DEFAULT_EMBEDDED_TIE_BREAK`` when the caller chose no tie-break, so that
    #: the command line's default (first-occurrence) does not stop an embedded
    #: pipeline whose ``(user, item)`` pairs carry no order.
    record_order_fallback: Optional[str] = None

    def without_record_order(self) -> "GW":
        """This mechanism for input without record order: a copy with the
        ``record_order_fallback`` tie-break (``self`` when it needs no record order).

        Raises ValueError when it needs the record order and has no fallback.
        """
        if not self.needs_record_order:
            return self
        if self.record_order_fallback is None:
            raise ValueError(
                f"{self.name} with tie_break='first-occurrence' needs each user's items "
                "in record order, which a PCollection of (user_id, item) pairs does not "
                "have; read with textio.ReadUserItems(pattern, keep_order=True) and pass "
                "per_user=True")
        other = copy.copy(self)
        other.tie_break = policies.check_tie_break(self.record_order_fallback)
        other.record_order_fallback = None
        return other

    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d.update({"tie_break": self.tie_break, "variant": self.variant, "proven": self.proven,
                  "eta": self.eta})
        d["units"]["eta"] = ("η: the step-1 budget of the cascade-free "
                             "greedy policy, in (0, 1) (dimensionless)")
        return d

    def policy(self, run_key):
        if self.variant == "published":
            return policies.GreedyPolicy(self.cutoff, run_key.subkey("item-order"),
                                         use_public_counts=self._public,
                                         tie_break=self.tie_break)
        return policies.CascadeFreeGreedyPolicy(
            self.cutoff, run_key.subkey("item-order"), self.max_items, self.eta,
            use_public_counts=self._public, tie_break=self.tie_break)


def _check_share(share) -> float:
    if isinstance(share, bool) or not isinstance(share, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(share) < 1.0:
        raise ValueError(f"calibration_share must be a number in [0, 1), got {share!r}")
    return float(share)


def _check_public_counts(public_counts) -> None:
    """ValueError unless ``public_counts`` is a non-empty path to a file that exists
    (a remote one, ``scheme://...``, is read when the job runs) or a mapping of items to
    finite counts >= 0."""
    if isinstance(public_counts, str):
        if not public_counts:
            raise ValueError("public_counts must be a non-empty path or a mapping")
        if "://" not in public_counts and not os.path.exists(public_counts):
            raise ValueError(f"public_counts file not found: {public_counts!r}")
    elif isinstance(public_counts, Mapping):
        for item, n in public_counts.items():
            if (isinstance(n, bool) or not isinstance(n, (int, float, np.integer, np.floating))
                    or not math.isfinite(n) or n < 0):
                raise ValueError(f"public_counts must map items to finite counts >= 0; "
                                 f"{item!r} has {n!r}")
    else:
        raise ValueError(f"public_counts must be a path or a mapping, got {public_counts!r}")


class GWKT(GW):
    """GW-KT: GW whose walk order ranks items by public counts first.

    As ``GW`` (same variants, same threshold, same proof), but a user walks
    their items by the public count descending (1 for an item absent from the
    public data), then their own frequency, then the tie-break. The
    cascade-free variant keeps Δ0 consecutive items of that order as K_i,
    chosen by ``kt_selection``. The public counts must not come from the
    private input; they cost no privacy budget. Guarantee: (ε, δ)-DP for the
    cascade-free variant (default); the published variant is NOT PROVEN (see
    ``GW``).

    Args:
      epsilon: ε > 0 of the (ε, δ)-DP guarantee of the release.
      delta: 0 < δ < 1/2, its δ.
      public_counts: a path to an ``item<TAB>count`` file (any Beam
        filesystem; ``.gz`` read by suffix; duplicates summed; a local one must
        exist) or a ``{item: count}`` mapping of finite counts >= 0. No privacy
        effect provided they do not come from the private input (then they cost
        nothing; otherwise the guarantee does not hold).
      alpha: α ≥ 0 (default 3); no privacy effect.
      state: ``OrderedUserPolicy`` state choice (default ``'auto'``); no privacy
        effect.
      tie_break: as for ``GW``; it orders items of equal public count and
        equal frequency. No privacy effect.
      kt_selection: how K_i is chosen (cascade-free only; ``docs/gw.md`` section 1.3).
        ``'front'`` (default): every user walks the same public ranking, so
        its top items reach Γ early; a user at position p_i ∈ [0, 1] of the
        keyed processing order skips its items whose public count is
        ≥ κ·Γ/p_i (predicted to be at Γ already), keeping M of them as a
        margin, and keeps the next Δ0 walk items (the last Δ0 when fewer
        remain). ``'prefix'``: the first Δ0 walk items (the earlier
        default). Privacy: none; both choices depend on the
        user's own data, the public counts, the run key and the user's own
        id only (condition (a′) of ``docs/gw.md``), so the threshold and the
        proof are the same. Utility (ε = 3, δ = e^-10, α = 3; ``docs/gw.md``
        section 5): ``'front'`` with a fixed κ = 10 releases 0.92-0.95× the published
        GW-KT on the five matched public/private pairings of
        ``benchmarks/gw_generalise.py`` but 0.57× where the public users are less
        active; calibrated by a DP estimate (``calibration_share``) 0.90-0.98× on
        all twenty pairings; ``'prefix'`` (Δ0 = 100) about 0.85× on commits-rails.
      front_scale: κ > 0 of ``'front'`` (default ``DEFAULT_FRONT_SCALE`` = 10),
        in units of Γ. An item held by c users of a dataset of the public
        data's size was measured to reach Γ after about 10-20·Γ/c of the
        order. κ, and any ratio used to scale it, must come only from public
        numbers or from numbers already released with DP (e.g. a DP count of
        the private users, paid from the budget): never from the private
        input itself. The proof needs each user's K_i to depend on nothing but
        that user's data, the public counts, the run key and its id
        (condition (a′) of ``docs/gw.md``); κ computed from the exact number of
        private users depends on every user, so adding one user could change
        every other user's K_i, and the proof no longer applies. No privacy
        effect when κ is fixed in advance or public.
      front_margin: M ≥ 0 of ``'front'`` (default ``DEFAULT_FRONT_MARGIN`` = 8; with
        ``calibration_share``, ``front_margin_for(Δ0)``): walk items kept before the
        predicted front. No privacy effect.
      max_items: Δ0, as for ``GW``; default ``params.gwkt_default_max_items(ε)``:
        with ``'front'`` GW's rule + 4 (1 + 5ε rounded + 4: 20 at ε = 3), 100 with
        ``'prefix'`` (with the first Δ0 items, K_i must be
        long for late users to reach items below Γ; releases rise up to
        Δ0 ≈ 100 and are flat to 150); with ``calibration_share``,
        ``max_items_from_estimate``. Privacy: none (T follows Δ0).
      eta, variant: as for ``GW`` (defaults 0.001, ``'cascade-free'``).
      calibration_share: with ``'front'`` and no ``front_scale``: the share s of ε
        spent on a DP estimate of the private data's scale (``release_scale``: the users
        counted by their number of distinct items in four buckets, each count plus
        Laplace noise of scale 1/(s·ε)), from which Δ0 (``max_items_from_estimate``), M
        (``front_margin_for``) and κ (``front_scale_from_estimate``) follow; a
        ``max_items`` or ``front_margin`` given here is kept. Default None: 0 here (κ,
        M, Δ0 fixed); the command line uses ``params.DEFAULT_GWKT_CALIBRATION_SHARE``
        (0.01). Privacy: the release is calibrated to (1 − s)·ε and the estimate is
        s·ε-DP; the stated guarantee is their basic composition, (ε, δ). Δ0, M and κ
        then depend on DP output and public data only (condition (a′) of
        ``docs/gw.md``). Run it with ``run_local`` (which estimates first) or, in Beam,
        after ``calibrated(estimate)`` (``transforms.columnar_read.ActivityFromText`` gives
        the exact histogram to release).
    """

    def __init__(self, epsilon: float, delta: float, public_counts,
                 alpha: float = DEFAULT_ALPHA, state: str = "auto",
                 tie_break: str = DEFAULT_EMBEDDED_TIE_BREAK, *, max_items: Optional[int] = None,
                 eta: Optional[float] = None, variant: str = "cascade-free",
                 kt_selection: Optional[str] = None, front_scale: Optional[float] = None,
                 front_margin: Optional[int] = None, calibration_share: Optional[float] = None):
        _check_public_counts(public_counts)
        share = 0.0 if calibration_share is None else _check_share(calibration_share)
        if share:
            if check_variant(variant) == "published" or kt_selection not in (None, "front"):
                raise ValueError("calibration_share applies to the cascade-free GW-KT with "
                                 "kt_selection='front' only")
            if front_scale is not None:
                raise ValueError("give front_scale or calibration_share > 0, not both: with "
                                 "a share, κ comes from the DP estimate")
        total_epsilon = cal.check_epsilon(epsilon)
        estimate_epsilon, release_delta = None, delta
        if share:
            estimate_epsilon, epsilon = cal.split_epsilon(total_epsilon, share)
            # the estimate's sampler tail fits inside δ: the release takes the rest
            release_delta = estimate_delta_room(delta, check_estimate_epsilon(estimate_epsilon))
        if check_variant(variant) == "published":
            given = [n for n, v in (("kt_selection", kt_selection), ("front_scale", front_scale),
                                    ("front_margin", front_margin)) if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)} apply to the cascade-free GW-KT only, "
                                 "not to variant='published'")
            self.kt_selection = self.front_scale = self.front_margin = None
            max_items_given = max_items
        else:
            self.kt_selection = policies.check_kt_selection(
                DEFAULT_GWKT_SELECTION if kt_selection is None else kt_selection)
            if self.kt_selection == "front":
                self.front_scale = policies.check_front_scale(
                    DEFAULT_FRONT_SCALE if front_scale is None else front_scale)
                self.front_margin = policies.check_front_margin(
                    DEFAULT_FRONT_MARGIN if front_margin is None else front_margin)
            else:
                given = [n for n, v in (("front_scale", front_scale),
                                        ("front_margin", front_margin)) if v is not None]
                if given:
                    raise ValueError(f"{', '.join(given)} apply to kt_selection='front' only")
                self.front_scale = self.front_margin = None
            max_items_given = max_items
            if max_items is None:  # with a share: stands until calibrated() sets Δ0
                max_items = gwkt_default_max_items(total_epsilon, self.kt_selection)
        super().__init__(epsilon, release_delta, alpha, state, tie_break, max_items=max_items,
                         eta=eta, variant=variant, _name="gw-kt")
        self.public_counts = public_counts
        self._loaded = None
        self.calibration_share = share
        self.calibration_epsilon = estimate_epsilon
        self.scale_estimate: Optional[ScaleEstimate] = None
        self._release_epsilon, self._release_delta = epsilon, release_delta
        #: with a share: what the caller fixed (None: from the estimate, ``calibrated``)
        self._fixed = {"max_items": max_items_given, "front_margin": front_margin}
        if share:
            self.front_scale = None  # from the DP estimate: calibrated()
            self.guarantee = PrivacyGuarantee(
                total_epsilon, float(delta),
                note=f"(ε, δ)-DP: basic composition of the scale estimate's "
                     f"{estimate_epsilon:.6g}-DP (up to its samplers' tail, within δ) and "
                     f"the release's ({epsilon:.6g}, {release_delta:g})-DP")
            if max_items_given is None:  # every Δ0 the estimate can choose, checked now
                largest = max(self.max_items, min(MAX_MAX_ITEMS, math.floor(
                    CALIBRATED_WIDTH_RANGE[1] * gw_default_max_items(total_epsilon) + 0.5)))
                cal.gw_cascade_free_threshold(epsilon, release_delta, largest)

    @property
    def needs_calibration(self) -> bool:
        """True while κ waits for the DP scale estimate (``calibrated``)."""
        return bool(self.calibration_share) and self.front_scale is None

    def calibrated(self, estimate: "ScaleEstimate") -> "GWKT":
        """A copy whose Δ0, M and κ follow from the DP ``estimate`` and the public counts:
        Δ0 = ``max_items_from_estimate`` and M = ``front_margin_for(Δ0)`` unless given to
        the constructor, then κ = ``front_scale_from_estimate`` at the cutoff Γ of that
        Δ0; an estimate that is not ``informative`` (too few users for its noise) gives
        the fixed front instead (``DEFAULT_FRONT_SCALE``, ``DEFAULT_FRONT_MARGIN``,
        ``gwkt_default_max_items``). The threshold is the release's own (ε − calibration
        ε, δ) at that Δ0; the guarantee is unchanged (it already counts the estimate's
        share)."""
        if not self.calibration_share:
            raise ValueError("this GW-KT has no calibration share: κ is fixed")
        if not isinstance(estimate, ScaleEstimate) or not (
                estimate.epsilon <= self.calibration_epsilon):
            raise ValueError("the estimate must be a ScaleEstimate released with at most the "
                             f"calibration's ε ({self.calibration_epsilon}), got {estimate!r}")
        other = copy.copy(self)
        fixed, informative = self._fixed, estimate.informative
        if fixed["max_items"] is not None:
            max_items = fixed["max_items"]
        elif informative:
            max_items = max_items_from_estimate(estimate, self.guarantee.epsilon)
        else:
            max_items = gwkt_default_max_items(self.guarantee.epsilon, "front")
        max_items = cal.check_max_items(max_items)
        if max_items != self.max_items:
            threshold = cal.gw_cascade_free_threshold(self._release_epsilon,
                                                      self._release_delta, max_items)
            other.rounds = [dataclasses.replace(self.rounds[0], threshold=threshold,
                                                max_items=max_items)]
            other.cutoff = cal.policy_cutoff(threshold, self.rounds[0].noise_scale, self.alpha)
        if fixed["front_margin"] is not None:
            other.front_margin = policies.check_front_margin(fixed["front_margin"])
        else:
            other.front_margin = (front_margin_for(max_items) if informative
                                  else DEFAULT_FRONT_MARGIN)
        other.front_scale = policies.check_front_scale(
            front_scale_from_estimate(estimate, self._public_counts_local(), other.cutoff)
            if informative else DEFAULT_FRONT_SCALE)
        other.scale_estimate = estimate
        return other

    #: The estimate's buckets (``activity.SCALE_BUCKETS``).
    layout = SCALE_BUCKETS

    def estimate(self, histogram, run_key: RunKey) -> ScaleEstimate:
        """``histogram`` (exact, in ``layout``'s buckets) released at the calibration's ε
        under ``run_key`` (purpose ``scale``)."""
        return release_scale(histogram, self.calibration_epsilon, RunKey.resolve(run_key))

    def calibrated_on(self, per_user, run_key: RunKey) -> "GWKT":
        """``calibrated`` with the estimate of ``per_user`` ({user: {item: count}})
        released under ``run_key`` (the Beam-free run's estimate)."""
        return self.calibrated(self.estimate(scale_statistics(per_user.values()), run_key))

    def histogram_local(self, per_user, run_key: RunKey) -> Dict[Hashable, float]:
        if self.needs_calibration:
            return self.calibrated_on(per_user, run_key).histogram_local(per_user, run_key)
        return super().histogram_local(per_user, run_key)

    def run_local(self, per_user, run_key: RunKey):
        """As for every threshold mechanism; with a calibration share, the estimate is
        released first (``calibrated_on``) and the calibrated copy runs, with the
        threshold of its Δ0."""
        if self.needs_calibration:
            run_key = RunKey.resolve(run_key)
            return self.calibrated_on(per_user, run_key).run_local(per_user, run_key)
        return super().run_local(per_user, run_key)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_loaded"] = None
        return state

    _policy_names = {"cascade-free": "cascade-free-greedy-public", "published": "greedy-public"}
    _public = True

    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d.update({"kt_selection": self.kt_selection, "front_scale": self.front_scale,
                  "front_margin": self.front_margin,
                  "calibration_share": self.calibration_share or None,
                  "calibration_epsilon": self.calibration_epsilon})
        d["units"]["calibration_share"] = (
            "the share of epsilon spent on the DP estimate of the private data's scale "
            "(the users counted by their number of distinct items) from which "
            "max_items_per_user, front_margin and front_scale follow; null: all three fixed")
        d["units"]["calibration_epsilon"] = (
            "the ε of that estimate (ε-DP up to the samplers' 2^-1074 floor: the grid "
            "Laplace's exponential stops at 744 scales, so not pure ε-DP), part of epsilon; "
            "the release's own is epsilon minus it")
        d["units"]["kt_selection"] = (
            "how the cascade-free GW-KT chooses a user's Δ0 kept items from its public-count "
            "walk: 'front' (skip the items predicted to be at the cutoff at the user's "
            "position in the order) or 'prefix' (the first Δ0); null for 'published'")
        d["units"]["front_scale"] = ("κ of kt_selection 'front': an item with public count "
                                     "c counts as full after the fraction κ·cutoff/c of the "
                                     "order (dimensionless); else null")
        d["units"]["front_margin"] = ("M of kt_selection 'front': walk items kept before the "
                                      "predicted front (items); else null")
        return d

    def policy(self, run_key):
        if self.variant == "published":
            return super().policy(run_key)
        if self.needs_calibration:
            raise ValueError("this GW-KT's κ comes from a DP estimate of the data's scale: "
                             "run it with run_local, the command line, or, in a pipeline, "
                             "calibrate it first (beam_dpsu.transforms.activity.calibrate)")
        return policies.CascadeFreeGreedyPolicy(
            self.cutoff, run_key.subkey("item-order"), self.max_items, self.eta,
            use_public_counts=True, tie_break=self.tie_break, selection=self.kt_selection,
            order_key=run_key.subkey("order"),
            front_scale=(self.front_scale if self.front_scale is not None
                         else DEFAULT_FRONT_SCALE),
            front_margin=(self.front_margin if self.front_margin is not None
                          else DEFAULT_FRONT_MARGIN))

    def _public_counts_local(self):
        if isinstance(self.public_counts, Mapping):
            return self.public_counts
        if self._loaded is None:
            self._loaded = policies.read_public_counts(self.public_counts)
        return self._loaded


# --------------------------------------------------------------------------
# GW-KT's Δ0, M and κ from the DP activity estimate (``dp.mechanisms.activity``;
# docs/gw.md sections 3 and 5).
# --------------------------------------------------------------------------


#: The range κ is kept in, whatever the estimate (a noisy or tiny estimate could
#: otherwise make it 0 or huge); in units of Γ, as ``front_scale``.
FRONT_SCALE_RANGE = (0.01, 1000.0)


def front_scale_from_estimate(estimate: ScaleEstimate, public_counts: Mapping[Any, float],
                              cutoff: float, factor: float = FRONT_SCALE_FACTOR) -> float:
    """κ for the private data at hand: ``factor · S / N̂``, clipped to ``FRONT_SCALE_RANGE``.

    N̂ is the estimate's number of users (``ScaleEstimate.users``, at least 1); S is
    the mean of k·c_(k) over the ranks k = 1 … K, c_(k) the k-th largest public count
    and K = ⌊N̂/Γ⌋ (at least 1, at most the number of public items). Why: if every user
    spent its whole budget at the front, the items full at position p would be the top
    N·p/Γ, those of public count ≥ c_(Np/Γ) = (k·c_(k)/N)·Γ/p, which is the front's
    form κ·Γ/p with κ = k·c_(k)/N; ``factor`` (fitted by leave-one-out, docs/gw.md
    section 5) corrects for the users that spend their budget elsewhere.

    Privacy: none beyond the estimate's: κ is a function of DP output, public data and
    public constants (Γ), which is what condition (a′) of docs/gw.md allows."""
    users = estimate.users
    counts = np.sort(np.fromiter((float(c) for c in public_counts.values()), np.float64))[::-1]
    if len(counts) == 0:
        return FRONT_SCALE_RANGE[1]
    ranks = max(1, min(len(counts), int(users / float(cutoff))))
    k = np.arange(1, ranks + 1, dtype=np.float64)
    kappa = float(factor) * float(np.mean(k * counts[:ranks])) / users
    low, high = FRONT_SCALE_RANGE
    return min(max(kappa, low), high)


def max_items_from_estimate(estimate: ScaleEstimate, epsilon: float,
                            divisor: float = CALIBRATED_WIDTH_DIVISOR,
                            width_range=CALIBRATED_WIDTH_RANGE) -> int:
    """Δ0 for the private data at hand: the estimated median number of distinct items
    per user over ``divisor``, kept between ``width_range`` times GW's rule
    ``gw_default_max_items(ε)`` (ε: the whole budget), rounded, in [1, ``MAX_MAX_ITEMS``].
    The defaults (``params.CALIBRATED_WIDTH_DIVISOR``, ``CALIBRATED_WIDTH_RANGE``) were
    fitted by leave-one-out (docs/gw.md section 5).

    Why: a window longer than the items a user can fill only raises the threshold (Γ
    grows with Δ0), a shorter one truncates active users; the best Δ0 measured on twenty
    public/private pairings follows the private users' median activity, within a band
    that widens with ε as GW's rule does.
    Privacy: none beyond the estimate's (DP output and public ε only)."""
    unit = gw_default_max_items(epsilon)
    low, high = width_range
    width = min(high * unit, max(low * unit, estimate.activity_quantile(0.5) / divisor))
    return int(min(MAX_MAX_ITEMS, max(1, math.floor(width + 0.5))))


def front_margin_for(max_items: int, fraction: float = CALIBRATED_MARGIN_FRACTION) -> int:
    """M of the calibrated GW-KT: ``fraction`` (default ``params.
    CALIBRATED_MARGIN_FRACTION``, 0.5) of Δ0, rounded: the window starts that far before
    the predicted front, so a κ somewhat too small or too large still covers it."""
    return int(math.floor(fraction * cal.check_max_items(max_items) + 0.5))
