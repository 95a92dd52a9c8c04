"""Every family on the engines the project sets up (``beam-dpsu setup-engines``).

Prism (Beam's portable runner in Go, built from the Go module proxy), Flink 1.19 and
Spark 3 (Beam's job servers, from Maven Central) each run the mechanisms from the
command line and embedded in a user's pipeline; each release must equal the
FnApiRunner's under the same test seed. Prism runs every registered mechanism from the
command line; Flink and Spark one of each family (``FAMILIES``: their runs cost a job
start each), and all of them in one embedded pipeline. One job server per Java engine
serves the session (``job_endpoints``); one run per engine starts its own, as a user's
command does. On CI (``CI`` set) an engine that is not set up is a failure, not a skip:
``.ci/run`` sets them up beside the tests, which wait for it (``tests/conftest.py``).
"""
import glob
import json
import os
import socket
import subprocess
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.coders import BytesCoder, StrUtf8Coder, TupleCoder
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import FlinkRunnerOptions, SparkRunnerOptions
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (BagStateSpec, OrderedListStateSpec, TimerSpec,
                                              on_timer)
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.mechanisms.registry import REGISTRY, make_mechanism
from beam_dpsu.pipelines import hitting_set, select_partitions, top_k
from beam_dpsu.transforms import ordered, runners

from tests.test_runners import (CASES, FAMILIES, FLAGS, data, reference,  # noqa: F401
                                run)

pytestmark = [pytest.mark.engines, pytest.mark.subprocess]

ENGINE_FLAGS = {
    "prism": ["--runner=PrismRunner"],
    "flink": ["--runner=FlinkRunner", "--flink_master=[local]"],
    "spark": ["--runner=SparkRunner"],
}

def _set_up(engine):
    if engine == "prism":
        return os.path.isfile(runners.prism_binary())
    return os.path.isfile(runners.job_server_jar(engine))


def _engine_param(engine):
    if _set_up(engine) or os.environ.get("CI") or os.environ.get("BEAM_DPSU_ENGINES_PENDING"):
        return pytest.param(engine, marks=pytest.mark.xdist_group(engine))
        # (on CI a missing engine fails the test; .ci/run sets every engine up beside the
        # tests, which wait for it: tests/conftest.py)
    return pytest.param(engine, marks=pytest.mark.skip(
        reason=f"{engine} is not set up (beam-dpsu setup-engines {engine})"))


