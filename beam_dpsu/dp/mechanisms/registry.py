"""Mechanism names of the command-line contract → calibrated mechanism objects.

``make_mechanism(name, **params)`` is how the command-line pipelines, the
comparison tool and the auditor build a mechanism from user parameters; it
rejects, with a one-line message, an unknown name, a parameter that does not
apply to the mechanism, a missing one, and a value out of range. A module that
adds mechanisms registers them here with ``register``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional

from beam_dpsu.dp.mechanisms import (CountGaussian, CountLaplace, Mechanism, TruncatedGeometric,
                                     WeightedGaussian, WeightedGaussianZcdp, WeightedLaplace)
from beam_dpsu.dp.mechanisms import policy as _policy
from beam_dpsu.dp.mechanisms.auto_bound import AutoBound
from beam_dpsu.dp.privacy.params import MECHANISM_PARAMS, canonical_keywords, flag, flags
from beam_dpsu.dp.privacy.params import DEFAULT_MAX_ITEMS, DEFAULT_ALPHA, DEFAULT_ROUNDS, DEFAULT_RATIO
from beam_dpsu.dp.privacy.params import DEFAULT_TIE_BREAK, DEFAULT_EMBEDDED_TIE_BREAK
from beam_dpsu.dp.privacy.params import DEFAULT_GWKT_CALIBRATION_SHARE, AUTO


__all__ = ["MechanismParams", "RegisteredMechanism", "REGISTRY", "register", "make_mechanism"]


def _from_namespace(cls, namespace) -> "MechanismParams":
    """The parameters of a command line's parsed arguments (absent ones are None)."""
    return cls(**{f.name: getattr(namespace, f.name, None) for f in dataclasses.fields(cls)})


def _given(self) -> List[str]:
    """The names of the parameters that were given (not None)."""
    return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]


#: Parameters a user gave for a named mechanism (None = not given): one field
#: per parameter declared in ``dp.privacy.params.MECHANISM_PARAMS``.
#: ``allow_unproven`` is a permission, not a parameter: it lets ``gw``/``gw-kt``
#: build ``variant='published'`` (NOT proven private); every mechanism accepts it.
MechanismParams = dataclasses.make_dataclass(
    "MechanismParams",
    [(p.name, Optional[p.type], dataclasses.field(default=None))
     for p in MECHANISM_PARAMS.values()],
    namespace={"from_namespace": classmethod(_from_namespace), "given": _given,
               "__module__": __name__})


@dataclasses.dataclass(frozen=True)
class RegisteredMechanism:
    name: str
    build: Callable[[MechanismParams], Mechanism]
    accepts: frozenset
    summary: str


REGISTRY: Dict[str, RegisteredMechanism] = {}


def register(name: str, build: Callable[[MechanismParams], Mechanism], accepts, summary: str):
    """Adds a named mechanism (used by the command line, comparisons and the auditor).

    Args:
      name: the ``--mechanism`` name.
      build: ``build(params) -> Mechanism`` from a ``MechanismParams``.
      accepts: the names of the declared parameters (``dp.privacy.params``) it takes.
      summary: one line for listings.
    """
    unknown = set(accepts) - set(MECHANISM_PARAMS)
    if unknown:
        raise ValueError(f"{name}: undeclared parameters {sorted(unknown)} (declare them in "
                         "beam_dpsu.dp.privacy.params)")
    REGISTRY[name] = RegisteredMechanism(name, build, frozenset(accepts), summary)


def make_mechanism(name: str, params: Optional[MechanismParams] = None, **kwargs) -> Mechanism:
    """Builds a registered mechanism by name, validating which parameters apply.

    Keywords may use any declared spelling (``max_items``,
    ``max_items_per_user`` or PipelineDP's ``max_partitions_contributed``).
    Raises ValueError with a one-line message for an unknown name, a parameter
    that does not apply, a missing one, a parameter given twice, or a value out
    of range.
    """
    params = params or MechanismParams(**canonical_keywords(kwargs))
    entry = REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"unknown mechanism {name!r}; choose one of: {', '.join(sorted(REGISTRY))}")
    extra = [p for p in params.given()
             if p not in entry.accepts and p not in ("allow_unproven", "auto_share")]
    if extra:
        raise ValueError(f"{flags(extra)} does not apply to mechanism {name!r}")
    if params.max_items == AUTO:
        return _auto(name, entry, params)
    if params.auto_share is not None:
        raise ValueError(f"{flag('auto_share')} applies to {flag('max_items')} {AUTO} only")
    return _checked(name, entry.build(params), params)


