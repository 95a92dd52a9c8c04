"""The data path: lines of ``user<TAB>item`` (``lines``), blocks of Arrow and numpy arrays
(``columnar_text``: a block of text as arrays; ``columnar_sampling``: the Δ0 sampler on
arrays; ``columnar``: pair blocks, the group stage and the shards; ``columnar_policy``), contribution bounding (``contribution``), histogram
weights (``weights``) and the sequential passes over ordered users (``sequential``, with
their compiled ``kernels``).

It imports ``privacy`` and ``randomness``, never a mechanism: a mechanism hands it what it
needs, and ``mechanisms.on_blocks`` runs a mechanism on its blocks.
"""