ENGINES = [_engine_param(e) for e in ENGINE_FLAGS]
JAVA_ENGINES = ENGINES[1:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, log: str, timeout: float = 120.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}: " + open(log).read()[-2000:])
        try:
            with socket.create_connection(("localhost", port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


#: The JVM options of the suite's own JVMs (its job servers, its Flink cluster): the JIT's
#: C1 compiler alone. A job of a few seconds spends most of its JVM time compiling (five
#: Flink jobs on 600 users, measured: the job server's CPU 31 s with Java's default, 17 s
#: with C1 alone; Spark 30 s and 14 s). A run with no job endpoint starts Beam's job
#: server as a user's does, with Java's default.
SUITE_JVM = ["-XX:TieredStopAtLevel=1"]

#: How the session's job server of each Java engine is started (its master: in-process).
JOB_SERVER_MASTERS = {"flink": ["--flink-master=[local]"], "spark": ["--spark-master-url=local[2]"]}


def start_job_server(engine: str, folder, master=None) -> tuple:
    """Starts the job server ``setup-engines`` made for ``engine`` on free localhost ports
    (artifacts and log in ``folder``; ``master``: its master flags, default in-process);
    returns (process, job endpoint) once it listens."""
    ports = [free_port() for _ in range(3)]
    log = os.path.join(folder, "job-server.log")
    with open(log, "w") as out:
        proc = subprocess.Popen(["java"] + SUITE_JVM + ["-jar", runners.job_server_jar(engine)]
                                + (master or JOB_SERVER_MASTERS[engine])
                                + [f"--job-port={ports[0]}", f"--artifact-port={ports[1]}",
                                   f"--expansion-port={ports[2]}",
                                   f"--artifacts-dir={os.path.join(folder, 'artifacts')}"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_port(ports[0], proc, log)
    except Exception:
        proc.kill()
        raise
    return proc, f"localhost:{ports[0]}"


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def job_endpoints(tmp_path_factory):
    """One job server per Java engine for the session (started when a test first asks for
    it, stopped at the end): each run then costs a job, not a JVM's start."""
    started = {}

    def endpoint(engine):
        if engine not in started:
            if not _set_up(engine):
                pytest.fail(f"{engine} is not set up: run `beam-dpsu setup-engines {engine}`")
            started[engine] = start_job_server(
                engine, str(tmp_path_factory.mktemp(f"{engine}-job-server")))
        return started[engine][1]
    yield endpoint
    for proc, _ in started.values():
        stop(proc)


@pytest.fixture
def flags(request, engine):
    """The engine's runner flags; on Flink and Spark, with the session's job server."""
    if engine == "prism":
        return ENGINE_FLAGS[engine]
    return ENGINE_FLAGS[engine] + [
        f"--job_endpoint={request.getfixturevalue('job_endpoints')(engine)}"]


@pytest.fixture
def fnapi(reference):
    """The FnApiRunner's release of each mechanism under the test key, computed once per
    session (``test_runners.reference``)."""
    return reference


@pytest.mark.parametrize("name, engine", [
    pytest.param(name, e.values[0], marks=e.marks, id=f"{name}-{e.values[0]}")
    for e in ENGINES for name in (CASES if e.values[0] == "prism" else
                                  [f for f in FAMILIES if f != "weighted-gaussian"])])
def test_every_mechanism_releases_the_fnapi_runners_set(data, fnapi, name, engine, flags,
                                                        tmp_path):
    direct, items = fnapi(name)
    assert items
    summary, other = run(data, name, flags, str(tmp_path / engine))
    assert other == items
    assert summary["threshold"] == direct["threshold"]
    assert summary["PRIVATE_run_details"]["num_users"] == 600


@pytest.mark.parametrize("engine", JAVA_ENGINES)
def test_the_command_line_with_no_other_flag(data, fnapi, engine, tmp_path):
    # The installed command: --runner=FlinkRunner --flink_master=[local] (--runner=SparkRunner)
    # alone starts the job server setup-engines made (Flink 1.19) and releases the
    # FnApiRunner's set.
    if engine == "flink":
        options = runners.pipeline_options(ENGINE_FLAGS["flink"]).view_as(FlinkRunnerOptions)
        assert options.flink_version == runners.FLINK_VERSION
        assert options.flink_job_server_jar == runners.job_server_jar("flink")
        # a version the user gives wins, even Beam's default (no job server of it was set up)
        with pytest.raises(runners.EngineNotSetUp, match="for Flink 2.2"):
            runners.pipeline_options(ENGINE_FLAGS["flink"] + ["--flink_version=2.2"])
    else:
        options = runners.pipeline_options(ENGINE_FLAGS["spark"]).view_as(SparkRunnerOptions)
        assert options.spark_job_server_jar == runners.job_server_jar("spark")
    path, _ = data
    out = str(tmp_path / "out")
    done = subprocess.run([sys.executable, "-m", "beam_dpsu.pipelines.cli", "select",
                           "--input", path, "--output", out, "--mechanism", "weighted-gaussian",
                           "--insecure-test-seed", "17"] + FLAGS["weighted-gaussian"]
                          + ENGINE_FLAGS[engine], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with open(out + "-items-00000-of-00001", encoding="utf-8") as fh:
        assert fh.read().splitlines() == fnapi("weighted-gaussian")[1]


def _rows(prefix):
    lines = []
    for f in sorted(glob.glob(prefix + "-items-*")):
        lines += open(f, encoding="utf-8").read().splitlines()
    return lines


#: The top-k and hitting-set commands run on every engine. On Flink and Spark the budget
#: plan's top-k (limited-domain, without counts) stands for the first.
TOP_K_COMMANDS = ["top-k limited-domain", "top-k limited-domain counts", "top-k discover-peel",
                  "hitting-set"]


@pytest.mark.parametrize("command, engine", [
    pytest.param(c, e.values[0], marks=e.marks, id=f"{c}-{e.values[0]}")
    for e in ENGINES for c in (TOP_K_COMMANDS if e.values[0] == "prism" else TOP_K_COMMANDS[1:])])
def test_top_k_and_the_hitting_set(data, engine, command, flags, tmp_path):
    path, _ = data
    common = ["--input", path, "--k", "5", "--epsilon", "2", "--delta", "1e-6",
              "--max-items-per-user", "10", "--insecure-test-seed", "4"]
    main = hitting_set.run if command == "hitting-set" else top_k.run
    if command.startswith("top-k"):
        common += ["--method", command.split()[1]]
        common += ["--k-bar", "8"] if "limited" in command else []
        if command.endswith("counts"):
            common += ["--with-counts"]
    main(common + ["--output", str(tmp_path / "d"), "--runner=DirectRunner"])
    main(common + ["--output", str(tmp_path / "e")] + flags)
    want = _rows(str(tmp_path / "d"))
    assert want and _rows(str(tmp_path / "e")) == want


@pytest.mark.parametrize("engine", ENGINES)
def test_a_budget_plan(data, engine, flags, tmp_path):
    path, _ = data
    common = ["--input", path, "--mechanism", "weighted-gaussian", "--max-items-per-user", "4",
              "--budget-epsilon", "8", "--budget-delta", "1e-5", "--top-k", "3",
              "--share", "top-k=0.25", "--insecure-test-seed", "11", "--quiet"]
    outs = {}
    for label, runner in (("d", ["--runner=DirectRunner"]), ("e", flags)):
        assert select_partitions.main(common + ["--output", str(tmp_path / label)] + runner) == 0
        with open(str(tmp_path / label) + ".json", encoding="utf-8") as fh:
            summary = json.load(fh)
        top = sorted(glob.glob(str(tmp_path / label) + "-top-k-*"))
        outs[label] = (_rows(str(tmp_path / label)), [open(f).read() for f in top],
                       summary["top_k"]["num_released"], summary["epsilon"], summary["delta"])
    assert outs["d"][0] and outs["d"][1] and outs["e"] == outs["d"]


#: The (user, item) pairs of the embedded pipelines: 400 users of 1 to 6 items out of 60.
EMBEDDED_PAIRS = [(f"u{u}", f"i{(u * 7 + j * j) % 60}") for u in range(400)
                  for j in range(u % 6 + 1)]


def _embedded(options, folder, pairs, public, names=FAMILIES):
    """A user's own pipeline: ``SelectPartitions`` of each mechanism of ``names`` (default:
    one of each family) on (user, item) pairs, each release written with the library's
    one-file writer; returns {name: release lines} and the ordered transform's resolved
    state."""
    from beam_dpsu.transforms.select import SelectPartitions
    from beam_dpsu.transforms.write import WriteRelease
    key = RunKey.from_test_seed(5)
    os.makedirs(folder)
    p = beam.Pipeline(options=options)
    source = p | beam.Create(pairs)
    for name in names:
        params = dict(epsilon=2.0, delta=1e-5)
        if name not in ("gw", "gw-kt"):
            params["max_items"] = 5
        if name == "gw-kt":  # a fixed front: the calibrated one needs the command line's count
            params.update(public_counts=public, kt_selection="prefix")
        (source | f"Select-{name}" >> SelectPartitions(make_mechanism(name, **params), run_key=key)
         | f"Write-{name}" >> WriteRelease(os.path.join(folder, name)))
    state = ordered.resolve_state("auto", p)
    p.run().wait_until_finish()
    return {name: open(os.path.join(folder, name), encoding="utf-8").read().splitlines()
            for name in names}, state


@pytest.mark.parametrize("engine", ENGINES)
def test_embedded_in_a_users_pipeline(data, engine, flags, tmp_path):
    # runners.pipeline_options finds the engine; every family in one pipeline (one job)
    assert set(FAMILIES) <= set(REGISTRY)
    pairs = EMBEDDED_PAIRS
    want, direct_state = _embedded(runners.pipeline_options(["--runner=DirectRunner"]),
                                   str(tmp_path / "d"), pairs, data[1])
    got, state = _embedded(runners.pipeline_options(flags), str(tmp_path / "e"), pairs, data[1])
    assert all(want.values()) and got == want
    # the sequential policies ran on the runner's own state (not the GroupByKey fallback)
    assert direct_state == "ordered_list" and state == "bag"


def test_a_missing_engine_is_one_line_naming_the_set_up(tmp_path):
    env = {**os.environ, runners.ENGINES_DIR_VARIABLE: str(tmp_path / "none")}
    data_file = tmp_path / "d.tsv"
    data_file.write_text("u1\ta\n")
    for runner, fragment in (("PrismRunner", "setup-engines prism"),
                             ("FlinkRunner", "setup-engines flink"),
                             ("SparkRunner", "setup-engines spark")):
        done = subprocess.run([sys.executable, "-m", "beam_dpsu.pipelines.cli", "select",
                               "--input", str(data_file), "--output", str(tmp_path / "o"),
                               "--mechanism", "weighted-gaussian", "--epsilon", "1",
                               "--delta", "1e-6", f"--runner={runner}"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 2, done.stderr
        lines = [ln for ln in done.stderr.splitlines() if "error" in ln]
        assert len(lines) == 1 and fragment in lines[0], done.stderr
        assert not list(tmp_path.glob("o*"))


def test_setup_engines_check_names_what_is_missing(tmp_path):
    env = {**os.environ, runners.ENGINES_DIR_VARIABLE: str(tmp_path / "none")}
    done = subprocess.run([sys.executable, "-m", "beam_dpsu.pipelines.cli", "setup-engines",
                           "--check", "prism"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 1 and "prism: not available: not set up" in done.stderr
    done = subprocess.run([sys.executable, "-m", "beam_dpsu.pipelines.cli", "setup-engines",
                           "dataflow"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "unknown engine 'dataflow'" in done.stderr


class _Ordered(beam.DoFn):
    LIST = OrderedListStateSpec("list", StrUtf8Coder())

    def process(self, kv, state=beam.DoFn.StateParam(LIST)):
        state.add((Timestamp(micros=kv[1]), str(kv[1])))
        yield ",".join(v for _, v in state.read())


class _OrderedTuples(beam.DoFn):
    LIST = OrderedListStateSpec("list", TupleCoder([BytesCoder(), BytesCoder()]))

    def process(self, kv, state=beam.DoFn.StateParam(LIST)):
        state.add((Timestamp(micros=kv[1]), (b"a", b"b")))
        yield len(list(state.read()))


class _FinishBundle(beam.DoFn):
    def start_bundle(self):
        self.n = 0

    def process(self, x):
        self.n += 1
        beam.metrics.Metrics.counter("probe", "seen").inc()

    def finish_bundle(self):
        yield WindowedValue(self.n, 0, [GlobalWindow()])


def _tagged(x):
    yield beam.pvalue.TaggedOutput("odd" if x % 2 else "even", x)


class _Bag(beam.DoFn):
    """Bag state and an event-time timer (what the ordered transform's 'bag' path uses):
    the values of a key, sorted, when the window's watermark passes."""
    BAG = BagStateSpec("bag", StrUtf8Coder())
    FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)

    def process(self, kv, bag=beam.DoFn.StateParam(BAG), flush=beam.DoFn.TimerParam(FLUSH)):
        bag.add(str(kv[1]))
        flush.set(GlobalWindow().max_timestamp())

    @on_timer(FLUSH)
    def flushed(self, bag=beam.DoFn.StateParam(BAG)):
        yield ",".join(sorted(bag.read(), key=int))


#: How each engine answers OrderedListState, by probe DoFn (None: it works): with the
#: ordered transform's tuple coder, and (Prism) with a string coder. Flink's and Spark's
#: state handlers have no handler for its state key type.
ORDERED_LIST_FAILURES = {
    "prism": {"_OrderedTuples": "unknown coder used for ordered list state", "_Ordered": None},
    "flink": {"_OrderedTuples": "IllegalStateException"},
    "spark": {"_OrderedTuples": "IllegalStateException"},
}

_ORDERED_PROBE = """
import os, sys
import apache_beam as beam
from beam_dpsu.transforms import runners
import test_engines
for name in sys.argv[1].split(","):
    fn = getattr(test_engines, name)
    try:
        with beam.Pipeline(options=runners.pipeline_options(sys.argv[2:])) as q:
            q | beam.Create([("k", 1), ("k", 2)]) | beam.ParDo(fn())
        print("ORDERED-LIST", fn.__name__, "works", flush=True)
    except Exception as e:
        print("ORDERED-LIST", fn.__name__, repr(str(e))[:4000], flush=True)
os._exit(0)  # (Flink's LOOPBACK workers may keep a failed job's threads alive)
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_what_each_engine_executes(engine, flags, tmp_path):
    # Each capability runners.capabilities claims for the engine, observed in one pipeline:
    # a Read primitive, a side input computed once (a random draw that every reader sees
    # the same), bag state with an event-time timer, a finish_bundle output, tagged
    # outputs kept apart, metrics, and three file sinks (every leaf) that write what
    # they are given. Then OrderedListState, in a process of its own.
    runner = runners.runner_name_of(runners.pipeline_options(flags))
    caps = runners.capabilities(runner)
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{i}\n" for i in range(50)))
    out = {name: str(tmp_path / name) for name in ("state", "side", "counts")}
    p = beam.Pipeline(options=runners.pipeline_options(flags))
    nums = p | beam.io.ReadFromText(str(src)) | beam.Map(int)
    draw = p | "One" >> beam.Create([0]) | "Draw" >> beam.Map(lambda _: os.urandom(8).hex())
    (nums | "Seen" >> beam.Map(lambda x, d: d, beam.pvalue.AsSingleton(draw))
     | "Distinct" >> beam.Distinct() | "WSide" >> beam.io.WriteToText(out["side"]))
    parts = nums | beam.FlatMap(_tagged).with_outputs("odd", "even")
    (parts.odd | "KO" >> beam.Map(lambda x: ("k", x)) | beam.ParDo(_Bag())
     | "WState" >> beam.io.WriteToText(out["state"]))
    (parts.even | beam.ParDo(_FinishBundle()) | beam.CombineGlobally(sum)
     | "WCount" >> beam.io.WriteToText(out["counts"]))
    result = p.run()
    result.wait_until_finish()

    def lines(name):
        return [ln for f in glob.glob(out[name] + "*") for ln in open(f).read().splitlines()]
    assert caps.read_primitive and caps.all_leaves
    assert lines("state") == [",".join(str(i) for i in range(1, 50, 2))] and caps.user_state
    assert len(lines("side")) == 1 and caps.side_inputs_once
    assert lines("counts") == ["25"] and caps.bundle_outputs and caps.tagged_outputs
    seen = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
    # (Spark reports attempted values only: committed is None there)
    assert caps.metrics and sum(c.result for c in seen) == 25
    assert caps.file_sinks and caps.redistributes
    # Prism keeps a shuffle in its own memory (observed at 1M users: 1.0 GB); Flink's and
    # Spark's shuffles are their own (the command line then stages nothing through files)
    assert caps.memory_shuffle == (engine == "prism")
    # OrderedListState (if one starts to work, the engine's entry may say so); a failed
    # job on Flink can leave LOOPBACK worker threads behind: Flink's and Spark's probes run
    # in a process of their own (on the session's job server: it starts nothing to stop)
    probes = ORDERED_LIST_FAILURES[engine]
    if engine == "prism":
        answers = {}
        for name in probes:
            try:
                with beam.Pipeline(options=runners.pipeline_options(flags)) as q:
                    q | beam.Create([("k", 1), ("k", 2)]) | beam.ParDo(globals()[name]())
                answers[name] = "works"
            except Exception as e:
                answers[name] = str(e)
    else:
        tests = os.path.dirname(os.path.abspath(__file__))
        done = subprocess.run([sys.executable, "-c", _ORDERED_PROBE, ",".join(probes)] + flags,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  [tests, os.path.dirname(tests)])})
        answers = dict(ln.split(" ", 2)[1:] for ln in done.stdout.splitlines()
                       if ln.startswith("ORDERED-LIST "))
        assert set(answers) == set(probes), done.stdout + done.stderr[-3000:]
    for name, failure in probes.items():
        assert (answers[name] == "works") if failure is None else failure in answers[name], answers
    assert not caps.ordered_list_state and runner in runners.NO_ORDERED_LIST_RUNNERS


@pytest.mark.parametrize("engine", [ENGINES[0]])
def test_an_engine_killed_mid_release_leaves_no_release(engine, tmp_path):
    # Prism (the job service and its workers' coordinator) killed while the pipeline
    # runs: the command exits non-zero and leaves no file that looks like a release.
    import signal
    import time
    from beam_dpsu.dp.evaluation import synthetic
    data_file = str(tmp_path / "in.tsv")
    synthetic.write_tsv(data_file, 40000, seed=2, max_occurrences=200)
    out = str(tmp_path / "out")
    proc = subprocess.Popen([sys.executable, "-m", "beam_dpsu.pipelines.cli", "select",
                             "--input", data_file, "--output", out, "--mechanism", "sips",
                             "--epsilon", "1", "--delta", "1e-6"] + ENGINE_FLAGS[engine],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prism = runners.prism_binary()
    seen, killed = {}, 0
    deadline = time.time() + 120
    # Every Prism of the run is killed once it has run 1 s (the job submitted: the release
    # takes about 7 s): under load the first kill could come before the submission, and
    # Beam then starts another Prism, which ran the job to the end (seen on a loaded CI).
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
        found = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", prism], capture_output=True,
                               text=True)  # its own engine, not one of this process
        for pid in (int(p) for p in found.stdout.split()):
            if time.time() - seen.setdefault(pid, time.time()) >= 1.0:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
    _, err = proc.communicate(timeout=300)
    assert killed, "the run ended before the engine could be killed"
    assert proc.returncode not in (0, None), err
    failures = [ln for ln in err.splitlines() if ln.startswith("beam-dpsu select: failed")]
    assert len(failures) == 1 and "job service stopped answering" in failures[0], err
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith("out")]
    assert not [n for n in leftovers if "items" in n or n.endswith(".json")], leftovers


def test_a_pathing_jar_names_every_jar_in_a_valid_manifest(tmp_path):
    import zipfile
    from beam_dpsu.pipelines.setup_engines import MAIN_CLASSES, pathing_jar
    lib = tmp_path / "server" / "lib"
    lib.mkdir(parents=True)
    names = [f"beam-runners-{'x' * (i * 13)}-{i}.jar" for i in range(12)] + ["notes.txt"]
    for name in names:
        (lib / name).write_bytes(b"")
    jar = str(tmp_path / "server" / "job-server.jar")
    assert pathing_jar(jar, MAIN_CLASSES["flink"], str(lib)) == 12
    with zipfile.ZipFile(jar) as z:
        assert z.namelist() == ["META-INF/MANIFEST.MF"]
        raw = z.read("META-INF/MANIFEST.MF")
    assert raw.endswith(b"\r\n\r\n")
    lines = raw[:-4].split(b"\r\n")
    assert all(len(line) <= 72 for line in lines)  # the jar specification's limit
    attributes, last = {}, None
    for line in lines:  # a continuation line starts with one space
        if line.startswith(b" "):
            attributes[last] += line[1:].decode()
        else:
            last, value = line.decode().split(": ", 1)
            attributes[last] = value
    assert attributes["Main-Class"] == "org.apache.beam.runners.flink.FlinkJobServerDriver"
    assert attributes["Class-Path"].split(" ") == sorted(f"lib/{n}" for n in names[:12])
    assert "java.base/java.lang" in attributes["Add-Opens"].split(" ")


@pytest.mark.parametrize("engine", JAVA_ENGINES)
def test_no_java_is_one_line_and_exit_status_2(engine, tmp_path):
    data_file = tmp_path / "d.tsv"
    data_file.write_text("u1\ta\n")
    env = {**os.environ, "PATH": str(tmp_path)}  # a PATH without java
    done = subprocess.run([sys.executable, "-m", "beam_dpsu.pipelines.cli", "select",
                           "--input", str(data_file), "--output", str(tmp_path / "o"),
                           "--mechanism", "weighted-gaussian", "--epsilon", "1",
                           "--delta", "1e-6"] + ENGINE_FLAGS[engine],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "needs Java 17" in lines[0], done.stderr
    assert not list(tmp_path.glob("o*"))


@pytest.mark.parametrize("engine", ENGINES)
def test_delta0_chosen_from_the_data(data, engine, flags, tmp_path):
    # --max-items-per-user auto: the activity pipeline, then the release, on the engine,
    # from the command line and embedded (activity.calibrate); both equal the DirectRunner's
    from beam_dpsu.transforms import activity
    from beam_dpsu.transforms.select import SelectPartitions
    from beam_dpsu.transforms.write import WriteRelease
    path, _ = data
    common = ["--input", path, "--mechanism", "adaptive-2r", "--epsilon", "3", "--delta",
              "1e-6", "--max-items-per-user", "auto", "--insecure-test-seed", "21", "--quiet"]
    outs = {}
    for label, runner in (("d", ["--runner=DirectRunner"]), ("e", flags)):
        assert select_partitions.main(common + ["--output", str(tmp_path / label)] + runner) == 0
        with open(str(tmp_path / label) + ".json", encoding="utf-8") as fh:
            outs[label] = (_rows(str(tmp_path / label)), json.load(fh)["max_items_choice"])
    assert outs["d"][0] and outs["e"] == outs["d"]
    pairs = [(f"u{u}", f"i{(u * 7 + j * j) % 60}") for u in range(400) for j in range(u % 9 + 1)]
    key = RunKey.from_test_seed(22)
    m = make_mechanism("weighted-gaussian", epsilon=2.0, delta=1e-5, max_items="auto")
    options = runners.pipeline_options(flags)
    calibrated = activity.calibrate(m, lambda p: p | beam.Create(pairs), options, run_key=key)
    per_user = {}
    for u, i in pairs:
        per_user.setdefault(u, {}).setdefault(i, 0)
        per_user[u][i] += 1
    assert calibrated.max_items == m.calibrated_on(per_user, key).max_items
    p = beam.Pipeline(options=options)
    (p | beam.Create(pairs) | SelectPartitions(calibrated, run_key=key)
     | WriteRelease(str(tmp_path / "embedded")))
    p.run().wait_until_finish()
    with open(tmp_path / "embedded", encoding="utf-8") as fh:
        assert fh.read().splitlines() == sorted(m.run_local(per_user, key)) != []
