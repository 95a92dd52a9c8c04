"""The one declaration of every mechanism parameter.

Each ``Param`` states a parameter's name (the keyword of the mechanism
constructors and of ``registry.MechanismParams``), its type, its command-line
flag and aliases, its help text, its default and its privacy effect. The
command-line pipelines (``beam_dpsu/pipelines/select_partitions.py``,
``beam_dpsu/pipelines/top_k.py``), the comparison tool (``beam_dpsu/pipelines/compare.py``) and
the auditor's command line (``beam_dpsu.dp.evaluation.audit``) build their flags from it
(``add_arguments``), and ``as_flags`` names the parameters of a validation
message as the flags the user typed. A new parameter is declared here once.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple


__all__ = ["DEFAULT_MAX_ITEMS", "AUTO", "max_items_value", "AUTO_BUCKET_BASE", "AUTO_BUCKETS",
           "DEFAULT_AUTO_SHARE", "AUTO_RULES", "AUTO_EMPTY_BELOW", "AUTO_FAMILIES", "DEFAULT_GW_MAX_ITEMS_PER_EPSILON", "gw_default_max_items",
           "DEFAULT_GWKT_MAX_ITEMS", "DEFAULT_GWKT_FRONT_EXTRA_ITEMS",
           "gwkt_default_max_items", "DEFAULT_ALPHA",
           "DEFAULT_GW_ETA", "DEFAULT_TIE_BREAK", "DEFAULT_EMBEDDED_TIE_BREAK",
           "DEFAULT_GWKT_SELECTION", "DEFAULT_FRONT_SCALE",
           "DEFAULT_FRONT_MARGIN", "DEFAULT_GWKT_CALIBRATION_SHARE",
           "FRONT_SCALE_FACTOR", "ACTIVITY_BUCKET_BASE", "ACTIVITY_BUCKETS",
           "ACTIVITY_EMPTY_BELOW", "CALIBRATED_WIDTH_DIVISOR", "CALIBRATED_WIDTH_RANGE",
           "CALIBRATED_MARGIN_FRACTION", "CALIBRATED_MIN_SCALES",
           "DEFAULT_VARIANT", "DEFAULT_ROUNDS", "DEFAULT_RATIO",
           "DEFAULT_DISCOVERY_SHARE", "DEFAULT_ESTIMATE_SHARE", "TOPK_METHODS", "DEFAULT_TOPK_METHOD", "MAX_MAX_ITEMS", "MIN_PER_ITEM_DELTA", "MIN_ETA", "WARN_EPSILON_ABOVE",
           "WARN_DELTA_ABOVE", "Param", "MECHANISM_PARAMS", "TOPK_PARAMS", "ALL_PARAMS",
           "flag", "flags",
           "add_arguments", "as_flags", "spec_types", "canonical", "canonical_keywords",
           "cli_arguments"]


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a mechanism.

    Attributes:
      name: the keyword argument and ``MechanismParams`` field.
      type: ``float``, ``int``, ``str`` or ``bool`` (a bool is a flag without value).
      help: what it means (one line for ``--help``).
      default: the default as text, or None when the parameter is required or
        has no default.
      privacy: its effect on the guarantee, as text.
      flag: the command-line flag (default ``--`` + name with dashes).
      aliases: other spellings accepted for it everywhere a user types a name:
        as flags (``--`` + the alias with dashes, e.g.
        ``--max-partitions-contributed``), in ``compare``'s ``NAME:KEY=VALUE``
        settings, as keywords of ``registry.make_mechanism`` and in messages.
        The first alias, when given, is the public name: the JSON summaries'
        key (``max_items_per_user``).
    """
    name: str
    type: type
    help: str
    default: Optional[str]
    privacy: str
    flag: str = ""
    aliases: Tuple[str, ...] = ()

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def public_name(self) -> str:
        """The name in JSON summaries and help: the first alias, else the name."""
        return self.aliases[0] if self.aliases else self.name

    @property
    def alias_flags(self) -> Tuple[str, ...]:
        """The other flags accepted for it (one per alias and for the name), in order."""
        out = []
        for spelling in (self.name,) + self.aliases:
            f = "--" + spelling.replace("_", "-")
            if f != self.cli_flag and f not in out:
                out.append(f)
        return tuple(out)

    def full_help(self) -> str:
        text = self.help
        if self.default is not None:
            text += f" (default {self.default})"
        return f"{text}. Privacy: {self.privacy}"

    def add_to(self, parser: argparse.ArgumentParser, help: Optional[str] = None,
               required: bool = False, default: Any = None) -> None:
        """Adds this parameter's flag to ``parser`` (absent → None unless ``default``)."""
        kwargs: Dict[str, Any] = {"dest": self.name, "help": help or self.full_help()}
        if self.type is bool:
            kwargs.update(action="store_true", default=default)
        else:
            kwargs.update(type=self.type, default=default, required=required)
        parser.add_argument(self.cli_flag, *self.alias_flags, **kwargs)


