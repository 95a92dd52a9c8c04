"""The contract every set-union mechanism fulfils, and the transform that applies one.

A mechanism object is cheap to build and validates its parameters in its
constructor (a bad ε fails when the pipeline is constructed, not inside a
worker). Side by side, every mechanism states or implements:

* ``guarantee``: a ``PrivacyGuarantee`` (ε, δ, and ρ for zCDP mechanisms),
  known before anything runs;
* ``rounds`` / ``calibration``: the threshold(s), noise kind and scale, Δ0
  and weighting of each round (``RoundCalibration``); ``describe()`` gives
  the guarantee and calibration as a JSON-ready dict;
* ``release_rule(run_key, round_index=0)``: the keyed rule
  ``rule(item, weight) -> bool`` that round ``round_index`` applies to each
  item of its histogram (its noise is drawn under the purpose
  ``'noise/<round_index>'``);
* ``expand_per_user(per_user, run_key)``: the Beam expansion, from a
  PCollection of ``(user_id, {item: count})`` to the released items;
* ``run_local(per_user, run_key)``: the Beam-free run on an in-memory
  ``{user_id: {item: count}}`` mapping, with the same per-user and per-item
  functions in the same order, so that under the same ``RunKey`` it returns
  exactly what the Beam expansion releases (``tests/test_pinned_releases.py``
  and each family's tests check this).

The two runs sit next to each other in each family's module
(``beam_dpsu/mechanisms/<family>.py``); ``core.run_local`` only calls
``mechanism.run_local``. The guarantee of each family and its argument are in
``docs/mechanisms.md`` (sections 3-6); how to add a mechanism is in its
section 9.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Set

import apache_beam as beam

from beam_dpsu import keys
from beam_dpsu.accounting import PrivacyGuarantee
from beam_dpsu.bounding import ItemCounts, PerUserItemCounts
from beam_dpsu.noise import RunKey
from beam_dpsu.threshold import NoisyThresholdRule
from beam_dpsu.mechanisms import units


@dataclasses.dataclass(frozen=True)
class RoundCalibration:
    """The calibration of one histogram-and-threshold round.

    Attributes:
      threshold: T (None for the truncated geometric, which has no threshold).
      noise: ``'laplace'``, ``'gaussian'``, ``'truncated-geometric'`` or
        ``'gumbel'`` (top-k).
      noise_scale: λ (Laplace, Gumbel) or σ (Gaussian); None for the truncated
        geometric.
      max_items: Δ0, or None when the mechanism does not bound users.
      weighting: ``'count'``, ``'l1'`` or ``'l2'``.
      rho, delta: this round's zCDP budget, for zCDP mechanisms.
    """
    threshold: Optional[float]
    noise: str
    noise_scale: Optional[float]
    max_items: Optional[int]
    weighting: str
    rho: Optional[float] = None
    delta: Optional[float] = None


def noise_purpose(round_index: int) -> str:
    """The key purpose of round ``round_index``'s noise: ``'noise/<round_index>'``."""
    return f"noise/{round_index}"


class Mechanism:
    """Base class: a named, calibrated set-union mechanism (the contract above).

    Subclasses set ``name``, ``guarantee`` and ``rounds`` in their constructor
    and implement ``release_rule``, ``expand_per_user`` and ``run_local``.
    """

    name: str = ""
    guarantee: PrivacyGuarantee
    rounds: List[RoundCalibration]
    #: True when the mechanism reads the iteration order of each user's
    #: ``{item: count}`` as the user's record order (GW with
    #: ``tie_break='first-occurrence'``); the input must then come from
    #: ``ReadUserItems(keep_order=True)`` or ``core.per_user_counts``.
    needs_record_order: bool = False
    #: False for a research variant whose privacy is NOT proven (the command
    #: line builds it only with ``--allow-unproven``).
    proven: bool = True
    #: True for the policy mechanisms: a user's weight goes to its items still
    #: below the cutoff (``units.threshold_meaning`` words the threshold so).
    _policy_weights: bool = False

    @property
    def calibration(self) -> RoundCalibration:
        """The calibration of the first (for one-round mechanisms, the only) round."""
        return self.rounds[0]

    @property
    def max_items(self) -> Optional[int]:
        """Δ0 of the first round (None when the mechanism does not bound users)."""
        return self.rounds[0].max_items

    def describe(self) -> Dict[str, Any]:
        """JSON-ready statement of the guarantee and calibration."""
        g = self.guarantee
        return {
            "mechanism": self.name,
            "epsilon": g.epsilon,
            "delta": g.delta,
            "rho": g.rho,
            "zcdp_delta": g.zcdp_delta,
            "guarantee": g.note,
            "threshold": [r.threshold for r in self.rounds],
            "noise": self.rounds[0].noise,
            "noise_scale": (self.rounds[0].noise_scale if len(self.rounds) == 1
                            else [r.noise_scale for r in self.rounds]),
            "max_items_per_user": self.max_items,
            "threshold_meaning": units.threshold_meaning(self.rounds, self._policy_weights),
            "units": units.set_union_units(self.rounds, self._policy_weights),
        }

    def threshold_for(self, epsilon: float, delta: float) -> float:
        """The threshold T this mechanism's calibration gives for another (ε, δ),
        every other parameter equal (the auditor's broken variants use it).

        Raises ValueError for a mechanism not calibrated from one (ε, δ).
        """
        raise ValueError(f"{self.name} is not calibrated from one (ε, δ)")

    def release_rule(self, run_key: RunKey, round_index: int = 0) -> Callable[[Any, float], bool]:
        """The keyed rule ``rule(item, weight) -> bool`` of round ``round_index``.

        Args:
          run_key: the run's key (the rule's noise derives from it).
          round_index: the 0-based round (default 0); the noise is drawn under
            ``noise_purpose(round_index)``, so rounds draw independent noise.
        """
        raise NotImplementedError(f"{type(self).__name__} has no per-item release rule")

    def expand_per_user(self, per_user: beam.PCollection, run_key: RunKey) -> beam.PCollection:
        """The Beam expansion: ``(user_id, {item: count})`` → the released items."""
        raise NotImplementedError

    def expand_per_user_parts(self, parts, run_key: RunKey) -> beam.PCollection:
        """``expand_per_user`` on per-user input given as a tuple of PCollections, each
        user in exactly one of them with one element (e.g. ``textio.ReadUserItems(...,
        complete_users=True)``'s merged and complete users). Default: flattens them;
        a mechanism that prepares users one by one overrides it to prepare each
        part where it is produced (no shuffle of the per-user dicts)."""
        return self.expand_per_user(parts | "FlattenUsers" >> beam.Flatten(), run_key)

    def run_local(self, per_user: Mapping[Any, ItemCounts], run_key: RunKey):
        """The Beam-free run: the release on ``{user_id: {item: count}}``.

        Returns the same release as ``expand_per_user`` under the same
        ``run_key`` (a set of items; top-k: the ranked rows).
        """
        raise NotImplementedError(f"{type(self).__name__} has no Beam-free implementation")

    def __repr__(self) -> str:
        g = self.guarantee
        return f"<{type(self).__name__} {self.name}: ε={g.epsilon:.6g}, δ={g.delta:.3g}>"


