"""One privacy budget for a command-line run that releases several things.

The flags, shared by ``beam-dpsu select``, ``top-k`` and ``compare``:

* ``--budget-epsilon E --budget-delta D``: the total (ε, δ)-DP guarantee the
  data owner is willing to publish for EVERYTHING this run releases. Given,
  the run builds a ``beam_dpsu.dp.mechanisms.budget.PrivacyBudget`` and each release is
  calibrated from its share of it; ``--epsilon``/``--delta``/``--rho`` (one
  release's own guarantee) are then refused, since two statements of the same
  run could disagree.
* ``--share NAME=FRACTION`` (repeatable): the fraction of the total a release
  receives (``select=0.7 --share top-k=0.3``). Releases without a ``--share``
  split what is left equally; without any ``--share`` every release gets an
  equal fraction. Fractions are of the total ε and δ alike; they may sum to
  less than 1 (the rest is not spent) but not to more.

Every check runs before any data is read: an over-spent budget, an unknown
release name or a bad fraction is a ``UsageError`` (exit status 2). The
public summary states the total under ``"budget"``
(``PrivacyBudget.describe()``: the total, each part's share and stated
guarantee, basic composition).

Rounding: each release's share is the fraction of the total rounded down, the
stated total is the exact sum of the parts rounded up, and it is compared with
the budget exactly (``budget.share_of``, ``accounting.sum_up``): the run never
states more than its budget, nor less than it spends. Printed figures are
``accounting.readable_up`` of the exact ones kept in the JSON.

``warn_guarantee`` prints one warning line per way the run's stated (ε, δ)
protects little (``calibration.guarantee_warnings``: ε above
``params.WARN_EPSILON_ABOVE``, δ above ``params.WARN_DELTA_ABOVE``); the run
goes on.

``parse_shares`` is the pure function behind ``--share``; ``plan`` builds the
budget from parsed arguments.
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Dict, Optional, Sequence, Tuple

from beam_dpsu.dp.privacy.accounting import PrivacyGuarantee, figure
from beam_dpsu.dp.mechanisms.budget import PrivacyBudget, compose_guarantees, fits
from beam_dpsu.dp.privacy.calibration import guarantee_warnings
from beam_dpsu.dp.privacy.params import WARN_DELTA_ABOVE, WARN_EPSILON_ABOVE
from beam_dpsu.pipelines.console import UsageError, write_line


__all__ = ["add_arguments", "parse_shares", "plan", "total_cost", "warn_guarantee"]


def warn_guarantee(epsilon: float, delta: float, stream=None) -> list:
    """Prints ``WARNING: <reason>`` on stderr for each ``calibration.guarantee_warnings`` of
    the stated (ε, δ) (one line each; the run goes on); returns the lines printed."""
    lines = ["WARNING: " + w for w in guarantee_warnings(epsilon, delta)]
    for line in lines:
        write_line(line, stream)
    return lines


def add_arguments(p: argparse.ArgumentParser, releases: Sequence[str] = (),
                  shares: bool = True) -> None:
    """Adds ``--budget-epsilon``, ``--budget-delta`` and (with ``shares``) ``--share``.

    Args:
      releases: the names a ``--share`` may use (the releases this command can make).
      shares: False: the releases' guarantees come from other flags and the budget
        only caps their total (``compare``); no ``--share``.
    """
    g = p.add_argument_group(
        "one privacy budget for the whole run",
        "state the total guarantee of everything the run releases; each release is "
        "calibrated from its share (replaces --epsilon/--delta)" if shares else
        "state the most the run's releases may spend together; it refuses to run past it")
    g.add_argument("--budget-epsilon", dest="budget_epsilon", type=float, metavar="E",
                   help=f"total ε > 0 of all releases of this run, composed (basic "
                        f"composition; compare: zCDP composition where every release is "
                        f"zCDP; a warning above {WARN_EPSILON_ABOVE:g}). Privacy: the run's "
                        f"stated guarantee")
    g.add_argument("--budget-delta", dest="budget_delta", type=float, metavar="D",
                   help=f"total δ in (0, 1) of all releases of this run (a warning above "
                        f"{WARN_DELTA_ABOVE:g}). Privacy: the run's stated guarantee")
    if not shares:
        return
    g.add_argument("--share", dest="share", action="append", metavar="NAME=FRACTION",
                   help=f"fraction 0 < f <= 1 of the total ε and δ given to release NAME "
                        f"({', '.join(releases)}); repeatable; default: releases without a "
                        f"share split the rest equally. Privacy: none on the total, which "
                        f"the fractions can only under-spend")


def parse_shares(texts: Optional[Sequence[str]], releases: Sequence[str]) -> Dict[str, float]:
    """``--share`` values → the fraction of the total for every release.

    Args:
      texts: the ``NAME=FRACTION`` strings (None or empty: no ``--share``).
      releases: the releases this run makes, in order.

    Returns ``{name: fraction}`` for every release: the given fractions, and
    for the others an equal split of ``1 − Σ given``.

    Raises UsageError for a malformed text, an unknown or repeated name, a
    fraction outside (0, 1], fractions summing to more than 1, or nothing
    left for a release without a share.
    """
    given: Dict[str, float] = {}
    for text in texts or ():
        name, eq, value = str(text).partition("=")
        name = name.strip()
        if not eq or not name:
            raise UsageError(f"--share {text!r}: use NAME=FRACTION, e.g. "
                             f"--share {releases[0]}=0.5")
        if name not in releases:
            raise UsageError(f"--share {text!r}: this run makes no release named {name!r}; "
                             f"its releases: {', '.join(releases)}")
        if name in given:
            raise UsageError(f"--share gives {name!r} twice")
        try:
            f = float(value)
        except ValueError:
            raise UsageError(f"--share {text!r}: the fraction must be a number") from None
        if not (math.isfinite(f) and 0.0 < f <= 1.0):
            raise UsageError(f"--share {text!r}: the fraction must be in (0, 1]")
        given[name] = f
    total = math.fsum(given.values())
    if total > 1.0 + 1e-12:
        raise UsageError(f"--share fractions sum to {total:g} > 1: the releases would spend "
                         f"more than the budget")
    rest = [r for r in releases if r not in given]
    if rest:
        left = 1.0 - total
        if left <= 1e-12:
            raise UsageError(f"--share leaves nothing of the budget for {', '.join(rest)}")
        given.update({r: left / len(rest) for r in rest})
    return {r: given[r] for r in releases}


def plan(args: argparse.Namespace, releases: Sequence[str],
         replaced: Sequence[str] = ("epsilon", "delta", "rho")
         ) -> Optional[Tuple[PrivacyBudget, Dict[str, float]]]:
    """The run's budget and each release's fraction, or None without budget flags.

    Args:
      args: parsed arguments with ``budget_epsilon``, ``budget_delta``, ``share``
        and the flags in ``replaced``.
      releases: the releases this run makes.
      replaced: per-release guarantee flags a budget replaces (refused with it).

    Raises UsageError for half a budget, a budget together with a replaced
    flag, ``--share`` without a budget, or any ``parse_shares`` error.
    """
    eps, delta = args.budget_epsilon, args.budget_delta
    if eps is None and delta is None:
        if args.share:
            raise UsageError("--share needs the run's total: --budget-epsilon and "
                             "--budget-delta")
        return None
    if eps is None or delta is None:
        raise UsageError("give both --budget-epsilon and --budget-delta (the run's total)")
    clash = [name for name in replaced if getattr(args, name, None) is not None]
    if clash:
        flags = ", ".join("--" + name.replace("_", "-") for name in clash)
        raise UsageError(f"{flags} cannot be given with --budget-epsilon/--budget-delta: the "
                         f"budget calibrates the release(s) (see --share)")
    try:
        budget = PrivacyBudget(eps, delta)
    except ValueError as e:
        raise UsageError(f"--budget-epsilon/--budget-delta: {e}") from None
    return budget, parse_shares(args.share, releases)


def total_cost(args: argparse.Namespace, guarantees: Sequence[PrivacyGuarantee],
               what: str) -> Dict[str, Any]:
    """The composed guarantee of a run's planned releases, checked against its budget.

    Args:
      args: parsed arguments with ``budget_epsilon`` and ``budget_delta`` (both
        None: no cap, the total is only stated).
      guarantees: each planned release's stated guarantee.
      what: what the releases are, for the messages (``"5 trials of 2 mechanisms"``).

    Returns a JSON-ready statement (``releases``, ``epsilon``, ``delta``,
    ``composition``, ``budget_epsilon``, ``budget_delta``): the total is exact sums
    rounded up (``budget.compose_guarantees``) and is compared with the budget
    exactly. Raises UsageError for half a budget or a total past it (before any data
    is read).
    """
    eps, delta = args.budget_epsilon, args.budget_delta
    if (eps is None) != (delta is None):
        raise UsageError("give both --budget-epsilon and --budget-delta (the run's total)")
    if eps is not None:
        try:
            PrivacyBudget(eps, delta)
        except ValueError as e:
            raise UsageError(f"--budget-epsilon/--budget-delta: {e}") from None
    total = compose_guarantees(guarantees)
    if eps is not None and not (fits(total.epsilon, eps) and fits(total.delta, delta)):
        raise UsageError(f"{what} would spend ε = {figure(total.epsilon)}, "
                         f"δ = {figure(total.delta)} together ({total.note}), more than "
                         f"--budget-epsilon {eps!r} --budget-delta {delta!r}: run fewer "
                         f"releases or lower their ε, δ")
    return {"releases": len(guarantees), "epsilon": total.epsilon, "delta": total.delta,
            "composition": total.note, "budget_epsilon": eps, "budget_delta": delta}
