"""The run key inside a pipeline: drawn on a worker, read as a side input.

Why: everything a runner stages (the pickled DoFns of the job graph, in a
staging bucket, a job server or a runner's web UI) is readable by more people
than the release's data owner. If the run key were pickled into the DoFns,
anyone who can read the job graph could recompute every noise draw, every Δ0
sample and the user order, and undo the privacy of the release. So no DoFn of
this library holds a key or a subkey. Instead:

* ``pipeline_key(pipeline, run_key)`` adds one small step to the pipeline,
  ``Create([seed or None]) | Map(draw)``, whose single output element is the
  32 key bytes: drawn from the operating system (``secrets``) on the worker
  that runs the step for a fresh key, or derived from the seed for a test key.
  The step is added once per ``RunKey`` object and pipeline, so every
  transform given the same ``RunKey`` in one pipeline reads the same bytes.
* Every DoFn that needs randomness takes that PCollection as a singleton side
  input (``beam.pvalue.AsSingleton``) and builds what it needs from the bytes
  on the worker (``KeyedCache``).

A retry replays the same draws: a side input is materialised once, when the
step that draws it has committed its output, and every later bundle (first
attempt or retry, on any worker) reads that committed value. The key bytes
travel only as pipeline data (the side input), like the private input
itself, never as part of the job graph.

A ``RunKey`` built from explicit bytes (``RunKey(b'...')``) cannot be used in a
pipeline: its bytes would have to be staged. Use ``RunKey.fresh()`` (or None)
or, in tests, ``RunKey.from_test_seed``.
"""
from __future__ import annotations

import secrets
import weakref
from typing import Any, Callable, Dict, Optional

import apache_beam as beam

from beam_dpsu.noise import RunKey, test_seed_material

# pipeline -> {key identity: PCollection of the key bytes}
_KEYS: "weakref.WeakKeyDictionary[beam.Pipeline, Dict[Any, beam.PCollection]]" = \
    weakref.WeakKeyDictionary()


def for_pipeline(run_key: Optional[RunKey]) -> RunKey:
    """Validates the ``run_key`` argument of a transform (None: a fresh key).

    Raises ValueError for a key built from explicit bytes, whose secret would
    have to be part of the job graph.
    """
    run_key = RunKey.resolve(run_key)
    if run_key.handle is None and run_key.test_seed is None:
        raise ValueError(
            "a Beam transform takes RunKey.fresh() (or None) or RunKey.from_test_seed(s); a "
            "RunKey built from explicit bytes would put the secret into the job graph")
    return run_key


def _draw(seed: Optional[int]) -> bytes:
    """The key bytes, on the worker: fresh OS randomness, or derived from a test seed."""
    if seed is None:
        return secrets.token_bytes(32)
    return test_seed_material(seed)


class _SharedDraw:
    """``_draw`` made consistent on a runner that evaluates a side input once per reader.

    Beam's Dask runner recomputes a side input inside every task that reads it
    (``runners.Capabilities.side_inputs_once`` is False): a fresh key would be
    drawn again, differently, for every partition. There the first evaluation
    draws the key under a cluster-wide ``distributed.Lock`` and stores it in a
    ``distributed.Variable`` named by a public, random per-pipeline ``name``;
    every later evaluation reads it. The key then lives in the scheduler's
    memory (pipeline data, like the side input itself on other runners) until
    the launcher deletes the variable after the run
    (``delete_shared_keys``). A test seed needs none of this.
    """

    def __init__(self, name: str):
        self.name = name

    def __call__(self, seed: Optional[int]) -> bytes:
        if seed is not None:
            return test_seed_material(seed)
        from distributed import Lock, Variable, get_client
        client = get_client()
        with Lock(self.name):
            var = Variable(self.name, client=client)
            try:
                return var.get(timeout=0.5)
            except TimeoutError:
                key = secrets.token_bytes(32)
                var.set(key)
                return key


# pipeline -> names of the shared key variables it uses (Dask)
_SHARED: "weakref.WeakKeyDictionary[beam.Pipeline, list]" = weakref.WeakKeyDictionary()


def shared_key_names(pipeline: beam.Pipeline) -> list:
    """Names of the ``distributed.Variable`` s holding ``pipeline``'s fresh keys (Dask)."""
    return list(_SHARED.get(pipeline, ()))


def delete_shared_keys(pipeline: beam.Pipeline, client) -> None:
    """Deletes, after a Dask run, the scheduler-held copies of the run keys."""
    from distributed import Variable
    for name in shared_key_names(pipeline):
        try:
            Variable(name, client=client).delete()
        except Exception:  # never set (no reader ran)
            pass


def pipeline_key(pipeline: beam.Pipeline, run_key: RunKey) -> beam.PCollection:
    """The PCollection holding ``run_key``'s bytes (one element), added once per pipeline.

    Args:
      pipeline: the pipeline the transforms belong to (``pcoll.pipeline``).
      run_key: ``RunKey.fresh()`` or ``RunKey.from_test_seed(s)`` (see
        ``for_pipeline``).
    Returns:
      A PCollection of one ``bytes`` element; pass it to DoFns as
      ``beam.pvalue.AsSingleton(...)``.
    """
    run_key = for_pipeline(run_key)
    identity = ("seed", run_key.test_seed) if run_key.test_seed is not None else run_key.handle
    known = _KEYS.setdefault(pipeline, {})
    pcoll = known.get(identity)
    if pcoll is None:
        label = f"DrawRunKey{len(known)}"
        from beam_dpsu import runners
        draw = _draw
        if not runners.capabilities(pipeline).side_inputs_once and run_key.test_seed is None:
            name = "beam-dpsu-run-key-" + secrets.token_hex(16)  # public, names the copy
            _SHARED.setdefault(pipeline, []).append(name)
            draw = _SharedDraw(name)
        # The seed (None for a fresh key) is the only value staged.
        pcoll = (pipeline
                 | f"{label}/Seed" >> beam.Create([run_key.test_seed])
                 | f"{label}/Draw" >> beam.Map(draw).with_output_types(bytes))
        known[identity] = pcoll
    return pcoll


def key_side_input(pcoll: beam.PCollection, run_key: RunKey):
    """``AsSingleton`` of the key of ``run_key`` in ``pcoll``'s pipeline."""
    return beam.pvalue.AsSingleton(pipeline_key(pcoll.pipeline, run_key))


class KeyedCache:
    """``factory(RunKey(key_bytes))``, built once per worker and key.

    DoFns hold a ``KeyedCache`` (which holds no key when pickled) and call it
    with the side-input bytes in ``process``.

    Args:
      factory: ``run_key -> value``, e.g. ``mechanism.release_rule`` or
        ``lambda k: k.subkey('sample/0')``; must be picklable.
    """

    def __init__(self, factory: Callable[[RunKey], Any]):
        self._factory = factory
        self._bytes: Optional[bytes] = None
        self._value: Any = None

    def __call__(self, key_bytes: bytes) -> Any:
        if key_bytes is not self._bytes:
            if key_bytes != self._bytes:
                self._value = self._factory(RunKey(key_bytes))
            self._bytes = key_bytes
        return self._value

    def __getstate__(self):
        return {"_factory": self._factory, "_bytes": None, "_value": None}


class Subkey:
    """A picklable ``run_key -> run_key.subkey(purpose)``."""

    def __init__(self, purpose: str):
        self.purpose = purpose

    def __call__(self, run_key: RunKey) -> bytes:
        return run_key.subkey(self.purpose)
