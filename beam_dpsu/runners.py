"""What each Beam runner really executes, and the expansions this library picks for it.

A Beam pipeline is a graph of primitives; a runner that does not implement one
may not fail: Beam's Dask runner (``apache_beam.runners.dask``, Beam 2.77)
translates only ``Create``, ``ParDo`` (with side inputs), ``GroupByKey`` and
``Flatten`` into dask-bag operations and turns every other leaf transform into
a silent identity. Verified on a ``distributed.LocalCluster`` with two worker
processes (see ``docs/runners.md``, "Dask", for the reproductions):

* ``CombinePerKey``, ``CombineGlobally``, ``Top.Of``, ``ToList`` and
  ``Reshuffle`` are executed correctly: the Python SDK expands them into
  ``ParDo`` + ``GroupByKey`` (+ ``Flatten``/``Create``), and ``Reshuffle`` is
  replaced by an identity (correct, it only redistributes);
* a side input is evaluated again inside every task (dask partition) that
  reads it: a step that draws randomness (the run key, ``keys.py``) returns a
  different value to every partition, and an expensive side input is
  recomputed per partition;
* hence file sinks (``WriteToText``, ``beam.io.Write``) write an EMPTY file:
  the sink's initialisation step is a side input, so every partition writes to
  its own temporary directory and the finalisation (another evaluation) finds
  none of them;
* only the last transform of the graph (and what it depends on) is computed:
  a second sink is silently skipped;
* the ``Read`` primitive (``ReadFromText``) has no translation; stateful DoFns
  run with no state (``user_state_context=None``); metrics are not
  implemented.

``capabilities(pipeline)`` says, per runner, what may be used; the library's
transforms consult it at construction time (the ordered-user transform's
``state='auto'``, the public-count reader, the pipelines' writers) and
``check_pipeline`` refuses, before a run, a graph that such a runner would
silently mistranslate.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineRunner

from beam_dpsu import warm_workers as _warm

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
#: Short runner names Beam does not resolve itself (``--runner=DaskRunner``).
RUNNER_ALIASES = {"DaskRunner": DASK_RUNNER}


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a runner executes (True: implemented and correct).

    Attributes:
      name: the runner class name.
      user_state: stateful DoFns (``BagState``) with event-time timers.
      ordered_list_state: ``OrderedListState``.
      file_sinks: ``WriteToText`` / ``beam.io.Write`` write what they are given.
      read_primitive: ``beam.io.Read`` (``ReadFromText``) is executed.
      all_leaves: every branch of the graph is computed (not only the last one).
      side_inputs_once: a side input is computed once per run, so every reader
        sees the same value (needed for a fresh run key drawn in the pipeline).
      metrics: ``result.metrics()`` works.
      bundle_outputs: what a DoFn emits in ``finish_bundle`` is kept (the Dask
        runner collects a partition's outputs before calling it: they are lost).
      tagged_outputs: a multi-output ParDo's outputs are kept apart (the Dask
        runner mixes every tagged output into every consumer's input).
      redistributes: ``Reshuffle`` and ``GroupByKey`` spread the work over all
        workers. False on Dask: a dask bag keeps the number of partitions of the
        ``Create`` it starts from (a ``Create`` of fewer than 128 elements is ONE
        partition unless ``--dask_npartitions`` is given, ``Reshuffle`` is an
        identity and ``GroupByKey`` keeps its input's partition count), so a
        read must start from one ``Create`` per partition wanted, joined by
        ``Flatten`` (a concatenation of their partitions): see
        ``textio.ReadUserItems``.
    """
    name: str
    user_state: bool = True
    ordered_list_state: bool = False
    file_sinks: bool = True
    read_primitive: bool = True
    all_leaves: bool = True
    side_inputs_once: bool = True
    metrics: bool = True
    bundle_outputs: bool = True
    tagged_outputs: bool = True
    redistributes: bool = True


#: Runners known not to implement OrderedListState (Beam 2.77): state='ordered_list'
#: is refused there (on other runners without it in the table, 'auto' picks 'bag').
NO_ORDERED_LIST_RUNNERS = ("FlinkRunner", "SparkRunner", "DataflowRunner",
                           "TestDataflowRunner", "DaskRunner")

