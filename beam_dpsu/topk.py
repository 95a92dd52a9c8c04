"""Top-k over an unknown domain: moved to ``beam_dpsu.mechanisms.topk``.

This module re-exports it so that ``from beam_dpsu.topk import TopK,
TopKMechanism, top_k_local`` keeps working.
"""
from beam_dpsu.mechanisms.topk import *  # noqa: F401,F403
from beam_dpsu.mechanisms.topk import (BOTTOM, DEFAULT_PURPOSE, RankKey, TopK,  # noqa: F401
                                       TopKMechanism, format_line, gumbel_threshold_offset,
                                       item_user_counts, laplace_difference_tail,
                                       laplace_scale, laplace_tail_offset,
                                       laplace_threshold_offset, rank_key, top_k_local,
                                       true_top)
