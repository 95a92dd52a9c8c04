"""The data path: lines of ``user<TAB>item`` (``lines``), blocks of Arrow and numpy arrays
(``columnar``, ``columnar_policy``), contribution bounding (``contribution``), histogram
weights (``weights``) and the sequential passes over ordered users (``sequential``, with
their compiled ``kernels``).

It imports ``privacy`` and ``randomness``, never a mechanism: a mechanism hands it what it
needs, and ``mechanisms.on_blocks`` runs a mechanism on its blocks.
"""