def _auto(name: str, entry: RegisteredMechanism, params: MechanismParams):
    """``max_items='auto'``: GW-KT's own calibration (its share: ``auto_share`` or
    ``calibration_share``), else an ``AutoBound`` around the registered builder."""
    if params.rho is None:
        _require(params, name, "epsilon", "delta")
    if name == "gw-kt":
        if params.auto_share is not None and params.calibration_share is not None:
            raise ValueError(f"give {flag('auto_share')} or {flag('calibration_share')}, not "
                             "both (for gw-kt they are the same share)")
        share = params.calibration_share if params.auto_share is None else params.auto_share
        if share is not None and not share > 0:
            raise ValueError(f"{flag('max_items')} {AUTO} needs a share > 0")
        return make_mechanism(name, dataclasses.replace(
            params, max_items=None, auto_share=None,
            calibration_share=DEFAULT_GWKT_CALIBRATION_SHARE if share is None else share))
    def build(max_items: int, epsilon: Optional[float], delta: float,
              rho: Optional[float]) -> Mechanism:
        return _checked(name, entry.build(dataclasses.replace(
            params, max_items=max_items, epsilon=epsilon, delta=delta, rho=rho,
            auto_share=None)), params)

    _require(params, name, "delta")
    return AutoBound(name, build, params.epsilon, params.delta, params.auto_share, params.rho)


def _checked(name: str, mechanism: Mechanism, params: MechanismParams) -> Mechanism:
    if not getattr(mechanism, "proven", True) and not params.allow_unproven:
        raise ValueError(f"{name} variant {getattr(mechanism, 'variant', '')!r} is not proven "
                         "private; pass --allow-unproven to run it for research")
    return mechanism


def _require(params: MechanismParams, name: str, *fields: str) -> None:
    missing = [f for f in fields if getattr(params, f) is None]
    if missing:
        raise ValueError(f"mechanism {name!r} needs " + " and ".join(flag(f) for f in missing))


def _max_items(params: MechanismParams) -> int:
    return DEFAULT_MAX_ITEMS if params.max_items is None else params.max_items


def _eps_delta_builder(cls, name):
    def build(params: MechanismParams) -> Mechanism:
        if params.rho is not None:
            raise ValueError(f"{flag('rho')} does not apply to mechanism {name!r} (it takes "
                             f"{flag('epsilon')} {flag('delta')})")
        _require(params, name, "epsilon", "delta")
        return cls(params.epsilon, params.delta, _max_items(params))
    return build


def _weighted_gaussian(params: MechanismParams) -> Mechanism:
    if params.rho is not None:
        if params.epsilon is not None:
            raise ValueError("weighted-gaussian takes either --epsilon --delta ((ε, δ)-DP) "
                             "or --rho --delta (zCDP), not both")
        _require(params, "weighted-gaussian", "delta")
        return WeightedGaussianZcdp(params.rho, params.delta, _max_items(params))
    _require(params, "weighted-gaussian", "epsilon", "delta")
    return WeightedGaussian(params.epsilon, params.delta, _max_items(params))


for _name, _cls, _summary in [
        ("truncated-geometric", TruncatedGeometric, "keep an item with n users w.p. p(n)"),
        ("count-laplace", CountLaplace, "Laplace thresholding of distinct-user counts"),
        ("count-gaussian", CountGaussian, "Gaussian thresholding of distinct-user counts"),
        ("weighted-laplace", WeightedLaplace, "each user spreads ℓ1 budget 1; Laplace noise")]:
    register(_name, _eps_delta_builder(_cls, _name), {"epsilon", "delta", "max_items", "rho"},
             _summary)
register("weighted-gaussian", _weighted_gaussian, {"epsilon", "delta", "rho", "max_items"},
         "each user spreads ℓ2 budget 1; Gaussian noise; (ε, δ)-DP or zCDP")


def _sips(params: MechanismParams) -> Mechanism:
    from beam_dpsu.dp.mechanisms.sips import Sips
    rounds = DEFAULT_ROUNDS if params.rounds is None else params.rounds
    ratio = DEFAULT_RATIO if params.ratio is None else params.ratio
    if params.rho is not None:
        if params.epsilon is not None:
            raise ValueError("sips takes either --rho --delta (zCDP) or --epsilon --delta "
                             "((ε, δ)-DP), not both")
        _require(params, "sips", "delta")
        return Sips(params.rho, params.delta, _max_items(params), rounds, ratio)
    _require(params, "sips", "epsilon", "delta")
    return Sips.from_dp(params.epsilon, params.delta, _max_items(params), rounds, ratio)


register("sips", _sips, {"epsilon", "delta", "rho", "max_items", "rounds", "ratio"},
         "DP-SIPS: I rounds of zCDP Weighted Gaussian on what is not yet released")


def _adaptive_builder(name: str, release_rounds: int):
    def build(params: MechanismParams) -> Mechanism:
        from beam_dpsu.dp.mechanisms.adaptive import Adaptive
        _require(params, name, "epsilon", "delta")
        alpha = DEFAULT_ALPHA if params.alpha is None else params.alpha
        return Adaptive(params.epsilon, params.delta, _max_items(params), release_rounds,
                        params.estimate_share, alpha)
    return build


register("adaptive", _adaptive_builder("adaptive", 1),
         {"epsilon", "delta", "max_items", "estimate_share", "alpha"},
         "adaptive weighting: a DP estimate moves weight off heavy items; one release")
