"""The Beam layer of beam_dpsu: PTransforms and DoFns over the pure core ``beam_dpsu.dp``.

Reading (``textio``), per-user counts and Δ0 sampling (``bounding``),
weighted histograms (``histogram``), release rules applied per item
(``release``), the ordered-user transform of the sequential policies
(``ordered``), DP-SIPS rounds (``sips``), top-k (``topk``), the run key as a
side input (``run_key``), ``SelectPartitions`` (``select``), writing a
release (``write``) and the PipelineDP bridge (``pipelinedp``). Only
``runners`` knows which runner runs a pipeline.
"""
