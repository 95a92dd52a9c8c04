"""``SelectPartitions``: differentially private set union of a PCollection.

It applies any calibrated mechanism of ``beam_dpsu.dp.mechanisms`` through the
expansion registered for its family (``beam_dpsu.transforms.expansion``);
importing this module registers every family of the library.
"""
from __future__ import annotations

from typing import Optional

import apache_beam as beam

from beam_dpsu.dp.mechanisms.on_blocks import runs_columnar
from beam_dpsu.dp.mechanisms.base import Mechanism
from beam_dpsu.dp.privacy.calibration import check_flag
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms import adaptive as _adaptive  # noqa: F401  (registers its family)
from beam_dpsu.transforms import budget as _budget  # noqa: F401  (registers its family)
from beam_dpsu.transforms import ordered as _ordered  # noqa: F401  (registers its family)
from beam_dpsu.transforms import peeling as _peeling  # noqa: F401  (registers its family)
from beam_dpsu.transforms import sips as _sips  # noqa: F401  (registers its family)
from beam_dpsu.transforms import topk as _topk  # noqa: F401  (registers its family)
from beam_dpsu.transforms import run_key as keys
from beam_dpsu.transforms.bounding import (CanonicalPerUser, PerUserItemCounts, check_global_window,
                                           has_canonical_ids)
from beam_dpsu.transforms.columnar import SelectFromPairs
from beam_dpsu.transforms.expansion import expand_mechanism, expand_mechanism_parts

__all__ = ["SelectPartitions"]


class SelectPartitions(beam.PTransform):
    """Differentially private set union of a PCollection of ``(user_id, item)``.

    On ``(user_id, item)`` pairs every mechanism of ``beam-dpsu select`` runs on
    blocks of arrays (``columnar.SelectFromPairs``: the pairs batched, the core the
    command line runs), where the runner keeps what a DoFn emits when a bundle ends
    (not Beam's Dask runner); elsewhere, for other mechanisms and for input with
    ``per_user=True`` it runs ``PerUserItemCounts`` and then the mechanism. The
    release is the same either way for ``str`` ids. The output is a
    PCollection of released items that carries no order: only the SET is
    covered by the guarantee. The order in which a runner produces the
    elements (and so the order of lines that ``WriteToText`` writes, and which
    shard an item lands in) can follow the input order and reveal which items
    the first users hold. To write a release, collect it (it is small next to
    the data), sort it (``dp.data.contribution.canonical_items``) and write ONE file,
    as ``beam_dpsu.transforms.write.WriteRelease`` does; never write this PCollection
    straight to a sharded sink.

    User ids and items must be ``str``, ``bytes``, ``int`` or tuples of these
    (recursively; numpy integers are converted to the equal ``int``). Any
    other type (``bool``, ``float``, ``None``, ...) makes the pipeline fail
    when it runs (the earliest its elements are seen) with an ``IdTypeError``
    naming the type (``dp.data.contribution.canonical_id``): Python treats ``1``,
    ``1.0`` and ``True`` as one key while the keyed hashes tell them apart, so
    an added user ``True`` could otherwise merge into user ``1`` and change the
    histogram by more than the noise is calibrated for. With ``per_user=True``
    the ids of an input that neither ``PerUserItemCounts`` nor
    ``textio.ReadUserItems`` produced are checked by one step per user
    (``bounding.CanonicalPerUser``).

    Args:
      mechanism: a calibrated ``Mechanism`` (e.g. ``WeightedGaussian(3, 1e-6)``). A GW
        or GW-KT with ``tie_break='first-occurrence'`` needs ``per_user=True`` input in
        record order; on ``(user, item)`` pairs one built by ``registry.make_mechanism``
        without a tie-break runs with ``item-hash`` instead (``GW.without_record_order``),
        one given the tie-break explicitly is refused (ValueError).
      run_key: the run's ``RunKey``. None (the default) means a fresh key:
        its 32 bytes are drawn from the operating system on a worker when the
        pipeline runs and read by every step as a side input, so the secret is
        never part of the job graph that a runner stages (see
        ``beam_dpsu.transforms.run_key``). Pass ``RunKey.from_test_seed(s)`` only in tests.
      per_user: set True when the input is already ``(user_id, {item: count})``
        with one element per user (e.g. from ``textio.ReadUserItems``), or a
        tuple of such PCollections with each user in exactly one of them (the
        merged and complete users of ``ReadUserItems(...,
        complete_users=True)``). Default False. No privacy effect, but an
        input with several elements per user would break the per-user bound.
      label: the transform's label (default: Beam's).

    Privacy: the mechanism's ``guarantee`` under add/remove-one-user
    neighbouring datasets, provided each user id identifies one person and
    ``run_key`` is secret and used for one release only.
    """

    def __init__(self, mechanism: Mechanism, run_key: Optional[RunKey] = None,
                 per_user: bool = False, label: Optional[str] = None):
        super().__init__(label)
        if getattr(mechanism, "needs_calibration", False):
            raise ValueError(f"{mechanism!r} takes its parameters from a DP estimate of the "
                             "data: calibrate it first with beam_dpsu.transforms.activity."
                             "calibrate(mechanism, build_input, options), then give "
                             "SelectPartitions the mechanism it returns")
        if not isinstance(mechanism, Mechanism):
            raise ValueError(f"mechanism must be a beam_dpsu Mechanism, got {mechanism!r}")
        if mechanism.needs_record_order and not per_user:
            # (user, item) pairs have no record order: the mechanism's fallback tie-break
            # (registry-built with the default tie-break), else a ValueError.
            mechanism = mechanism.without_record_order()
        self._mechanism = mechanism
        self._run_key = keys.for_pipeline(run_key)
        self._per_user = check_flag(per_user, "per_user")

    def expand(self, pcoll):
        from beam_dpsu.transforms import runners
        runners.check_input(pcoll, "SelectPartitions")
        if isinstance(pcoll, (tuple, list)):
            if not self._per_user:
                raise ValueError("SelectPartitions takes a tuple of PCollections only with "
                                 "per_user=True (per-user parts, each user in one of them)")
            parts = tuple(part if has_canonical_ids(part)
                          else part | f"CanonicalPerUser{k}" >> CanonicalPerUser()
                          for k, part in enumerate(pcoll))
            return expand_mechanism_parts(self._mechanism, parts, self._run_key)
        if not self._per_user and _on_blocks(self._mechanism, pcoll.pipeline):
            check_global_window(pcoll, "SelectPartitions")
            return pcoll | "SelectFromPairs" >> SelectFromPairs(self._mechanism, self._run_key)
        if not self._per_user:
            per_user = pcoll | "PerUserItemCounts" >> PerUserItemCounts()
        elif has_canonical_ids(pcoll):
            per_user = pcoll
        else:
            per_user = pcoll | "CanonicalPerUser" >> CanonicalPerUser()
        return expand_mechanism(self._mechanism, per_user, self._run_key)


def _on_blocks(mechanism: Mechanism, pipeline) -> bool:
    """Whether ``SelectPartitions`` on pairs runs ``mechanism`` on blocks of arrays
    (``columnar.SelectFromPairs``): every mechanism the columnar path runs (without
    the record order, which pairs do not have), on a runner that keeps what a DoFn
    emits when a bundle ends (the pairs' last batch is sent then)."""
    from beam_dpsu.transforms import runners
    return (runs_columnar(mechanism) and not mechanism.needs_record_order
            and runners.capabilities(pipeline).bundle_outputs)