class ThresholdMechanism(Mechanism):
    """A one-round mechanism: a histogram decided item by item by the release rule.

    Subclasses implement ``histogram_local`` (the finished histogram on
    in-memory data, as their Beam expansion computes it) and
    ``expand_per_user``; the release rule (noise and threshold T of the
    calibration) and the Beam-free run are shared.
    """

    def release_rule(self, run_key: RunKey, round_index: int = 0) -> Callable[[Any, float], bool]:
        r = self.rounds[round_index]
        return NoisyThresholdRule(r.noise, r.noise_scale, r.threshold, run_key,
                                  noise_purpose(round_index))

    def histogram_local(self, per_user: Mapping[Any, ItemCounts], run_key: RunKey
                        ) -> Dict[Any, float]:
        """The finished histogram ``{item: weight}`` on in-memory data (not private)."""
        raise NotImplementedError

    def run_local(self, per_user: Mapping[Any, ItemCounts], run_key: RunKey) -> Set[Any]:
        """The released set on in-memory data: ``expand_per_user`` without Beam."""
        run_key = RunKey.resolve(run_key)
        rule = self.release_rule(run_key)
        return {item for item, w in self.histogram_local(per_user, run_key).items()
                if rule(item, w)}


class SelectPartitions(beam.PTransform):
    """Differentially private set union of a PCollection of ``(user_id, item)``.

    Runs ``PerUserItemCounts`` and then the mechanism. The output is a
    PCollection of released items that carries no order: only the SET is
    covered by the guarantee. The order in which a runner produces the
    elements (and so the order of lines that ``WriteToText`` writes, and which
    shard an item lands in) can follow the input order and reveal which items
    the first users hold. To write a release, collect it (it is small next to
    the data), sort it (e.g. ``bounding.canonical_items``) and write ONE file,
    as ``beam_dpsu.pipelines.common.write_items`` does; never write this PCollection
    straight to a sharded sink.

    Args:
      mechanism: a calibrated ``Mechanism`` (e.g. ``WeightedGaussian(3, 1e-6)``).
      run_key: the run's ``RunKey``. None (the default) means a fresh key:
        its 32 bytes are drawn from the operating system on a worker when the
        pipeline runs and read by every step as a side input, so the secret is
        never part of the job graph that a runner stages (see
        ``beam_dpsu.keys``). Pass ``RunKey.from_test_seed(s)`` only in tests.
      per_user: set True when the input is already ``(user_id, {item: count})``
        with one element per user (e.g. from ``textio.ReadUserItems``), or a
        tuple of such PCollections with each user in exactly one of them (the
        merged and complete users of ``ReadUserItems(...,
        complete_users=True)``). Default False. No privacy effect, but an
        input with several elements per user would break the per-user bound.

    Privacy: the mechanism's ``guarantee`` under add/remove-one-user
    neighbouring datasets, provided each user id identifies one person and
    ``run_key`` is secret and used for one release only.
    """

    def __init__(self, mechanism: Mechanism, run_key: Optional[RunKey] = None,
                 per_user: bool = False, label: Optional[str] = None):
        super().__init__(label)
        if not isinstance(mechanism, Mechanism):
            raise ValueError(f"mechanism must be a beam_dpsu Mechanism, got {mechanism!r}")
        if mechanism.needs_record_order and not per_user:
            raise ValueError(
                f"{mechanism.name} with tie_break='first-occurrence' needs each user's items "
                "in record order, which a PCollection of (user_id, item) pairs does not "
                "have; read with textio.ReadUserItems(pattern, keep_order=True) and pass "
                "per_user=True")
        self._mechanism = mechanism
        self._run_key = keys.for_pipeline(run_key)
        self._per_user = bool(per_user)

    def expand(self, pcoll):
        if isinstance(pcoll, (tuple, list)):
            if not self._per_user:
                raise ValueError("SelectPartitions takes a tuple of PCollections only with "
                                 "per_user=True (per-user parts, each user in one of them)")
            return self._mechanism.expand_per_user_parts(tuple(pcoll), self._run_key)
        per_user = pcoll if self._per_user else pcoll | "PerUserItemCounts" >> PerUserItemCounts()
        return self._mechanism.expand_per_user(per_user, self._run_key)
