"""The pure core of beam_dpsu: everything that decides a release, without Beam.

Noise and keyed samplers (``noise``), calibration (``calibration``),
accounting and budgets (``accounting``, ``budget``), contribution bounding
and histogram weights (``contribution``, ``weights``), release rules
(``release_rules``), the sequential policies and their kernels
(``sequential``, ``kernels``), the mechanisms with their guarantee,
calibration and Beam-free run (``mechanisms``), the parameter declarations
and registry (``params``, ``registry``), the privacy auditor's
core (``audit``), and the columnar path's blocks of arrays (``lines``,
``columnar``, ``columnar_policy``, ``buffers``, ``siphash``, and the
optional compiled kernels behind ``compiled``). Importing this package never imports ``apache_beam``
(a test and the import contract in ``setup.cfg`` check it); the Beam
transforms over it are in ``beam_dpsu.transforms``.
"""
