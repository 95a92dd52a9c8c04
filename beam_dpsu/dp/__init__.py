"""The pure core of beam_dpsu: everything that decides a release, without Beam.

Five groups, each a package whose imports flow one way (the import contract in
``setup.cfg`` checks it), from the bottom up:

* ``privacy``: parameter declarations, thresholds and noise scales, conversions;
* ``randomness``: the keyed PRF, noise samplers and run keys, exact keyed release rules;
* ``data``: lines, blocks of arrays, contribution bounding, weights, sequential passes;
* ``mechanisms``: every mechanism on one contract, the registry, budgets, and a
  mechanism run on the data path's blocks (``on_blocks``);
* ``evaluation``: the privacy auditor, utility statistics, synthetic data.

Importing this package never imports ``apache_beam``; the Beam transforms over it are in
``beam_dpsu.transforms``.
"""
