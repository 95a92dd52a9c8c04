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
  reads it: a step that draws randomness (the run key, ``transforms/run_key.py``) returns a
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
silently mistranslate. Dask is also told the size of Beam's elements, by the
package's ``dask.sizeof`` entry point (``transforms/_dask_sizeof.py``, apart from
this module so that loading it imports nothing).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, List, Optional

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions


__all__ = ["DASK_RUNNER", "RUNNER_ALIASES", "Capabilities", "NO_ORDERED_LIST_RUNNERS",
           "runner_name", "capabilities", "dealt_workers", "DIRECT_RUNNER_NAMES", "LOCAL_RUNNER",
           "is_direct", "runner_name_of", "pipeline_options", "resolve_runner_flag",
           "import_dask_options", "NO_BUNDLE_OUTPUT", "per_element_flush", "tag", "main_output",
           "split_envelopes", "WithList", "check_pipeline", "check_input", "join_leaves",
           "DASK_PARTITIONS_PER_THREAD", "read_partitions", "EngineNotSetUp",
           "ENGINES_DIR_VARIABLE", "FLINK_VERSION", "FLINK_DISTRIBUTION", "engines_dir",
           "prism_binary", "job_server_artifact", "job_server_dir", "job_server_jar",
           "flink_home", "find_engine", "DASK_STOP_TIMEOUT", "cancel_run"]


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
      memory_shuffle: a shuffle's data stays in worker memory until it is read
        (the DirectRunner's ``GroupByKey``; on Dask, every ``ParDo`` task's outputs
        are kept alive by the task graph, beyond the reach of Dask's spilling), so
        large shuffles are staged through files (``transforms.staging``). False
        where the runner's shuffle spills or streams (Dataflow, Flink, Spark).
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
    memory_shuffle: bool = False


#: Runners known not to implement OrderedListState (Beam 2.77): state='ordered_list'
#: is refused there (on other runners without it in the table, 'auto' picks 'bag').
NO_ORDERED_LIST_RUNNERS = ("FlinkRunner", "SparkRunner", "DataflowRunner",
                           "TestDataflowRunner", "DaskRunner", "PrismRunner")

_DIRECT = dict(user_state=True, ordered_list_state=True, memory_shuffle=True)
_TABLE = {
    "DirectRunner": _DIRECT,
    "SwitchingDirectRunner": _DIRECT,
    "FnApiRunner": _DIRECT,
    "BundleBasedDirectRunner": _DIRECT,
    "TestDirectRunner": _DIRECT,
    # Observed on Flink 1.19 and Spark 3.5 (Beam's runners 2.70 with the 2.77 Python SDK,
    # tests/test_engines.py::test_what_each_engine_executes): every capability but
    # OrderedListState, which fails on both ("IllegalStateException": their state
    # handlers have none for its key type; apache/beam#21358, #33211); Spark reports
    # attempted metrics only (committed is None). Their shuffles are their own.
    "FlinkRunner": dict(ordered_list_state=False),
    "SparkRunner": dict(ordered_list_state=False),
    # Dataflow Runner v2 has no OrderedListState either (#20666), as of Beam 2.77.
    "DataflowRunner": dict(ordered_list_state=False),
    "TestDataflowRunner": dict(ordered_list_state=False),
    "PortableRunner": dict(ordered_list_state=False),
    # Observed on Prism 2.77 (tests/test_engines.py::test_what_prism_executes): every
    # capability; OrderedListState runs with a string coder but not with the ordered
    # transform's tuple coder ("unknown coder used for ordered list state"); a shuffle
    # stays in the Prism process's memory (1.0 GB at 1M users, 52 MB staged:
    # benchmarks/RESULTS.md section 5), so shuffles are staged through files.
    "PrismRunner": dict(ordered_list_state=False, memory_shuffle=True),
    # Verified on Beam 2.77 + dask/distributed 2026.8 (module docstring).
    "DaskRunner": dict(user_state=False, ordered_list_state=False, file_sinks=False,
                       read_primitive=False, all_leaves=False, side_inputs_once=False,
                       metrics=False, bundle_outputs=False, tagged_outputs=False,
                       redistributes=False, memory_shuffle=True),
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
_DEALING_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "FnApiRunner", "TestDirectRunner")


def dealt_workers(pipeline: beam.Pipeline) -> int:
    """How many workers ``pipeline``'s runner deals a ``GroupByKey``'s keys to in turn,
    so that a transform with n keys on n workers gives each worker one key; 1 when
    it runs on one worker (``direct_running_mode=in_memory`` runs the parts one
    after the other) or spreads keys otherwise (every other runner: a hash,
    dynamic rebalancing). Only a hint for spreading work: a transform that
    follows it gives the same result on any runner. (Beam's DirectRunner may run a
    graph on Prism instead, see ``LOCAL_RUNNER``.)"""
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


#: On Dask, the input files are dealt into this many partitions per worker thread of
#: the cluster (``read_partitions``): two, so that a worker that got more than its
#: share of the first tasks (dask places them by where their inputs are) has
#: another's to give away (measured: with one per thread, a run once had both read
#: tasks on one of two workers and took 1.2× as long).
DASK_PARTITIONS_PER_THREAD = 2

#: Beam's Dask runner (2.77) makes a ``Create`` of at most this many elements one dask
#: partition (its default ``partition_size``, without ``--dask_npartitions`` or
#: ``--dask_partition_size``).
_DASK_CREATE_PARTITION_SIZE = 128

#: How long ``read_partitions`` waits for the scheduler's answer when
#: ``--dask_connection_timeout`` is not given (distributed's own default is 30 s, and
#: Beam's runner connects again when the run starts).
_DASK_ASK_TIMEOUT = "10s"


def read_partitions(pipeline: beam.Pipeline, files: int, most: int) -> int:
    """Into how many ``Create``s a read of ``files`` input files, matched in the
    launcher, is dealt on a runner whose parallelism is the number of partitions a
    read starts from (``Capabilities.redistributes`` False: Dask). At most ``files``
    and ``most``, at least 1.

    On Dask, by default: ``DASK_PARTITIONS_PER_THREAD`` per worker thread of the
    cluster (asked of its scheduler, for at most ``--dask_connection_timeout`` or 10
    s; this machine's cores when no cluster is named, as Beam's runner then starts a
    local one), and at least one per 128 files (a larger ``Create`` would be split
    by the runner), so that each thread reads about the same bytes and every later
    stage has that many partitions. Every ``GroupByKey`` after the read is a dask
    task shuffle of about N² tasks for N partitions, each costing a few milliseconds
    of scheduler and worker CPU whatever its data, so one partition per file (16
    files: about 2,200 tasks in a run) costs more than it spreads. The threads are
    counted once, when the graph is built: a cluster that adds workers later (an
    adaptive one) does not get more partitions. With ``--dask_npartitions`` or
    ``--dask_partition_size``, which Beam's Dask runner applies to every ``Create``:
    1 (one ``Create`` of every file, which dask splits as those options say). When
    the scheduler cannot be asked (not reachable, no worker yet, a scheduler file
    that does not exist yet): one per file, with a warning.
    """
    cap = max(1, min(files, most))
    if cap == 1 or runner_name(pipeline) != "DaskRunner" or not import_dask_options():
        return cap
    from apache_beam.runners.dask.dask_runner import DaskOptions
    options = pipeline.options.view_as(DaskOptions)
    if options.npartitions or options.partition_size:
        return 1
    threads = _dask_threads(options)
    if not threads:
        return cap
    least = -(-files // _DASK_CREATE_PARTITION_SIZE)
    return min(cap, max(threads * DASK_PARTITIONS_PER_THREAD, least))


def _dask_threads(options) -> Optional[int]:
    """The worker threads of the Dask cluster that ``options`` (``DaskOptions``) name,
    or that dask's configuration names (``scheduler-address``), asked of its
    scheduler; this machine's cores when none is named (Beam's runner then starts a
    ``LocalCluster`` of that many threads); None, with a warning, if the scheduler
    does not answer or has no worker yet."""
    import dask
    address = options.address or (None if options.scheduler_file
                                   else dask.config.get("scheduler-address", None))
    if not address and not options.scheduler_file:
        from dask.system import CPU_COUNT
        return CPU_COUNT
    if not address and not os.path.exists(options.scheduler_file):
        # distributed would wait for the file with no time limit
        _warn_unasked(f"no scheduler file {options.scheduler_file!r} yet")
        return None
    from distributed import Client
    given = dict(address=address, scheduler_file=None if address else options.scheduler_file,
                 timeout=options.timeout or _DASK_ASK_TIMEOUT)
    try:
        with Client(**{k: v for k, v in given.items() if v is not None},
                    set_as_default=False) as client:
            threads = sum(client.nthreads().values())
    except Exception as e:  # not reachable now: Beam's runner reports it when the run starts
        _warn_unasked(f"{type(e).__name__}: {e}")
        return None
    if not threads:
        _warn_unasked("the cluster has no worker yet")
    return threads or None


def _warn_unasked(why: str) -> None:
    logging.getLogger(__name__).warning(
        "could not count the Dask cluster's worker threads (%s): the input files are "
        "read in one dask partition each", why)


# -- local runs: the DirectRunner on Beam's FnApiRunner ----------------------------

#: ``--runner`` values that mean Beam's DirectRunner (also the default: no ``--runner``),
#: lower case: Beam reads them in any case, with or without "Runner" and a module path.
DIRECT_RUNNER_NAMES = ("direct", "directrunner", "switchingdirect", "switchingdirectrunner")

#: What a local run asks for instead of the DirectRunner: Beam's FnApiRunner, by a
#: name that Beam's ``StandardOptions.ALL_KNOWN_RUNNERS`` lists. Since Beam 2.68 the
#: DirectRunner first tries to run a graph on Prism (a separate runner written in
#: Go, which it downloads where it can and which leaves temporary directories), and
#: falls back to the FnApiRunner only when that fails: the same command would run
#: on different runners on different machines. The library is tested on the
#: FnApiRunner; ``--runner=PrismRunner`` still runs Prism (``docs/runners.md``).
LOCAL_RUNNER = "FnApiRunner"


def is_direct(options: PipelineOptions) -> bool:
    """Whether ``options`` ask for Beam's DirectRunner (also: no ``--runner``)."""
    name = options.view_as(StandardOptions).runner
    return name is None or name.rsplit(".", 1)[-1].lower() in DIRECT_RUNNER_NAMES


def runner_name_of(options: PipelineOptions) -> str:
    """The class name of the runner ``options`` ask for ('DirectRunner' when none)."""
    return (options.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1]


def pipeline_options(beam_args: List[str]) -> PipelineOptions:
    """The ``PipelineOptions`` of a command line's Beam flags: short runner names
    resolved (``resolve_runner_flag``), the DirectRunner (or no ``--runner``) run as
    ``LOCAL_RUNNER``, and the engine the project set up found (``find_engine``).
    Every other flag is Beam's, unchanged."""
    options = PipelineOptions(resolve_runner_flag(list(beam_args)))
    if is_direct(options):
        options.view_as(StandardOptions).runner = LOCAL_RUNNER
    find_engine(options, beam_args)
    return options


# -- engines the project sets up (``beam-dpsu setup-engines``, docs/runners.md) --------

class EngineNotSetUp(ValueError):
    """A runner's engine (Prism's binary, a job server jar, Java) is missing: one line
    naming the set-up command; exit status 2 on the command line."""

    exit_status = 2


#: The environment variable that moves the engines' folder (default
#: ``~/.cache/beam_dpsu/engines``).
ENGINES_DIR_VARIABLE = "BEAM_DPSU_ENGINES_DIR"
#: The Flink version whose runner the library sets up and asks for when ``--flink_version``
#: is not given: 1.19, the newest Flink whose Beam runner Maven Central serves to the
#: machines the library is verified on (docs/runners.md). Beam's own default is newer.
FLINK_VERSION = "1.19"
#: The Flink distribution (PyPI's ``apache-flink-libraries``) the set-up unpacks for a
#: local session cluster (``beam-dpsu flink-cluster``).
FLINK_DISTRIBUTION = "1.19.3"


def engines_dir() -> str:
    """The folder ``beam-dpsu setup-engines`` puts engines in (``$BEAM_DPSU_ENGINES_DIR``,
    default ``~/.cache/beam_dpsu/engines``). Not Beam's own caches: a Prism binary there
    would make every DirectRunner pipeline of the machine run on Prism instead."""
    return os.path.expanduser(os.environ.get(ENGINES_DIR_VARIABLE) or "~/.cache/beam_dpsu/engines")


def prism_binary() -> str:
    """Where the set-up puts Prism, built for the installed Beam's version."""
    return os.path.join(engines_dir(), f"prism-v{beam.__version__}")


def job_server_artifact(engine: str, flink_version: str = FLINK_VERSION) -> str:
    """The Maven coordinates of Beam's job server for ``engine`` ('flink' or 'spark')
    at the installed Beam's version (the set-up's first choice)."""
    name = (f"beam-runners-flink-{flink_version}-job-server" if engine == "flink"
            else "beam-runners-spark-3-job-server")
    return f"org.apache.beam:{name}:{beam.__version__}"


def job_server_dir(engine: str, flink_version: str = FLINK_VERSION) -> str:
    """The folder the set-up puts ``engine``'s job server in, for the installed Beam."""
    name = f"flink-{flink_version}" if engine == "flink" else "spark-3"
    return os.path.join(engines_dir(), f"{name}-job-server-for-beam-{beam.__version__}")


def job_server_jar(engine: str, flink_version: str = FLINK_VERSION) -> str:
    """The jar Beam's ``FlinkRunner`` (``SparkRunner``) starts with ``java -jar``: Beam's
    job server jar of the installed version where Maven Central serves it, else a
    jar that names the runner's classpath in its manifest (``setup-engines``)."""
    return os.path.join(job_server_dir(engine, flink_version), "job-server.jar")


def flink_home() -> str:
    """The Flink distribution the set-up unpacks (``lib/``, ``bin/``), for a session cluster."""
    return os.path.join(engines_dir(), f"flink-{FLINK_DISTRIBUTION}")


def _gives(options: PipelineOptions, beam_args: Optional[List[str]], name: str) -> bool:
    """Whether option ``name`` was given: in ``beam_args`` when known (also a value equal
    to Beam's default), else a value other than the default."""
    if beam_args is not None:
        return any(a == f"--{name}" or a.startswith(f"--{name}=") for a in beam_args)
    return name in options.get_all_options(drop_default=True, retain_unknown_options=False)


def find_engine(options: PipelineOptions, beam_args: Optional[List[str]] = None) -> None:
    """Points a Prism, Flink or Spark run at the engine ``setup-engines`` prepared, or
    raises ``EngineNotSetUp`` naming the set-up command (never a download at run time:
    Beam would try GitHub or Maven Central from inside the run). Flags the user gave
    (``--prism_location``, ``--flink_job_server_jar``, ``--spark_job_server_jar``,
    ``--flink_version``, ``--job_endpoint`` of a running job server) win. On Flink,
    ``--flink_version`` defaults to ``FLINK_VERSION`` (the runner that was set up);
    ``beam_args``, the flags ``options`` were made of, tell whether it was given."""
    from apache_beam.options.pipeline_options import (FlinkRunnerOptions, PortableOptions,
                                                      PrismRunnerOptions, SparkRunnerOptions)
    runner = runner_name_of(options)
    if runner == "PrismRunner":
        prism = options.view_as(PrismRunnerOptions)
        if not prism.prism_location:
            if not os.path.isfile(prism_binary()):
                raise EngineNotSetUp(
                    f"PrismRunner needs Prism {beam.__version__}, which is not set up: run "
                    f"`beam-dpsu setup-engines prism` (builds it with Go), or pass "
                    f"--prism_location=PATH")
            prism.prism_location = prism_binary()
        return
    if runner not in ("FlinkRunner", "SparkRunner"):
        return
    engine = runner[:-len("Runner")].lower()
    view = options.view_as(FlinkRunnerOptions if engine == "flink" else SparkRunnerOptions)
    if engine == "flink" and not _gives(options, beam_args, "flink_version"):
        view.flink_version = FLINK_VERSION
    if options.view_as(PortableOptions).job_endpoint:
        return  # a job server that runs already: nothing to start
    attribute = f"{engine}_job_server_jar"
    if not getattr(view, attribute):
        version = getattr(view, "flink_version", FLINK_VERSION)
        jar = job_server_jar(engine, version)
        if not os.path.isfile(jar):
            raise EngineNotSetUp(
                f"{runner} needs Beam's {engine.capitalize()} job server"
                f"{' for Flink ' + version if engine == 'flink' else ''}, which is not set up: "
                f"run `beam-dpsu setup-engines {engine}` (Maven), or pass --{attribute}=PATH")
        setattr(view, attribute, jar)
    import shutil
    if shutil.which("java") is None:
        raise EngineNotSetUp(f"{runner} needs Java 17 on the PATH to start Beam's job server")


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


def _with_list(element, fn, items):
    return fn(element[0], element[1], items)


def _to_every_key(element, keys: int):
    items = list(element[1])
    for k in range(keys):
        yield k, (True, items)


def _mark(element):
    return element[0], (False, element[1])


def _meet(element, fn):
    key, members = element
    items, values = [], []
    for is_list, value in members:
        if is_list:
            items.extend(value)
        else:
            values.append(value)
    for value in values:
        yield from fn(key, value, items)


class WithList(beam.PTransform):
    """``(key, value)`` elements, keys in ``range(keys)``, and a PCollection ``items`` →
    what ``fn(key, value, [every element of items])`` yields, for each element.

    Where the runner computes a side input once per run, the list is a side input
    (``AsList``). Elsewhere (Beam's Dask runner re-evaluates a side input in every
    task) the items are gathered into one list, sent to each of the ``keys`` keys
    and meet the elements in one ``GroupByKey``. Either way ``fn`` sees the whole
    list; the list's order is unspecified. ``fn`` must be picklable.
    """

    def __init__(self, items, keys: int, fn, label: Optional[str] = None):
        super().__init__(label)
        self._items, self._keys, self._fn = items, keys, fn

    def expand(self, pcoll):
        if capabilities(pcoll.pipeline).side_inputs_once:
            return pcoll | "Apply" >> beam.FlatMap(_with_list, self._fn,
                                                   beam.pvalue.AsList(self._items))
        lists = (self._items
                 | "OneKey" >> beam.Map(lambda item: (None, item))
                 | "Gather" >> beam.GroupByKey()
                 | "ToEveryKey" >> beam.FlatMap(_to_every_key, self._keys))
        return ((pcoll | "Mark" >> beam.Map(_mark), lists)
                | "Together" >> beam.Flatten()
                | "PerKey" >> beam.GroupByKey()
                | "Apply" >> beam.FlatMap(_meet, self._fn))


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
                            f"file; use beam_dpsu.transforms.write.WriteRelease (or WriteOneFile)")
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


def check_input(pcoll, transform: str) -> None:
    """Raises ValueError, one line, where ``pcoll`` comes from a read the runner does
    not execute (Beam's ``ReadFromText``, any ``Read`` or ``Impulse`` outside
    ``Create`` on the Dask runner), naming what to use instead.

    ``SelectPartitions``, ``TopK`` and the peeling transforms call it when they
    expand, so a user's pipeline is refused while it is built, not with a traceback
    from inside Beam when it runs. ``transform``: the caller's name, for the message.
    Nothing is checked on a runner that executes every read.
    """
    pcolls = pcoll if isinstance(pcoll, (tuple, list)) else [pcoll]
    caps = capabilities(pcolls[0].pipeline)
    if caps.read_primitive:
        return
    stack = [pc.producer for pc in pcolls if getattr(pc, "producer", None) is not None]
    seen = set()
    while stack:
        applied = stack.pop()
        if id(applied) in seen:
            continue
        seen.add(id(applied))
        t = applied.transform
        parent = applied.parent.transform if applied.parent is not None else None
        if isinstance(t, beam.io.iobase.Read) or (isinstance(t, beam.Impulse)
                                                  and type(parent) is not beam.Create):
            raise ValueError(
                f"{transform} cannot run on {caps.name} after {applied.full_label}: that "
                f"runner does not execute Beam's reads (ReadFromText); read the "
                f"user<TAB>item files with beam_dpsu.transforms.columnar.SelectFromText (or "
                f"textio.ReadUserItems) instead")
        for pc in list(applied.inputs) + [si.pvalue for si in applied.side_inputs]:
            if getattr(pc, "producer", None) is not None:
                stack.append(pc.producer)


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


# -- stopping a run the launcher gave up on -----------------------------------------

#: How long ``cancel_run`` waits, at most, for the tasks of a cancelled Dask run that
#: were already running to end (a worker thread cannot be interrupted).
DASK_STOP_TIMEOUT = 300.0


def _dask_probes():
    """The functions ``cancel_run`` runs on a Dask scheduler and its workers, made here so
    that they travel by value (a scheduler need not have this package installed):
    the keys of some tasks and every task they depend on; how many of some keys the
    scheduler still runs or will run; how many a worker's threads run (``cancelled``:
    released by the scheduler while running, its thread goes on to the task's end)."""
    def graph_keys(roots, dask_scheduler=None):
        tasks, seen, stack = dask_scheduler.tasks, set(), list(roots)
        while stack:
            key = stack.pop()
            if key in seen or key not in tasks:
                continue
            seen.add(key)
            stack.extend(dep.key for dep in tasks[key].dependencies)
        return list(seen)

    def scheduled(keys, dask_scheduler=None):
        tasks = dask_scheduler.tasks
        return sum(1 for k in keys if k in tasks and tasks[k].state in (
            "processing", "waiting", "queued", "no-worker"))

    def running_here(keys, dask_worker=None):
        keys = set(keys)
        return sum(1 for ts in list(dask_worker.state.tasks.values()) if ts.key in keys
                   and ts.state in ("executing", "long-running", "cancelled", "resumed"))
    return graph_keys, scheduled, running_here


def cancel_run(result, timeout: float = DASK_STOP_TIMEOUT) -> bool:
    """Stops a run whose launcher failed or was interrupted while waiting for it, before
    the launcher removes the run's files: a job left running could write them again
    (a release file, counts, staged data) after that clean-up.

    Calls Beam's ``PipelineResult.cancel()`` (a runner that cannot cancel, or a job
    already over, is left as it is). On Beam's Dask runner, whose result's
    ``cancel()`` cancels the run's futures (``Client.cancel``): no task of the run
    starts after that, but a task already running in a worker thread runs to its end
    (Dask cannot interrupt it), so this then waits, at most ``timeout`` seconds, until
    the scheduler runs none of the run's tasks and no worker thread runs one. Returns
    False (with a warning) when that wait ran out, True otherwise.
    """
    client = getattr(result, "client", None)
    keys: list = []
    if client is not None and import_dask_options():  # the run's tasks, while still known
        try:
            from distributed import futures_of
            roots = [f.key for f in futures_of(result.futures)]
            keys = client.run_on_scheduler(_dask_probes()[0], roots)
        except Exception as e:  # noqa: BLE001 (the scheduler is gone: nothing to wait for)
            logging.getLogger(__name__).debug("the run's tasks are not known: %s", e)
    try:
        result.cancel()
    except Exception as e:  # noqa: BLE001 (no cancel on this runner, or the job is over)
        logging.getLogger(__name__).debug("the run was not cancelled: %s", e)
    if not keys:
        return True
    import time
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, scheduled, running_here = _dask_probes()
            busy = (client.run_on_scheduler(scheduled, keys)
                    + sum(client.run(running_here, keys).values()))
        except Exception:  # noqa: BLE001 (the cluster is gone: nothing runs there)
            return True
        if not busy:
            return True
        if time.monotonic() > deadline:
            logging.getLogger(__name__).warning(
                "%d task(s) of the failed run still run on the Dask cluster after %.0f s: "
                "files they write after this are not removed", busy, timeout)
            return False
        time.sleep(0.1)
