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

On a runner that re-evaluates a side input in every task (Beam's Dask runner),
``key_side_input`` passes a ``WorkerKey`` instead: a public name by which each
worker fetches (or, the first, draws) the key from the cluster's scheduler
once per process. Still no key bytes in the job graph.

A ``RunKey`` built from explicit bytes (``RunKey(b'...')``) cannot be used in a
pipeline: its bytes would have to be staged. Use ``RunKey.fresh()`` (or None)
or, in tests, ``RunKey.from_test_seed``.
"""
from __future__ import annotations

import secrets
import weakref
from typing import Any, Callable, Dict, Optional

import apache_beam as beam

from beam_dpsu.dp.randomness.noise import RunKey, test_seed_material

__all__ = ["for_pipeline", "SHARED_KEYS", "shared_key_names", "shared_key", "delete_shared_keys",
           "pipeline_key", "WorkerKey", "key_bytes", "key_side_input", "KeyedCache", "Subkey",
           "wait_for"]


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


# pipeline -> names of the shared keys it uses (Dask)
_SHARED: "weakref.WeakKeyDictionary[beam.Pipeline, list]" = weakref.WeakKeyDictionary()

#: Where the scheduler holds the shared keys: ``task_metadata[SHARED_KEYS][name]``
#: (``Client.set_metadata`` / ``get_metadata``).
SHARED_KEYS = "beam-dpsu-run-keys"


def shared_key_names(pipeline: beam.Pipeline) -> list:
    """Names of ``pipeline``'s fresh keys shared through the Dask scheduler."""
    return list(_SHARED.get(pipeline, ()))


def shared_key(client, name: str) -> Optional[bytes]:
    """The scheduler's copy of the shared key ``name``, or None (never drawn, or deleted)."""
    return client.get_metadata([SHARED_KEYS, name], None) or None


def delete_shared_keys(pipeline: beam.Pipeline, client) -> None:
    """Deletes, after a Dask run, the scheduler-held copies of the run keys: each is
    replaced by None (``Client.set_metadata``, which waits for the scheduler), so only
    the public name stays in the scheduler's memory."""
    for name in shared_key_names(pipeline):
        client.set_metadata([SHARED_KEYS, name], None)


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
        # The seed (None for a fresh key) is the only value staged.
        pcoll = (pipeline
                 | f"{label}/Seed" >> beam.Create([run_key.test_seed])
                 | f"{label}/Draw" >> beam.Map(_draw).with_output_types(bytes))
        known[identity] = pcoll
    return pcoll


class WorkerKey:
    """The run key's bytes, fetched by the worker itself (runners without once-only side inputs).

    Beam's Dask runner evaluates a side input as a nested dask computation
    inside every task that reads it (``runners.Capabilities.side_inputs_once``
    is False): a fresh key would differ per partition, and every task waits on
    the scheduler for it (most of the task threads' time in a 100,000-user run). There ``key_side_input`` passes this
    object to the DoFn instead, as a plain extra argument; ``key_bytes(obj)``
    resolves it once per worker process:

    * a fresh key: the first resolution in the cluster draws 32 bytes from the
      OS (``secrets``) under a cluster-wide ``distributed.Lock`` named ``name``
      and stores them in the scheduler's metadata under that name
      (``Client.set_metadata``); every later resolution (any worker, any retry)
      reads them (``Client.get_metadata``, which answers at once whether or not
      the key exists: a ``distributed.Variable`` could only be waited for, and a
      wait that times out logs an ERROR traceback on the scheduler). The key
      lives in the scheduler's memory until the launcher deletes it after the
      run (``delete_shared_keys``), and in each worker's memory (at most the
      last ``_RESOLVED_MAX`` keys) while the process lives;
    * a test seed: the bytes are derived from the seed.

    Only ``name`` (public, random, naming the copy) and the test seed are
    pickled into the job graph; never key bytes.
    """

    def __init__(self, name: str, seed: Optional[int] = None):
        self.name = name
        self.seed = seed

    def resolve(self) -> bytes:
        found = _RESOLVED.get(self.name)
        if found is None:
            found = _draw(self.seed) if self.seed is not None else _shared_draw(self.name)
            while len(_RESOLVED) >= _RESOLVED_MAX:
                _RESOLVED.pop(next(iter(_RESOLVED)))
            _RESOLVED[self.name] = found
        return found


_RESOLVED: Dict[str, bytes] = {}  # per worker process: WorkerKey.name -> key bytes
_RESOLVED_MAX = 4


def _shared_draw(name: str) -> bytes:
    """The cluster-wide fresh key called ``name``: drawn by the first caller, read by the rest."""
    from distributed import Lock, get_client
    client = get_client()
    with Lock(name):
        key = shared_key(client, name)
        if key is None:
            key = secrets.token_bytes(32)
            client.set_metadata([SHARED_KEYS, name], key)
        return key


def key_bytes(value) -> bytes:
    """The key bytes a DoFn received from ``key_side_input``: the side input's bytes, or a
    ``WorkerKey`` resolved on this worker."""
    return value if isinstance(value, bytes) else value.resolve()


def key_side_input(pcoll: beam.PCollection, run_key: RunKey):
    """The extra ``ParDo`` argument carrying ``run_key`` to a DoFn in ``pcoll``'s pipeline.

    ``AsSingleton`` of ``pipeline_key``'s PCollection on runners that compute a
    side input once per run; a ``WorkerKey`` (the same object for every
    transform given the same ``RunKey`` in one pipeline) on runners that
    re-evaluate it per task (Dask). DoFns pass what they receive to a
    ``KeyedCache`` (or ``key_bytes``).
    """
    pipeline = pcoll.pipeline
    from beam_dpsu.transforms import runners
    if runners.capabilities(pipeline).side_inputs_once:
        return beam.pvalue.AsSingleton(pipeline_key(pipeline, run_key))
    run_key = for_pipeline(run_key)
    identity = ("seed", run_key.test_seed) if run_key.test_seed is not None else run_key.handle
    known = _WORKER_KEYS.setdefault(pipeline, {})
    if identity not in known:
        name = "beam-dpsu-run-key-" + secrets.token_hex(16)  # public, names the copy
        if run_key.test_seed is None:
            _SHARED.setdefault(pipeline, []).append(name)
        known[identity] = WorkerKey(name, run_key.test_seed)
    return known[identity]


# pipeline -> {key identity: WorkerKey}
_WORKER_KEYS: "weakref.WeakKeyDictionary[beam.Pipeline, Dict[Any, WorkerKey]]" = \
    weakref.WeakKeyDictionary()


class KeyedCache:
    """``factory(RunKey(key_bytes))``, built once per worker and key.

    DoFns hold a ``KeyedCache`` (which holds no key when pickled) and call it
    in ``process`` with what ``key_side_input`` gave them (the side-input
    bytes, or a ``WorkerKey`` it resolves).

    Args:
      factory: ``run_key -> value``, e.g. ``mechanism.release_rule`` or
        ``lambda k: k.subkey('sample/0')``; must be picklable.
    """

    def __init__(self, factory: Callable[[RunKey], Any]):
        self._factory = factory
        self._bytes: Optional[bytes] = None
        self._value: Any = None

    def __call__(self, key) -> Any:
        raw = key_bytes(key)
        if raw is not self._bytes:
            if raw != self._bytes:
                self._value = self._factory(RunKey(raw))
            self._bytes = raw
        return self._value

    def __getstate__(self):
        return {"_factory": self._factory, "_bytes": None, "_value": None}


class Subkey:
    """A picklable ``run_key -> run_key.subkey(purpose)``."""

    def __init__(self, purpose: str):
        self.purpose = purpose

    def __call__(self, run_key: RunKey) -> bytes:
        return run_key.subkey(self.purpose)


def wait_for(pipeline: beam.Pipeline, result) -> None:
    """Waits for ``result`` to finish, then releases what the runner holds for the run:
    on Dask, the run key shared through the cluster (``run_key.delete_shared_keys``)
    and the client, which would otherwise retry the scheduler after the run.

    When the wait fails (the job failed, the launcher lost the cluster, Ctrl-C), the
    run is cancelled first (``runners.cancel_run``: on Dask, also waiting for its tasks
    that were already running to end), so that nothing of it writes files after the
    launcher's clean-up."""
    from beam_dpsu.transforms import runners
    try:
        result.wait_until_finish()
    except BaseException:
        runners.cancel_run(result)
        raise
    finally:
        client = getattr(result, "client", None)  # the Dask runner's
        if client is not None:
            try:
                if shared_key_names(pipeline):
                    delete_shared_keys(pipeline, client)
            finally:
                client.close()