register("adaptive-2r", _adaptive_builder("adaptive-2r", 2),
         {"epsilon", "delta", "max_items", "estimate_share", "alpha"},
         "adaptive weighting in two rounds: the estimate releases, then the adaptive round")


# Sequential policy mechanisms (beam_dpsu.dp.mechanisms.policy, docs/mechanisms.md section 4).


def _policy_builder(cls, name):
    def build(params: MechanismParams) -> Mechanism:
        _require(params, name, "epsilon", "delta")
        alpha = DEFAULT_ALPHA if params.alpha is None else params.alpha
        return cls(params.epsilon, params.delta, _max_items(params), alpha)
    return build


def _tie_break(params: MechanismParams) -> str:
    """The tie-break: the user's, else ``DEFAULT_TIE_BREAK`` (the registry builds the
    command line's mechanisms, which read each user's items in record order)."""
    return DEFAULT_TIE_BREAK if params.tie_break is None else params.tie_break


def _gw_options(params: MechanismParams, name: str) -> dict:
    """Keyword arguments of GW/GWKT: Δ0 and η apply to the cascade-free variant only."""
    variant = "cascade-free" if params.variant is None else params.variant
    if variant == "published":
        bad = [f for f in ("max_items", "eta") if getattr(params, f) is not None]
        if bad:
            raise ValueError(f"{flags(bad)} does not apply to mechanism {name!r} "
                             "variant 'published'")
    return {"tie_break": _tie_break(params), "variant": variant,
            "max_items": params.max_items, "eta": params.eta}


def _with_fallback(mechanism, params: MechanismParams):
    """A defaulted tie-break may fall back to ``DEFAULT_EMBEDDED_TIE_BREAK`` where the
    input has no record order (``SelectPartitions`` on ``(user, item)`` pairs)."""
    if params.tie_break is None:
        mechanism.record_order_fallback = DEFAULT_EMBEDDED_TIE_BREAK
    return mechanism


def _gw(params: MechanismParams) -> Mechanism:
    _require(params, "gw", "epsilon", "delta")
    return _with_fallback(_policy.GW(params.epsilon, params.delta,
                                     DEFAULT_ALPHA if params.alpha is None else params.alpha,
                                     **_gw_options(params, "gw")), params)


_KT_OPTIONS = ("kt_selection", "front_scale", "front_margin", "calibration_share")


def _gw_kt(params: MechanismParams) -> Mechanism:
    _require(params, "gw-kt", "epsilon", "delta", "public_counts")
    options = _gw_options(params, "gw-kt")
    given = [f for f in _KT_OPTIONS if getattr(params, f) is not None]
    if options["variant"] == "published" and given:
        raise ValueError(f"{flags(given)} does not apply to mechanism 'gw-kt' variant "
                         "'published'")
    front_only = ("front_scale", "front_margin", "calibration_share")
    if params.kt_selection == "prefix" and any(getattr(params, f) is not None for f in front_only):
        bad = [f for f in front_only if getattr(params, f) is not None]
        raise ValueError(f"{flags(bad)} applies to {flag('kt_selection')} front only")
    kt = {f: getattr(params, f) for f in _KT_OPTIONS}
    if (kt["calibration_share"] is None and kt["front_scale"] is None
            and options["variant"] != "published" and params.kt_selection != "prefix"):
        kt["calibration_share"] = DEFAULT_GWKT_CALIBRATION_SHARE  # Δ0, M, κ from a DP estimate
    if kt["calibration_share"] and kt["front_scale"] is not None:
        raise ValueError(f"{flag('front_scale')} and {flag('calibration_share')} exclude "
                         f"each other: with a share, κ comes from the DP estimate")
    return _with_fallback(_policy.GWKT(params.epsilon, params.delta, params.public_counts,
                                       DEFAULT_ALPHA if params.alpha is None else params.alpha,
                                       **options, **kt), params)


register("policy-laplace", _policy_builder(_policy.PolicyLaplace, "policy-laplace"),
         {"epsilon", "delta", "max_items", "alpha"},
         "sequential ℓ1-descent to the cutoff (Gopi et al.); Laplace noise")
register("policy-gaussian", _policy_builder(_policy.PolicyGaussian, "policy-gaussian"),
         {"epsilon", "delta", "max_items", "alpha"},
         "sequential ℓ2-descent to the cutoff (Gopi et al.); Gaussian noise")
_GW_PARAMS = {"epsilon", "delta", "alpha", "tie_break", "max_items", "eta", "variant"}
register("gw", _gw, _GW_PARAMS,
         "cascade-free greedy by item frequency over Δ0 kept items (after Carvalho et al.); "
         "Laplace noise; variant=published (unproven) needs --allow-unproven")
register("gw-kt", _gw_kt, _GW_PARAMS | {"public_counts"} | set(_KT_OPTIONS),
         "cascade-free greedy by public counts, then frequency, over Δ0 kept items past the "
         "predicted front; Laplace noise; "
         "variant=published (unproven) needs --allow-unproven")
