"""DP-SIPS: iterative partition selection rounds (Swanberg, Desfontaines, Haney).

I rounds of Weighted Gaussian in zCDP, each on what earlier rounds did not
release. Round ``i = 0..I−1`` gets the budget fraction
``f_i = r^(I−1−i)·(1 − r)/(1 − r^I)`` (``1/I`` when r = 1), so with r < 1 the
last round gets the most: ``ρ_i = ρ·f_i`` and ``δ_i = δ·f_i``. In each round
every user loses the items released earlier, is re-sampled to at most Δ0 of
the remaining distinct items, and the round runs Weighted Gaussian (zCDP) with
``(ρ_i, δ_i)``. The output is the union of the rounds. By composition the whole
is δ-approximate ρ-zCDP (``docs/mechanisms.md`` section 5).

Removing released items between rounds (``removal``):

* ``'side-input'`` (default): the items released so far reach every worker as a
  side input, held as a set. One pass over the per-user data per round and no
  extra shuffle; the released set (not the data) must fit in each worker's
  memory. Released sets are small next to the histogram: every released item
  needs weight above T_i ≥ 1, and a user's total ℓ1 weight is at most √Δ0, so
  at most n·√Δ0/T_i items can be released in round i, and in practice far
  fewer (hundreds of thousands of strings take tens of MB). On a runner that
  re-evaluates side inputs in every task (Beam's Dask runner) the rounds run on
  users kept in ``dp.data.contribution.DEFAULT_USER_GROUPS`` groups
  (``transforms.sips.SipsRounds``)
  and the released list is sent to every group through one ``GroupByKey``.
* ``'join'``: a per-item join (``CoGroupByKey`` of ``(item, user)`` pairs with
  the released items) followed by a regroup per user. It scales to released
  sets of any size, at the price of two shuffles of all user-item pairs per
  round. Use it when the released set could exceed worker memory.
"""
from __future__ import annotations

from typing import Any, Dict, Set

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.privacy.accounting import PrivacyGuarantee, dp_to_zcdp_rho, zcdp_guarantee
from beam_dpsu.dp.privacy.calibration import check_ratio, check_rounds, round_budgets
from beam_dpsu.dp.mechanisms.base import Mechanism, decided, noise_purpose
from beam_dpsu.dp.mechanisms.histogram_threshold import WeightedGaussianZcdp, round_histogram
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.randomness.release_rules import NoisyThresholdRule
from beam_dpsu.dp.privacy.params import DEFAULT_MAX_ITEMS, DEFAULT_ROUNDS, DEFAULT_RATIO

__all__ = ["REMOVALS", "Sips"]


REMOVALS = ("side-input", "join")