# -- the defaults: each declared here once, imported wherever it applies --------

#: Δ0, distinct items kept per user, of every mechanism that bounds users (but GW).
DEFAULT_MAX_ITEMS = 100
#: Δ0 of the cascade-free GW when none is given: a rule of ε, ``gw_default_max_items``
#: (1 + 5ε, rounded: 6 at ε = 1, 16 at ε = 3, 26 at ε = 5); docs/gw.md section 5.
DEFAULT_GW_MAX_ITEMS_PER_EPSILON = 5.0
#: Δ0 of GW-KT with ``kt_selection='prefix'`` (for 'front' see the next constant).
DEFAULT_GWKT_MAX_ITEMS = {"prefix": 100}
#: GW-KT with ``kt_selection='front'``: Δ0 = gw's rule + this (``gwkt_default_max_items``:
#: 10 at ε = 1, 20 at ε = 3, 30 at ε = 5); docs/gw.md section 5.
DEFAULT_GWKT_FRONT_EXTRA_ITEMS = 4
#: α of the sequential policies' cutoff Γ = T + α·(noise scale).
DEFAULT_ALPHA = 3.0
#: η, GW's step-1 budget.
DEFAULT_GW_ETA = 0.001
#: How GW and GW-KT order a user's items of equal frequency where the user's record
#: order is known: the command line (``select``, ``compare``, ``audit``, and
#: ``registry.make_mechanism``), which reads each user's items in record order. The
#: leave-one-dataset-out protocol (``benchmarks/gw_generalise.py``, docs/gw.md section 5)
#: found it better than the hash on every left-out dataset.
DEFAULT_TIE_BREAK = "first-occurrence"
#: The tie-break of the ``GW`` and ``GWKT`` constructors (an embedded pipeline, whose
#: ``(user, item)`` pairs may carry no record order).
DEFAULT_EMBEDDED_TIE_BREAK = "item-hash"
#: GW-KT's choice of a user's Δ0 walk items.
DEFAULT_GWKT_SELECTION = "front"
#: GW-KT front window: κ and the margin M (leave-one-pairing-out, docs/gw.md section 5).
DEFAULT_FRONT_SCALE = 10.0
DEFAULT_FRONT_MARGIN = 8
#: GW-KT calibrated by a DP estimate of the private data's scale (docs/gw.md section 5;
#: ``mechanisms.policy``: ``ScaleEstimate``, ``front_scale_from_estimate``,
#: ``max_items_from_estimate``). The estimate is a histogram of the users by their number
#: n of distinct items, in the buckets [1, 4), [4, 16), [16, 64), [64, ∞) (each user in
#: exactly one), each bucket plus Laplace noise; a noisy bucket below
#: ``ACTIVITY_EMPTY_BELOW`` noise scales counts as empty (post-processing).
ACTIVITY_BUCKET_BASE = 4
ACTIVITY_BUCKETS = 4
ACTIVITY_EMPTY_BELOW = 2.0
#: κ = factor·S/N̂, S the mean of k·c_(k) over the public counts' ranks k ≤ N̂/Γ.
FRONT_SCALE_FACTOR = 1.44
#: Δ0 = the estimated median n divided by this, kept between the two multiples of GW's
#: Δ0 rule (``gw_default_max_items``) of ``CALIBRATED_WIDTH_RANGE``.
CALIBRATED_WIDTH_DIVISOR = 1.5
CALIBRATED_WIDTH_RANGE = (0.25, 2.0)
#: M = this fraction of Δ0, rounded.
CALIBRATED_MARGIN_FRACTION = 0.5
#: An estimate of fewer users than this many noise scales (1/ε of the estimate) carries
#: too little to place the window: GW-KT then keeps its fixed front (κ, M, Δ0 defaults).
CALIBRATED_MIN_SCALES = 5.0
#: GW-KT on the command line: the share of ε spent on that estimate; 0 keeps κ, M and Δ0
#: fixed (``DEFAULT_FRONT_SCALE``, ``DEFAULT_FRONT_MARGIN``, ``gwkt_default_max_items``).
DEFAULT_GWKT_CALIBRATION_SHARE = 0.01
#: ``--max-items-per-user auto`` (``dp.mechanisms.auto_bound``): Δ0 read from a DP
#: estimate of the users' activity (``dp.mechanisms.activity``) in finer buckets than
#: GW-KT's, [1, 2), [2, 4), …, [512, 1024), [1024, ∞), released with
#: ``DEFAULT_AUTO_SHARE`` of ε; the release runs at the rest.
AUTO = "auto"
AUTO_BUCKET_BASE = 2
AUTO_BUCKETS = 11
DEFAULT_AUTO_SHARE = 0.02
#: Each family's rule from the estimate to Δ0: ``(q, c)`` gives Δ0 = c × the estimated
#: q-quantile of the users' numbers of distinct items, rounded, in [1, ``AUTO_MAX_ITEMS``]
#: (chosen by leave-one-dataset-out against the best fixed Δ0, benchmarks/RESULTS.md
#: section 15), the quantile read from the buckets kept at ``AUTO_EMPTY_BELOW``. ``gw``
#: uses GW-KT's median rule (``max_items_from_estimate``) at GW-KT's floor.
AUTO_RULES = {"weighted": (0.8, 4.0), "policy": (0.95, 4.0), "sips": (0.75, 4.0),
              "adaptive": (0.95, 4.0), "count": (0.5, 1.0)}
