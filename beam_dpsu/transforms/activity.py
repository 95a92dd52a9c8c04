"""The users' activity in a Beam pipeline, and a mechanism calibrated from its DP estimate.

``--max-items-per-user auto`` (``dp.mechanisms.auto_bound``) and GW-KT's calibration read
their parameters from a DP estimate of how many distinct items the users hold. In your
own pipeline::

    mechanism = make_mechanism("weighted-gaussian", epsilon=1, delta=1e-6, max_items="auto")
    mechanism = activity.calibrate(mechanism, lambda p: p | ReadMyPairs(), options)
    with beam.Pipeline(options=options) as p:
        p | ReadMyPairs() | SelectPartitions(mechanism) | WriteRelease(...)

``calibrate`` builds and runs a small pipeline of its own from your ``build_input``
(the same source, on the same runner), counts the users by their number of distinct
items (``UserActivity``), releases that histogram with the mechanism's share of ε and
returns the calibrated mechanism. The exact counts pass through one owner-only file that
is deleted at once.
"""
from __future__ import annotations

import json
import tempfile
from typing import Callable, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_dpsu.dp.mechanisms.activity import ActivityBuckets
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms.bounding import PerUserItemCounts
from beam_dpsu.transforms.run_key import wait_for
from beam_dpsu.transforms.staging import make_directory, remove_directory
from beam_dpsu.transforms.write import WriteOneFile

__all__ = ["UserActivity", "calibrate"]


class _SumHistograms(beam.CombineFn):
    def __init__(self, count: int):
        self._count = count

    def create_accumulator(self):
        return [0] * self._count

    def add_input(self, acc, bucket):
        acc[bucket] += 1
        return acc

    def merge_accumulators(self, accs):
        out = [0] * self._count
        for acc in accs:
            out = [a + b for a, b in zip(out, acc)]
        return out

    def extract_output(self, acc):
        return tuple(int(n) for n in acc)


def _bucket(element, layout: ActivityBuckets) -> int:
    return int(layout.of([len(element[1])])[0])


class UserActivity(beam.PTransform):
    """``(user_id, item)`` pairs (or, with ``per_user=True``, one ``(user_id, {item:
    count})`` per user) → ONE element: the users counted by their number of distinct
    items in ``layout``'s buckets (a tuple of ``layout.count`` ints).

    Args:
      layout: the buckets (``mechanism.layout`` of a mechanism that needs calibration).
      per_user: as for ``SelectPartitions``. Default False.

    Privacy: the output is exact and private; only its noised release
    (``mechanism.estimate``) may leave the owner's hands.
    """

    def __init__(self, layout: ActivityBuckets, per_user: bool = False,
                 label: Optional[str] = None):
        super().__init__(label)
        if not isinstance(layout, ActivityBuckets):
            raise ValueError(f"layout must be an ActivityBuckets, got {layout!r}")
        self._layout, self._per_user = layout, bool(per_user)

    def expand(self, pcoll):
        per_user = pcoll if self._per_user else pcoll | "PerUser" >> PerUserItemCounts()
        return (per_user
                | "NonEmpty" >> beam.Filter(lambda kv: len(kv[1]) > 0)
                | "Bucket" >> beam.Map(_bucket, self._layout)
                | "Sum" >> beam.CombineGlobally(_SumHistograms(self._layout.count)))


def calibrate(mechanism, build_input: Callable[[beam.Pipeline], beam.PCollection],
              options=None, run_key: Optional[RunKey] = None, per_user: bool = False,
              work_dir: Optional[str] = None):
    """The mechanism ready to run in your pipeline: its parameters (Δ0 with
    ``max_items='auto'``; GW-KT's Δ0, M and κ) from a DP estimate of the data's activity.

    Args:
      mechanism: a mechanism whose ``needs_calibration`` is true
        (``registry.make_mechanism(name, max_items='auto', ...)``, or a ``GWKT`` with a
        calibration share).
      build_input: ``build_input(pipeline)`` → the PCollection you will give
        ``SelectPartitions`` (the same source; it is read once more, here).
      options: the ``PipelineOptions`` of the small pipeline (default:
        ``runners.pipeline_options([])``, the DirectRunner's FnApiRunner); give your own
        to count on your runner.
      run_key: None (default): the estimate's noise comes from a fresh OS-random key drawn
        here, one per call. ``RunKey.from_test_seed(s)`` only in tests (then the estimate
        is the one ``mechanism.run_local`` draws under that key). Any other key is
        refused: two calibrations under one key draw the same noise, and their
        difference would give the exact counts away.
      per_user: as for ``SelectPartitions``.
      work_dir: a folder, new, that every worker can write and only you can read, for
        the one file of exact counts (deleted before this returns). Default: a new
        owner-only folder in the launcher's temporary directory (runners whose workers
        share the launcher's disk: the DirectRunner, Prism, a local Flink or Spark).

    Returns:
      ``mechanism.calibrated(estimate)``: the mechanism to give ``SelectPartitions``.
      Its guarantee is the whole run's (the estimate's share included).

    Privacy: the estimate is ε-DP at the mechanism's ``calibration_epsilon``; the
    calibrated mechanism's parameters are functions of it and of public values only.
    Use the calibrated mechanism for ONE release: each calibration spends its share.
    """
    if not getattr(mechanism, "needs_calibration", False):
        raise ValueError(f"{mechanism!r} needs no calibration: give it to SelectPartitions")
    if not callable(build_input):
        raise ValueError("build_input must be a function of a pipeline that returns the "
                         "input PCollection")
    if run_key is not None and getattr(run_key, "test_seed", None) is None:
        raise ValueError("calibrate draws a fresh key for each estimate: pass run_key only "
                         "as RunKey.from_test_seed(s), in tests")
    key = RunKey.fresh() if run_key is None else run_key
    folder = make_directory(work_dir) if work_dir is not None else \
        tempfile.mkdtemp(prefix="beam-dpsu-activity-PRIVATE-")
    path = FileSystems.join(folder, "activity.PRIVATE.json")
    try:
        from beam_dpsu.transforms import runners
        p = beam.Pipeline(options=options if options is not None
                          else runners.pipeline_options([]))
        (build_input(p)
         | "UserActivity" >> UserActivity(mechanism.layout, per_user)
         | "AsJson" >> beam.Map(json.dumps)
         | "WriteCounts" >> WriteOneFile(path))
        wait_for(p, p.run())
        with FileSystems.open(path) as f:
            histogram = json.loads(f.read().decode("utf-8"))
    finally:
        remove_directory(folder)
    return mechanism.calibrated(mechanism.estimate(histogram, key))
