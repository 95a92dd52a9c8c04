"""DP-SIPS: moved to ``beam_dpsu.mechanisms.sips``.

This module re-exports it so that ``from beam_dpsu.sips import Sips,
SipsRounds`` keeps working.
"""
from beam_dpsu.mechanisms.sips import *  # noqa: F401,F403
from beam_dpsu.mechanisms.sips import (DEFAULT_RATIO, DEFAULT_ROUNDS, REMOVALS, Sips,  # noqa: F401
                                       SipsRounds, check_ratio, check_rounds, remove_items,
                                       round_budgets, round_fractions)