#: The rules read the estimate with a noisy bucket below this many noise scales as empty
#: (the same as GW-KT's ``ACTIVITY_EMPTY_BELOW``). At 1, the top buckets of a small
#: dataset count too (better on movielens-small at ε = 1) but so does more noise in a
#: sparse tail (worse on paths-ansible at ε = 1): measured in benchmarks/RESULTS.md
#: section 15, not adopted.
AUTO_EMPTY_BELOW = 2.0
AUTO_MAX_ITEMS = 1000
#: The rule family of each mechanism of ``select`` (gw-kt: its own calibration).
AUTO_FAMILIES = {"weighted-gaussian": "weighted", "weighted-laplace": "weighted",
                 "count-gaussian": "count", "count-laplace": "count",
                 "truncated-geometric": "count", "sips": "sips",
                 "policy-gaussian": "policy", "policy-laplace": "policy",
                 "adaptive": "adaptive", "adaptive-2r": "adaptive", "gw": "gw"}
#: GW and GW-KT variant.
DEFAULT_VARIANT = "cascade-free"
#: DP-SIPS rounds I and budget ratio r.
DEFAULT_ROUNDS = 3
DEFAULT_RATIO = 1.0 / 3.0

# -- bounds and warning levels (docs/mechanisms.md, "Parameters that make a guarantee
#    meaningless"; docs/gw.md for η) ----------------------------------------------