_DIRECT = dict(user_state=True, ordered_list_state=True)
_TABLE = {
    "DirectRunner": _DIRECT,
    "SwitchingDirectRunner": _DIRECT,
    "FnApiRunner": _DIRECT,
    "FnApiDirectRunner": _DIRECT,
    "BundleBasedDirectRunner": _DIRECT,
    "TestDirectRunner": _DIRECT,
    # OrderedListState: Flink (apache/beam#21358), Spark (#33211) and Dataflow
    # Runner v2 (#20666) do not implement it as of Beam 2.77.
    "FlinkRunner": dict(ordered_list_state=False),
    "SparkRunner": dict(ordered_list_state=False),
    "DataflowRunner": dict(ordered_list_state=False),
    "TestDataflowRunner": dict(ordered_list_state=False),
    "PortableRunner": dict(ordered_list_state=False),
    "PrismRunner": dict(ordered_list_state=False),
    # Verified on Beam 2.77 + dask/distributed 2026.8 (module docstring).
    "DaskRunner": dict(user_state=False, ordered_list_state=False, file_sinks=False,
                       read_primitive=False, all_leaves=False, side_inputs_once=False,
                       metrics=False, bundle_outputs=False, tagged_outputs=False,
                       redistributes=False),
}


def runner_name(pipeline: beam.Pipeline) -> str:
    """The class name of ``pipeline``'s runner ('DirectRunner' when it has none)."""
    runner = getattr(pipeline, "runner", None)
    return type(runner).__name__ if runner is not None else "DirectRunner"


def capabilities(pipeline_or_name: Any) -> Capabilities:
    """The ``Capabilities`` of a pipeline's runner, or of a runner class name.

    An unknown runner is assumed to implement everything except
    ``OrderedListState`` (as the Flink and Dataflow runners).
    """
    name = (pipeline_or_name if isinstance(pipeline_or_name, str)
            else runner_name(pipeline_or_name))
    name = name.rsplit(".", 1)[-1]
    return Capabilities(name, **_TABLE.get(name, dict(ordered_list_state=False)))


#: Runner names that run a pipeline on Beam's FnApiRunner (the DirectRunner's
#: portable path), which deals each stage's input to its ``direct_num_workers``
#: workers: a ``GroupByKey``'s keys in the order they first arrived, key i to
#: worker i mod n (``GroupingBuffer.partition``, Beam 2.77).
_DEALING_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "FnApiRunner", "FnApiDirectRunner",
                    "TestDirectRunner")


def dealt_workers(pipeline: beam.Pipeline) -> int:
    """How many workers ``pipeline``'s runner deals a ``GroupByKey``'s keys to in turn,
    so that a transform with n keys on n workers gives each worker one key; 1 when
    it runs on one worker (``direct_running_mode=in_memory`` runs the parts one
    after the other) or spreads keys otherwise (every other runner: a hash,
    dynamic rebalancing). Only a hint for spreading work: a transform that
    follows it gives the same result on any runner. (Beam's DirectRunner may run a
    graph on Prism instead, see ``FnApiDirectRunner``; the library's command
    lines run it on the FnApiRunner.)"""
    if runner_name(pipeline) not in _DEALING_RUNNERS:
        return 1
    from apache_beam.options.pipeline_options import DirectOptions
    direct = pipeline.options.view_as(DirectOptions)
    if direct.direct_running_mode not in ("multi_threading", "multi_processing"):
        return 1
    n = direct.direct_num_workers
    if n == 0:  # the FnApiRunner's "one per core"
        import multiprocessing
        n = multiprocessing.cpu_count()
    return max(1, n or 1)


# -- the DirectRunner, pinned to the FnApiRunner ----------------------------------

#: ``--runner`` values that mean Beam's DirectRunner (also the default: no ``--runner``),
#: lower case: Beam reads them in any case, with or without "Runner" and a module path.
DIRECT_RUNNER_NAMES = _warm.DIRECT_RUNNER_NAMES


