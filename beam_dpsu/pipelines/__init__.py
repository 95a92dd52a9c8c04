"""The command line of beam_dpsu (``beam-dpsu COMMAND``) and its runnable pipelines.

One module per command (``select_partitions``, ``top_k``, ``compare``,
``generate``, ``audit``), the console command (``cli``), and what they share
(``flags``, ``outputs``, ``runs``, ``run_budget``). The top-level ``pipelines/`` folder of a
checkout holds plain entry points to these.
"""