#: The largest Δ0 (distinct items kept per user) any mechanism accepts. Above it
#: the calibration takes long (thresholds maximise over t = 1..Δ0: under 0.5 s at
#: 10^6, 35 s at 10^9, forever at 10^20) and means nothing: a bound that large
#: bounds no user of any real dataset, while every threshold grows with Δ0 (Count
#: Laplace's scale is Δ0/ε: at 10^6 nothing is released).
MAX_MAX_ITEMS = 10 ** 6
#: The smallest η (GW/GW-KT step-1 budget) accepted: η/Δ0 ≥ 1e-18 (Δ0 ≤ MAX_MAX_ITEMS)
#: is then a normal double, so step 1 raises every kept item below the cutoff by a
#: strictly positive amount (docs/gw.md, Lemma 3 and "η in floating point").
MIN_ETA = 1e-12
#: The smallest per-item δ (the δ share one item's release may use: δ_Δ0, δ/Δ0, ...)
#: a mechanism accepts, 2^-1020, just above the smallest normal double (2^-1022): the
#: release rules' probabilities are doubles, exact down to it (docs/mechanisms.md
#: section 1.2), so below it a δ could not be resolved. With Δ0 ≤ MAX_MAX_ITEMS every
#: δ ≥ 1e-298 is accepted by every mechanism (1e-300 by all but DP-SIPS, whose rounds
#: split δ).
MIN_PER_ITEM_DELTA = 2.0 ** -1020
#: The command line warns (on stderr; it still runs) when a stated ε exceeds this:
#: e^10 ≈ 22,000, so the output may be 22,000 times likelier with one user than
#: without, which protects almost nothing.
WARN_EPSILON_ABOVE = 10.0
#: The command line warns when a stated δ exceeds this: δ is the probability that
#: the ε bound fails outright, and it should be far below 1/(number of users).
WARN_DELTA_ABOVE = 1e-3
#: Discovery-then-peel (top-k, hitting set): the discovery's share of ε and of δ.
DEFAULT_DISCOVERY_SHARE = 0.5

#: Adaptive weighting: the estimate's share of the Gaussian precision 1/σ²
#: (docs/mechanisms.md section 11).
DEFAULT_ESTIMATE_SHARE = 0.2

#: The top-k command's default method, and the methods it offers.
TOPK_METHODS = ("limited-domain", "discover-peel")
DEFAULT_TOPK_METHOD = "limited-domain"


class _BadValue(argparse.ArgumentTypeError, ValueError):
    """A typed value refused: argparse prints its message as it is; elsewhere a ValueError."""


def max_items_value(text):
    """A Δ0 as typed (a flag, a ``compare`` setting): ``'auto'`` (``AUTO``), else the
    integer (``'100'`` → 100; its range is checked where the mechanism is built)."""
    if isinstance(text, str):
        if text.strip().lower() == AUTO:
            return AUTO
        try:
            return int(text)
        except ValueError:
            raise _BadValue(f"{text!r} is neither an integer nor 'auto'") from None
    return text


