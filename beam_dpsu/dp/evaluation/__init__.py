"""Evaluation, never part of a release: the empirical privacy auditor (``audit``), utility
statistics (``utility``) and synthetic data (``synthetic``).

It may import every other group of ``beam_dpsu.dp``; none of them imports it.
"""