class FnApiDirectRunner(PipelineRunner):
    """Beam's DirectRunner for batch pipelines, always on the FnApiRunner.

    Since Beam 2.68 the DirectRunner (``SwitchingDirectRunner``) first tries to
    run a graph on Prism, a separate runner written in Go, whenever Prism
    supports every transform of it: it downloads the Prism binary for this
    Beam version from GitHub (or uses a cached one) and submits the job to it;
    only when the download or the submission fails does it fall back to the
    FnApiRunner. So the same command ran on Prism on a machine that can reach
    GitHub and on the FnApiRunner on one that cannot. This library is tested,
    benchmarked and documented on the FnApiRunner (``--direct_num_workers``,
    ``--direct_running_mode``, metrics under their own names, the worker
    processes of ``docs/runners.md``); Prism is not verified here (it names
    metrics differently, its support of ``OrderedListState`` is not verified).
    The failed attempt also cost a second translation of the graph and left empty
    temporary directories behind (``beam-temp*``, ``tmp*`` in the system's
    temporary directory) on every run.

    This runner does what the DirectRunner does after that attempt: the
    FnApiRunner, with the pipeline options handed to its workers. The command
    lines use it when ``--runner`` is ``DirectRunner`` or absent
    (``local_runner``); ``--runner=PrismRunner`` still runs on Prism. In a
    batch pipeline of your own: ``beam.Pipeline(runner=FnApiDirectRunner(),
    options=...)``. Batch only: unlike the DirectRunner it does not turn to
    Beam's older bundle-based runner for ``TestStream``, Pub/Sub or real-time
    timers, which the FnApiRunner does not run.

    With ``--direct_running_mode=multi_processing`` its worker processes are
    started when the run starts, while the graph is still being translated,
    rather than when the first stage is ready (``beam_dpsu.warm_workers``);
    the results are the same.

    Args:
      warm_workers: a ``warm_workers.WarmWorkers`` already started for this run
        (the command lines start it before they build the graph); the runner
        then uses it and does not close it. Default None: the runner starts
        and closes its own for a multi-process run.
    """

    def __init__(self, warm_workers=None):
        super().__init__()
        self._warm_workers = warm_workers

    def run_pipeline(self, pipeline, options):
        from apache_beam.portability.api import beam_provision_api_pb2
        from apache_beam.runners.portability.fn_api_runner import fn_runner
        from apache_beam.runners.portability.portable_runner import JobServiceHandle
        encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
        info = fn_runner.ExtendedProvisionInfo(
            beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
        pool, n = self._warm_workers, _warm.pool_size(options)
        if n is None:
            return fn_runner.FnApiRunner(provision_info=info).run_pipeline(pipeline, options)
        own = pool is None
        if own:
            pool = _warm.WarmWorkers(n)
        try:
            return _warm.fn_api_runner(pool, provision_info=info).run_pipeline(
                pipeline, options)
        finally:
            if own:
                pool.close()


def is_direct(options: PipelineOptions) -> bool:
    """Whether ``options`` ask for Beam's DirectRunner (also: no ``--runner``)."""
    name = options.view_as(StandardOptions).runner
    return name is None or name.rsplit(".", 1)[-1].lower() in DIRECT_RUNNER_NAMES


def local_runner(options: PipelineOptions, warm_workers=None) -> Optional[PipelineRunner]:
    """The runner object for ``beam.Pipeline(runner=..., options=options)``:
    ``FnApiDirectRunner(warm_workers)`` when ``options`` ask for the DirectRunner
    (``is_direct``), else None (Beam resolves ``--runner`` itself)."""
    return FnApiDirectRunner(warm_workers) if is_direct(options) else None


def resolve_runner_flag(beam_args: List[str]) -> List[str]:
    """``--runner=DaskRunner`` → the fully qualified class Beam needs; imports its options.

    Beam 2.77 does not know the short name ``DaskRunner``, and its
    ``--dask_*`` options are registered only once the module is imported.
    """
    out = []
    args = list(beam_args)
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--runner" and i + 1 < len(args):
            out += [a, RUNNER_ALIASES.get(args[i + 1], args[i + 1])]
            i += 2
            continue
        if a.startswith("--runner="):
            value = a.split("=", 1)[1]
            a = "--runner=" + RUNNER_ALIASES.get(value, value)
        out.append(a)
        i += 1
    if any(a.endswith(DASK_RUNNER) for a in out) or any(a.startswith("--dask_") for a in out):
        import_dask_options()
    return out


def import_dask_options() -> bool:
    """Registers Beam's ``--dask_*`` options (True), or False when dask is not installed."""
    try:
        import dask.distributed  # noqa: F401
        from apache_beam.runners.dask import dask_runner  # noqa: F401
    except ImportError:
        return False
    return True


# -- writing one file in one step ------------------------------------------------

def _one_key(element):
    return None, element


#: How the temporary file of ``write_one_file`` starts, before the final name's
#: last part: ``beam-temp-NAME-<random hex>`` next to NAME, as the directories of
#: Beam's file sinks (``beam-temp-NAME-...``), which the command lines remove
#: when a run fails.
TEMP_PREFIX = "beam-temp-"


def _write_parts(f, parts) -> None:
    for part in parts:
        f.write((part if isinstance(part, bytes) else str(part).encode("utf-8")) + b"\n")


def write_one_file(path: str, parts) -> None:
    """Writes ``parts`` (bytes or str, each followed by a newline) as the file ``path``,
    which appears whole or not at all.

    The text goes to a temporary file in the same directory
    (``beam-temp-NAME-<random hex>``: ``TEMP_PREFIX``), which is then renamed to
    ``path``: on a local disk a rename within a directory is atomic (and replaces
    a file a retried attempt wrote); an object store shows an object only once it
    is complete. Where a rename does not replace an existing file (HDFS), a
    file a retried attempt left at ``path`` is deleted and the rename tried
    again. When writing or renaming fails, the temporary file is deleted and
    the error raised. Compression follows ``path``'s suffix, as Beam's; the
    type is ``text/plain``, as ``WriteToText``'s.
    """
    import uuid
    from apache_beam.io.filesystem import CompressionTypes
    directory, name = FileSystems.split(path)
    temp = FileSystems.join(directory, f"{TEMP_PREFIX}{name}-{uuid.uuid4().hex}")
    try:
        with FileSystems.create(temp, mime_type="text/plain",
                                compression_type=CompressionTypes.detect_compression_type(
                                    path)) as f:
            _write_parts(f, parts)
        try:
            FileSystems.rename([temp], [path])
        except Exception:
            if not FileSystems.exists(path):
                raise
            FileSystems.delete([path])  # a retried attempt's, which this rename would not replace
            FileSystems.rename([temp], [path])
    except BaseException:
        try:
            if FileSystems.exists(temp):
                FileSystems.delete([temp])
        except Exception:  # noqa: BLE001 (the write's own error is the one to report)
            pass
        raise


class _WriteOneFileDoFn(beam.DoFn):
    """(None, [elements]) → the file ``path`` with ``arrange(elements)``'s lines."""

    def __init__(self, path: str, arrange: Callable[[List[Any]], List[Any]]):
        self._path = path
        self._arrange = arrange

    def process(self, element):
        write_one_file(self._path, self._arrange(list(element[1])))
        yield self._path


class WriteOneFile(beam.PTransform):
    """Writes a whole (small) PCollection as the one file ``path``: a ``GroupByKey``
    under one key, then one ``ParDo`` (``write_one_file``: the file appears whole
    or not at all).

    The command lines write every release this way, on every runner: it is
    three steps where ``ToList`` and ``WriteToText`` take about ten (about 0.2-0.4 s
    of a short run on the DirectRunner), and it works on runners whose file sinks
    do not (``Capabilities.file_sinks``: Dask). An empty PCollection writes no
    file (the command lines then create an empty one, see
    ``beam_dpsu/pipelines/common.py``). Output: the path, once.

    Args:
      path: the file to write (any Beam filesystem).
      arrange: list of all elements → lines (default: as they come). No privacy
        effect by itself; the release writer sorts, so the order reveals nothing.
    """

    def __init__(self, path: str, arrange: Optional[Callable[[List[Any]], List[Any]]] = None,
                 label: Optional[str] = None):
        super().__init__(label)
        self._path = path
        self._arrange = arrange or list

    def expand(self, pcoll):
        return (pcoll
                | "OneKey" >> beam.Map(_one_key)
                | "Collect" >> beam.GroupByKey()
                | "Write" >> beam.ParDo(_WriteOneFileDoFn(self._path, self._arrange)))


# -- checking and finishing a whole graph -------------------------------------------

class _Leaves(beam.pipeline.PipelineVisitor):
    def __init__(self):
        self.leaves = []  # (applied transform, enclosing composites' classes)
        self.stack = []

    def enter_composite_transform(self, node):
        self.stack.append(node)

    def leave_composite_transform(self, node):
        self.stack.pop()

    def visit_transform(self, node):
        self.leaves.append((node, [n.transform for n in self.stack]))


def _is_stateful(dofn) -> bool:
    try:
        from apache_beam.transforms import userstate
        return bool(userstate.get_dofn_specs(dofn)[0] or userstate.get_dofn_specs(dofn)[1])
    except Exception:  # not a DoFn we can inspect
        return False


#: Set on a DoFn instance whose ``finish_bundle`` is known to emit nothing.
NO_BUNDLE_OUTPUT = "_beam_dpsu_no_bundle_output"


def _emits_in_finish_bundle(dofn) -> bool:
    import inspect
    if getattr(dofn, NO_BUNDLE_OUTPUT, False):
        return False
    fb = getattr(type(dofn), "finish_bundle", None)
    return (fb is not None and fb is not beam.DoFn.finish_bundle
            and inspect.isgeneratorfunction(fb))


def per_element_flush(dofn):
    """Marks ``dofn`` (built to flush after every element) as emitting nothing in finish_bundle."""
    setattr(dofn, NO_BUNDLE_OUTPUT, True)
    return dofn


def tag(value, name, envelope: bool):
    """A tagged output: ``TaggedOutput(name, value)``, or ``(name, value)`` in envelope mode."""
    return (name, value) if envelope else beam.pvalue.TaggedOutput(name, value)


def main_output(value, envelope: bool):
    return (None, value) if envelope else value


def _is_tag(element, name):
    return element[0] == name


def _value(element):
    return element[1]


def split_envelopes(pcoll, label: str, names):
    """``(tag or None, value)`` → ``{tag: PCollection}`` (None: the main output)."""
    return {name: (pcoll
                   | f"{label}/Keep{name}" >> beam.Filter(_is_tag, name)
                   | f"{label}/Value{name}" >> beam.Map(_value))
            for name in names}


def check_pipeline(pipeline: beam.Pipeline) -> None:
    """Raises ValueError if ``pipeline`` uses what its runner would silently mistranslate.

    On a runner with every capability this does nothing. On the Dask runner it
    refuses file sinks (``WriteToText``: an empty file), the ``Read`` primitive,
    an ``Impulse`` outside ``Create`` and stateful DoFns. Call it after building
    the graph and before ``run()`` (the command-line pipelines do).
    """
    caps = capabilities(pipeline)
    visitor = _Leaves()
    pipeline.visit(visitor)
    problems = []
    for node, parents in visitor.leaves:
        t = node.transform
        if not caps.file_sinks and any(isinstance(p, beam.io.iobase.Write) for p in parents):
            problems.append(f"{node.full_label}: a file sink (WriteToText/Write) writes an empty "
                            f"file; use beam_dpsu.runners.WriteOneFile")
        elif not caps.read_primitive and isinstance(t, beam.io.iobase.Read):
            problems.append(f"{node.full_label}: the Read primitive is not executed; start "
                            f"from a Create of file names")
        elif (not caps.read_primitive and isinstance(t, beam.Impulse)
              and not (parents and type(parents[-1]) is beam.Create)):
            problems.append(f"{node.full_label}: Impulse outside Create is not executed")
        elif not caps.user_state and isinstance(t, beam.ParDo) and _is_stateful(t.fn):
            problems.append(f"{node.full_label}: a stateful DoFn runs without state")
        elif not caps.tagged_outputs and isinstance(t, beam.ParDo) and len(node.outputs) > 1:
            problems.append(f"{node.full_label}: a multi-output ParDo's outputs are mixed")
        elif (not caps.bundle_outputs and isinstance(t, beam.ParDo)
              and _emits_in_finish_bundle(t.fn)):
            problems.append(f"{node.full_label}: what the DoFn emits in finish_bundle is lost")
    if problems:
        raise ValueError(f"{caps.name} would silently mistranslate this pipeline: "
                         + "; ".join(sorted(set(problems))[:5]))


def _drop(_):
    return False


def join_leaves(pipeline: beam.Pipeline) -> None:
    """On a runner that computes only the last branch, makes every branch an input of it.

    Adds ``Flatten`` of every PCollection that no transform reads, followed by a
    filter that drops everything, as the graph's last step. Does nothing on
    other runners. Call it after building the graph and before ``run()``.
    """
    if capabilities(pipeline).all_leaves:
        return
    visitor = _Leaves()
    pipeline.visit(visitor)
    produced, consumed = [], set()
    for node, _ in visitor.leaves:
        for pc in node.inputs:
            consumed.add(id(pc))
        for si in node.side_inputs:
            consumed.add(id(si.pvalue))
        produced.extend(pc for pc in node.outputs.values()
                        if isinstance(pc, beam.pvalue.PCollection))
    leaves = [pc for pc in produced if id(pc) not in consumed]
    if len(leaves) > 1:
        tuple(leaves) | "JoinLeaves/Flatten" >> beam.Flatten() | "JoinLeaves/Drop" >> beam.Filter(
            _drop)