def gw_default_max_items(epsilon: float) -> int:
    """Δ0 of the cascade-free GW for a given ε when none is given: ``⌊1 + 5ε + ½⌋``
    (``DEFAULT_GW_MAX_ITEMS_PER_EPSILON`` = 5), in [1, ``MAX_MAX_ITEMS``].

    A function of the public ε only, never of the data. Why it grows with ε: Δ0 raises
    T by ``log(1 + (Δ0 − 1)e^(−ε))/ε`` (the union bound of docs/gw.md section 1.2), a
    cost that falls fast with ε, while a larger K_i wastes less of each user's budget.
    Measured (docs/gw.md section 5, ``benchmarks/gw_generalise.py``): the releases of every
    shared dataset peak at Δ0 ≈ 5-6 at ε = 1, 16-21 at ε = 3 and 30-38 at ε = 5, and
    are flat within 1-2% around the peak; the rule gives 6, 16 and 26.

    Raises ValueError unless ε is a finite number > 0.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) \
            or not (0 < float(epsilon) < float("inf")):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    value = 1.0 + DEFAULT_GW_MAX_ITEMS_PER_EPSILON * float(epsilon) + 0.5
    return int(min(float(MAX_MAX_ITEMS), max(1.0, value // 1.0)))


def gwkt_default_max_items(epsilon: float, selection: str = "front") -> int:
    """Δ0 of the cascade-free GW-KT when none is given.

    ``'prefix'``: ``DEFAULT_GWKT_MAX_ITEMS['prefix']`` (100). ``'front'``:
    ``gw_default_max_items(ε) + DEFAULT_GWKT_FRONT_EXTRA_ITEMS`` (1 + 5ε rounded, plus 4;
    at most ``MAX_MAX_ITEMS``), a function of the public ε only. Measured
    (docs/gw.md section 5): GW-KT's releases peak at Δ0 ≈ 10 at ε = 1, 20 at ε = 3 and
    26-30 at ε = 5 on the public/private pairings of ``benchmarks/gw_generalise.py``,
    a few items more than GW's (its window keeps M items before the predicted front).

    Raises ValueError for an ε that is not a finite number > 0, or another selection.
    """
    if selection == "prefix":
        gw_default_max_items(epsilon)  # validates ε
        return DEFAULT_GWKT_MAX_ITEMS["prefix"]
    if selection != "front":
        raise ValueError(f"kt_selection must be 'front' or 'prefix', got {selection!r}")
    return min(MAX_MAX_ITEMS, gw_default_max_items(epsilon) + DEFAULT_GWKT_FRONT_EXTRA_ITEMS)


def _text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


_NO_EFFECT = "none"

#: Every parameter of the registered mechanisms (the fields of MechanismParams).
MECHANISM_PARAMS: Dict[str, Param] = {p.name: p for p in [
    Param("epsilon", float, f"ε > 0 of the (ε, δ)-DP guarantee of the whole release (a "
          f"warning above {WARN_EPSILON_ABOVE:g}: such a guarantee protects almost nothing)",
          None, "the guarantee's ε; a smaller ε releases fewer items"),
    Param("delta", float, f"δ in (0, 1); for zCDP mechanisms the approximate-zCDP δ (a "
          f"warning above {WARN_DELTA_ABOVE:g}: δ is the chance the guarantee fails)", None,
          "the guarantee's δ"),
    Param("rho", float, "ρ > 0 of ρ-zCDP, for zCDP mechanisms", None,
          "the guarantee's ρ (converted to (ε, δ) in the summary)"),
    Param("max_items", max_items_value, f"Δ0, distinct items kept per user (integer in [1, "
          f"{MAX_MAX_ITEMS:,}]: above, calibration is slow and meaningless), or 'auto': "
          f"chosen from a DP estimate of the users' activity that spends --auto-share of "
          f"--epsilon (default {DEFAULT_AUTO_SHARE:g})",
          f"{DEFAULT_MAX_ITEMS}; gw 1 + {DEFAULT_GW_MAX_ITEMS_PER_EPSILON:g}ε rounded "
          f"({gw_default_max_items(3.0)} at ε = 3), gw-kt that + "
          f"{DEFAULT_GWKT_FRONT_EXTRA_ITEMS} ({gwkt_default_max_items(3.0)} at ε = 3; "
          f"{DEFAULT_GWKT_MAX_ITEMS['prefix']} with --kt-selection prefix)",
          "none: the calibration accounts for Δ0 (a larger Δ0 raises the threshold); "
          "'auto' spends --auto-share of ε on the estimate; the release keeps what the "
          "composition leaves (nearly all of ε for the Gaussian mechanisms, the rest for "
          "the Laplace ones; the stated ε is the whole)",
          flag="--max-items-per-user",
          # PipelineDP calls it max_partitions_contributed
          aliases=("max_items_per_user", "max_partitions_contributed")),
    Param("auto_share", float, "with --max-items-per-user auto: the share of --epsilon (or "
          "--rho) in (0, 1) spent on the DP estimate of the users' activity from which Δ0 "
          "follows",
          f"{DEFAULT_AUTO_SHARE:g} (gw-kt: its --calibration-share, "
          f"{DEFAULT_GWKT_CALIBRATION_SHARE:g})",
          "part of the stated ε: the estimate is share·ε-DP, composed with the release "
          "within the stated (ε, δ) (tight for the Gaussian mechanisms, zCDP for sips, "
          "basic for the rest)"),
    Param("alpha", float, "cutoff multiplier α >= 0 of the sequential policies "
          "(Γ = T + α·noise scale) and of adaptive weighting (heavy above 2Γ + 2σ_E)", _text(DEFAULT_ALPHA), _NO_EFFECT),
    Param("rounds", int, "number of DP-SIPS rounds I (integer >= 1)", _text(DEFAULT_ROUNDS),
          "none: the budget is split over the rounds"),
    Param("ratio", float, "DP-SIPS budget ratio r > 0 (round i gets r^(I−1−i) of the last "
          "round's share)", "1/3" if DEFAULT_RATIO == 1.0 / 3.0 else _text(DEFAULT_RATIO),
          "none: the shares sum to the budget"),
    Param("estimate_share", float, "adaptive, adaptive-2r: the estimate's share s in (0, 1) "
          "of the Gaussian precision (the adaptive round's release statistic combines both "
          "stages)", _text(DEFAULT_ESTIMATE_SHARE),
          "none: the stages' precisions sum to that of --epsilon --delta"),
    Param("public_counts", str, "gw-kt: file of item<TAB>count lines, the count being the "
          "number of distinct users holding the item in PUBLIC data similar to the input "
          "(never the private input); make it with beam-dpsu public-counts --input "
          "PUBLIC_PAIRS --output COUNTS.tsv", None, "none, provided the counts do not come from the private "
          "input"),
    Param("tie_break", str, "gw, gw-kt: order of a user's items of equal frequency, "
          "'item-hash' (keyed hash) or 'first-occurrence' (the user's record order, as the "
          "authors' code)", f"{DEFAULT_TIE_BREAK} (Python constructors: "
          f"{DEFAULT_EMBEDDED_TIE_BREAK})", "none: both orders depend on the user's own data "
          "only"),
    Param("eta", float, f"gw, gw-kt: step-1 budget η in [{MIN_ETA:g}, 1) (a smaller η "
          f"could underflow in step 1)", _text(DEFAULT_GW_ETA),
          "none on T; η > 0 is what makes the cascade-free proof hold"),
    Param("kt_selection", str, "gw-kt (cascade-free): how a user's Δ0 kept items are chosen "
          "from its public-count walk, 'front' (skip the items predicted from the public "
          "counts to be at the cutoff at the user's position in the keyed order) or 'prefix' "
          "(the first Δ0)", DEFAULT_GWKT_SELECTION, "none: both depend only on the user's own data, the "
          "public counts, the run key and the user's id"),
    Param("front_scale", float, "gw-kt, kt_selection 'front': κ > 0; an item with public "
          "count c counts as full after the fraction κ·Γ/c of the order; take κ (and any "
          "ratio scaling it) only from public or DP-released numbers, never from the "
          "private input's exact size",
          _text(DEFAULT_FRONT_SCALE),
          _NO_EFFECT),
    Param("front_margin", int, "gw-kt, kt_selection 'front': M >= 0 walk items kept before "
          "the predicted front", _text(DEFAULT_FRONT_MARGIN), _NO_EFFECT),
    Param("calibration_share", float, "gw-kt, kt_selection 'front': the share of --epsilon "
          "spent on a DP estimate of the private data's scale (the users counted by their "
          "number of distinct items), from which Δ0, M and κ follow unless given "
          "(docs/gw.md section 5); 0: κ = --front-scale, M = --front-margin, Δ0 = "
          "--max-items-per-user or their defaults", _text(DEFAULT_GWKT_CALIBRATION_SHARE),
          "part of the stated ε: basic composition of the estimate (share·ε) and the "
          "release (the rest)"),
    Param("variant", str, "gw, gw-kt: 'cascade-free' (proven) or 'published' (NOT proven "
          "private; needs --allow-unproven)", DEFAULT_VARIANT,
          "'published' has no proven guarantee"),
    Param("allow_unproven", bool, "research only: allow a variant whose privacy is not "
          "proven", None, "permits a release WITHOUT a proven guarantee"),
]}

#: The parameters of a top-k query (``TopKMechanism``); epsilon, delta and
#: max_items are shared with the set-union mechanisms.
TOPK_PARAMS: Dict[str, Param] = {p.name: p for p in [
    Param("k", int, "the most items to release (integer >= 1)", None,
          "Algorithm 2 is charged up to k selections"),
    Param("k_bar", int, "candidates k̄ >= k (the true top k̄ are noised; the (k̄+1)-th count "
          "sets the threshold, so k̄ = k often releases fewer than k)", "10·k",
          "none on ε and δ; Algorithm 2's threshold grows with log(m/δ)/ε, m = k̄ (min(Δ, k̄) "
          "with --max-items-per-user); Algorithm 1's does not depend on k̄"),
    Param("with_counts", bool, "Algorithm 1 (Laplace): also release noisy counts", None,
          "none: --epsilon is the whole query's either way"),
    Param("epsilon_per_selection", float, "Algorithm 2 only, instead of --epsilon: ε > 0 of "
          "each bounded-range selection (the Gumbel scale is 1/ε); --delta is then the "
          "query's threshold δ", None,
          "the stated guarantee is the composition of k selections (larger than this ε, "
          "with up to 2δ)"),
    Param("method", str, "top-k: 'limited-domain' (Durfee and Rogers: the true top k̄ "
          "ranked, pay what you get) or 'discover-peel' (Weighted Gaussian discovers a "
          "domain, then the peeling exponential mechanism ranks it)", DEFAULT_TOPK_METHOD,
          "none: --epsilon and --delta are the whole query's with either"),
    Param("discovery_share", float, "discover-peel and hitting-set: the fraction in (0, 1) "
          "of ε and of δ spent on discovering the domain (the rest ranks it)",
          _text(DEFAULT_DISCOVERY_SHARE), "none: the two stages compose to --epsilon, --delta"),
]}

ALL_PARAMS: Dict[str, Param] = dict(MECHANISM_PARAMS, **TOPK_PARAMS)


def flag(name: str) -> str:
    """The command-line flag of a declared parameter.

    ``'max_items'`` → ``'--max-items-per-user'``.
    """
    return ALL_PARAMS[name].cli_flag


def flags(names: Iterable[str]) -> str:
    """``'--a, --b'`` for declared parameter names."""
    return ", ".join(flag(n) for n in names)


def add_arguments(parser: argparse.ArgumentParser, names: Sequence[str],
                  help: Optional[Mapping[str, str]] = None,
                  required: Sequence[str] = ()) -> None:
    """Adds the flags of the declared parameters ``names`` to ``parser``.

    Args:
      help: per-name help replacing the declared one (a tool where the
        parameter means something narrower, e.g. top-k's ε).
      required: names whose flag is required.
    """
    help = help or {}
    for name in names:
        ALL_PARAMS[name].add_to(parser, help.get(name), name in required)


def _spellings() -> Dict[str, str]:
    out = {}
    for p in ALL_PARAMS.values():
        for spelling in (p.name,) + p.aliases:
            out[spelling] = p.cli_flag
    return out


def as_flags(message: str) -> str:
    """Names the parameters of a validation message as their command-line flags.

    A parameter spelled with an underscore (``max_items_per_user``, ``k_bar``)
    is renamed wherever it appears; a one-word one (``epsilon``, ``k``) only
    as the message's first word, where validation messages name their
    parameter (elsewhere such a word may be prose, as ``>= k``).
    """
    spellings = _spellings()
    compound = sorted((s for s in spellings if "_" in s), key=len, reverse=True)
    if compound:
        message = re.sub(r"(?<![-\w])(" + "|".join(map(re.escape, compound)) + r")\b",
                         lambda m: spellings[m.group(1)], message)
    first = re.match(r"^(\w+) ", message)
    if first and first.group(1) in spellings:
        message = spellings[first.group(1)] + message[first.end(1):]
    return message


def spec_types() -> Dict[str, type]:
    """``{spelling: type}`` of the per-mechanism settings ``compare`` accepts in
    ``NAME:KEY=VALUE`` (every valued parameter but the common ε, δ, ρ)."""
    out = {}
    for p in MECHANISM_PARAMS.values():
        if p.type is bool or p.name in ("epsilon", "delta", "rho"):
            continue
        for spelling in (p.name,) + p.aliases:
            out[spelling] = p
    return out


def canonical(spelling: str) -> str:
    """The declared name of a spelling (an alias or the name itself)."""
    for p in ALL_PARAMS.values():
        if spelling == p.name or spelling in p.aliases:
            return p.name
    raise KeyError(spelling)


def canonical_keywords(values: Mapping[str, Any]) -> Dict[str, Any]:
    """``values`` with every alias renamed to its declared name (unknown keys kept).

    Raises ValueError when two spellings of one parameter are given
    (``max_items`` and ``max_partitions_contributed``).
    """
    out: Dict[str, Any] = {}
    for key, value in values.items():
        try:
            name = canonical(key)
        except KeyError:
            name = key
        if name in out:
            raise ValueError(f"{flag(name)} is given twice (as {name!r} and an alias)")
        out[name] = value
    return out


def cli_arguments(values: Mapping[str, Any]) -> list:
    """``{name: value}`` → the command-line arguments that give them (None omitted)."""
    out = []
    for name, p in MECHANISM_PARAMS.items():
        value = values.get(name)
        if value is True:
            out.append(p.cli_flag)
        elif value is not None and value is not False:
            out += [p.cli_flag, repr(value) if isinstance(value, float) else str(value)]
    return out