class Sips(Mechanism):
    """DP-SIPS: I rounds of Weighted Gaussian (zCDP), each on what is not yet released.

    Args:
      rho: the total ρ > 0 of δ-approximate ρ-zCDP (all rounds together).
      delta: the total approximate-zCDP δ, 0 < δ < 1/2.
      max_items: Δ0 ≥ 1, distinct items kept per user in each round (default 100).
      rounds: I ≥ 1 (default 3). More rounds find more items held by few users
        but split the budget thinner.
      ratio: r > 0 (default 1/3): round i gets r^(I−1−i) of the last round's
        share; r = 1 splits evenly; r < 1 puts most budget in the last round.
      removal: ``'side-input'`` (default) or ``'join'``; see the module docstring.
        No privacy effect.

    Use ``Sips.from_dp(epsilon, delta, ...)`` to calibrate to an (ε, δ)-DP target.

    Guarantee: δ-approximate ρ-zCDP; ``guarantee`` also states an (ε, δ)-DP
    equivalent (DP-SIPS Corollary 9).
    """

    def __init__(self, rho: float, delta: float, max_items: int = DEFAULT_MAX_ITEMS,
                 rounds: int = DEFAULT_ROUNDS, ratio: float = DEFAULT_RATIO,
                 removal: str = "side-input"):
        rho, delta = cal.check_rho(rho), cal.check_delta(delta, upper=0.5)
        max_items = cal.check_max_items(max_items)
        rounds, ratio = check_rounds(rounds), check_ratio(ratio)
        if removal not in REMOVALS:
            raise ValueError(f"removal must be one of {REMOVALS}, got {removal!r}")
        self.name = "sips"
        self.ratio = ratio
        self.removal = removal
        # Each round is the zCDP Weighted Gaussian of its share (docs/mechanisms.md section 5).
        budgets = round_budgets(rho, delta, rounds, ratio)
        cal.check_resolvable_delta(delta, max_items, share=min(d for _, d in budgets) / delta)
        self.rounds = [WeightedGaussianZcdp(rho_i, delta_i, max_items).calibration
                       for rho_i, delta_i in budgets]
        self.guarantee = zcdp_guarantee(rho, delta)
        self.rho, self.delta = rho, delta

    composition = "zcdp"

    @classmethod
    def from_dp(cls, epsilon: float, delta: float, max_items: int = DEFAULT_MAX_ITEMS,
                rounds: int = DEFAULT_ROUNDS, ratio: float = DEFAULT_RATIO,
                removal: str = "side-input") -> "Sips":
        """Calibrates to (ε, δ)-DP: half of δ is the approximate-zCDP δ, and ρ is
        the largest whose conversion (``accounting.dp_to_zcdp_rho``) gives (ε, δ).

        Args:
          epsilon: ε > 0 of the (ε, δ)-DP guarantee of the whole release (all rounds).
          delta: 0 < δ < 1, its δ (half of it is the rounds' approximate-zCDP δ).
          max_items, rounds, ratio, removal: as for ``Sips`` (defaults 100, 3, 1/3,
            ``'side-input'``); no effect on the guarantee, which the rounds split.
        """
        epsilon, delta = cal.check_epsilon(epsilon), cal.check_delta(delta)
        shares = round_budgets(1.0, delta / 2.0, rounds, ratio)
        cal.check_resolvable_delta(delta, cal.check_max_items(max_items),
                                   share=min(d for _, d in shares) / delta)
        rho = dp_to_zcdp_rho(epsilon, delta, delta / 2.0)
        sips = cls(rho, delta / 2.0, max_items, rounds, ratio, removal)
        # The same δ-approximate ρ-zCDP, stated as the (ε, δ) it was calibrated to (its
        # conversion gives at most that: dp_to_zcdp_rho's ρ is the largest that does).
        sips.guarantee = PrivacyGuarantee(
            epsilon, delta, rho=rho, zcdp_delta=delta / 2.0,
            note=f"{delta / 2:g}-approximate {rho:.6g}-zCDP, the largest ρ whose conversion "
                 f"(DP-SIPS Corollary 9) gives ({epsilon:g}, {delta:g})-DP")
        return sips

    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d.update({
            "rounds": len(self.rounds),
            "ratio": self.ratio,
            "removal": self.removal,
            "per_round": [{"round": i, "rho": r.rho, "delta": r.delta, "sigma": r.noise_scale,
                           "threshold": r.threshold} for i, r in enumerate(self.rounds)],
        })
        d["units"].update({"rounds": "number of rounds I",
                           "ratio": "budget ratio r: round i gets r^(I−1−i) of the last "
                                    "round's share (dimensionless)"})
        return d

    def release_rule(self, run_key: RunKey, round_index: int = 0) -> NoisyThresholdRule:
        r = self.rounds[round_index]
        return NoisyThresholdRule("gaussian", r.noise_scale, r.threshold, run_key,
                                  noise_purpose(round_index))

    def run_local(self, per_user, run_key: RunKey) -> Set[Any]:
        """The Beam-free core: same sampling, weights and rules as ``SipsRounds``."""
        return set(self.run_local_with_rounds(per_user, run_key))

    def run_local_with_rounds(self, per_user, run_key: RunKey) -> Dict[Any, int]:
        """``{item: round that released it}`` on in-memory ``{user: {item: count}}``."""
        released: Dict[Any, int] = {}
        for i, r in enumerate(self.rounds):
            hist = round_histogram(per_user, r, run_key, i, released)
            for item in decided(self.release_rule(run_key, i), hist):
                released[item] = i
        return released


