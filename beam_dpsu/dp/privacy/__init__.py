"""The privacy arithmetic: the declaration of every mechanism parameter (``params``),
thresholds and noise scales (``calibration``) and the conversions between notions of privacy
(``accounting``).

It imports nothing else of beam_dpsu: every other group of ``beam_dpsu.dp`` builds on it.
"""
