"""Every family on the engines the project sets up (``beam-dpsu setup-engines``).

Prism (Beam's portable runner in Go, built from the Go module proxy) runs every
mechanism from the command line and embedded in a user's pipeline; each release must
equal the FnApiRunner's under the same test seed. Flink and Spark run the same cases
where their job server jars are set up (Maven Central as reached here does not serve
them: ``docs/runners.md``). On CI a missing Prism is a failure, not a skip: ``.ci/run``
sets it up first.
"""
import glob
import json
import os
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.coders import BytesCoder, StrUtf8Coder, TupleCoder
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.transforms.userstate import OrderedListStateSpec
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_dpsu.dp.mechanisms.histogram_threshold import WeightedGaussian
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.pipelines import hitting_set, select_partitions, top_k
from beam_dpsu.transforms import runners

from tests.test_runners import CASES, data, run  # noqa: F401  (the data fixture)

pytestmark = [pytest.mark.engines, pytest.mark.subprocess]

ENGINE_FLAGS = {
    "prism": ["--runner=PrismRunner"],
    "flink": ["--runner=FlinkRunner", "--flink_master=[local]", "--environment_type=LOOPBACK"],
    "spark": ["--runner=SparkRunner", "--spark_master_url=local[2]",
              "--environment_type=LOOPBACK"],
}


def _set_up(engine):
    path = runners.prism_binary() if engine == "prism" else runners.job_server_jar(engine)
    return os.path.isfile(path)


def _engine_param(engine):
    if _set_up(engine):
        return engine
    if engine == "prism" and os.environ.get("CI"):
        return engine  # and the test fails: CI sets Prism up before the suite
    return pytest.param(engine, marks=pytest.mark.skip(
        reason=f"{engine} is not set up (beam-dpsu setup-engines {engine})"))


ENGINES = [_engine_param(e) for e in ENGINE_FLAGS]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", CASES)
def test_every_mechanism_releases_the_fnapi_runners_set(data, name, engine, tmp_path):
    direct, items = run(data, name, ["--runner=DirectRunner"], str(tmp_path / "direct"))
    assert items
    summary, other = run(data, name, ENGINE_FLAGS[engine], str(tmp_path / engine))
    assert other == items
    assert summary["threshold"] == direct["threshold"]
    assert summary["PRIVATE_run_details"]["num_users"] == 600
    # the policies use real Beam state there, not the GroupByKey fallback
    assert runners.capabilities(runners.runner_name_of(
        runners.pipeline_options(ENGINE_FLAGS[engine]))).user_state


def _rows(prefix):
    lines = []
    for f in sorted(glob.glob(prefix + "-items-*")):
        lines += open(f, encoding="utf-8").read().splitlines()
    return lines


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("command", ["top-k limited-domain", "top-k limited-domain counts",
                                     "top-k discover-peel", "hitting-set"])
def test_top_k_and_the_hitting_set(data, engine, command, tmp_path):
    path, _ = data
    flags = ["--input", path, "--k", "5", "--epsilon", "2", "--delta", "1e-6",
             "--max-items-per-user", "10", "--insecure-test-seed", "4"]
    main = hitting_set.run if command == "hitting-set" else top_k.run
    if command.startswith("top-k"):
        flags += ["--method", command.split()[1]]
        flags += ["--k-bar", "8"] if "limited" in command else []
        if command.endswith("counts"):
            flags += ["--with-counts"]
    main(flags + ["--output", str(tmp_path / "d"), "--runner=DirectRunner"])
    main(flags + ["--output", str(tmp_path / "e")] + ENGINE_FLAGS[engine])
    want = _rows(str(tmp_path / "d"))
    assert want and _rows(str(tmp_path / "e")) == want


@pytest.mark.parametrize("engine", ENGINES)
def test_a_budget_plan(data, engine, tmp_path):
    path, _ = data
    flags = ["--input", path, "--mechanism", "weighted-gaussian", "--max-items-per-user", "4",
             "--budget-epsilon", "8", "--budget-delta", "1e-5", "--top-k", "3",
             "--share", "top-k=0.25", "--insecure-test-seed", "11", "--quiet"]
    outs = {}
    for label, runner in (("d", ["--runner=DirectRunner"]), ("e", ENGINE_FLAGS[engine])):
        assert select_partitions.main(flags + ["--output", str(tmp_path / label)] + runner) == 0
        with open(str(tmp_path / label) + ".json", encoding="utf-8") as fh:
            summary = json.load(fh)
        outs[label] = (_rows(str(tmp_path / label)), summary["top_k"]["num_released"],
                       summary["epsilon"], summary["delta"])
    assert outs["d"][0] and outs["e"] == outs["d"]


@pytest.mark.parametrize("engine", ENGINES)
def test_embedded_in_a_users_pipeline(engine, tmp_path):
    # A user's own pipeline: runners.pipeline_options finds the engine; SelectPartitions
    # on (user, item) pairs; the release written with the library's one-file writer.
    from beam_dpsu.transforms.write import WriteRelease
    from beam_dpsu.dp.mechanisms.base import run_local
    pairs = [(f"u{u}", f"i{(u * 7 + j) % 40}") for u in range(400) for j in range(u % 6 + 1)]
    mechanism = WeightedGaussian(2.0, 1e-5, 5)
    key = RunKey.from_test_seed(5)
    out = str(tmp_path / "release.txt")
    from beam_dpsu.transforms.select import SelectPartitions
    options = runners.pipeline_options(ENGINE_FLAGS[engine])
    with beam.Pipeline(options=options) as p:
        (p | beam.Create(pairs) | SelectPartitions(mechanism, run_key=key) | WriteRelease(out))
    per_user = {}
    for u, i in pairs:
        per_user.setdefault(u, {}).setdefault(i, 0)
        per_user[u][i] += 1
    want = sorted(run_local(per_user, mechanism, key))
    assert want and sorted(open(out, encoding="utf-8").read().splitlines()) == want


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


@pytest.mark.parametrize("engine", [ENGINES[0]])
def test_what_prism_executes(engine, tmp_path):
    # Each capability runners.capabilities claims for Prism, observed in one pipeline:
    # a Read primitive, a side input computed once (a random draw
    # that every reader sees the same), a finish_bundle output, tagged outputs kept
    # apart, metrics, and two file sinks (every leaf) that write what they are given.
    caps = runners.capabilities("PrismRunner")
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{i}\n" for i in range(50)))
    out = {name: str(tmp_path / name) for name in ("ordered", "side", "counts")}
    p = beam.Pipeline(options=runners.pipeline_options(ENGINE_FLAGS[engine]))
    nums = p | beam.io.ReadFromText(str(src)) | beam.Map(int)
    draw = p | "One" >> beam.Create([0]) | "Draw" >> beam.Map(lambda _: os.urandom(8).hex())
    (nums | "Seen" >> beam.Map(lambda x, d: d, beam.pvalue.AsSingleton(draw))
     | "Distinct" >> beam.Distinct() | "WSide" >> beam.io.WriteToText(out["side"]))
    parts = nums | beam.FlatMap(_tagged).with_outputs("odd", "even")
    (parts.odd | "KO" >> beam.Map(lambda x: ("k", x)) | beam.ParDo(_Ordered())
     | "WOrd" >> beam.io.WriteToText(out["ordered"]))
    (parts.even | beam.ParDo(_FinishBundle()) | beam.CombineGlobally(sum)
     | "WCount" >> beam.io.WriteToText(out["counts"]))
    result = p.run()
    result.wait_until_finish()

    def lines(name):
        return [ln for f in glob.glob(out[name] + "*") for ln in open(f).read().splitlines()]
    ordered = lines("ordered")
    assert caps.read_primitive and caps.all_leaves
    assert max(ordered, key=len) == ",".join(str(i) for i in range(1, 50, 2))  # sorted
    assert len(lines("side")) == 1 and caps.side_inputs_once
    assert lines("counts") == ["25"] and caps.bundle_outputs and caps.tagged_outputs
    seen = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
    assert caps.metrics and sum(c.committed for c in seen) == 25
    assert caps.file_sinks and caps.user_state
    assert caps.memory_shuffle      # observed at 1M users: the shuffle in Prism's memory
    # OrderedListState: a string coder works, the ordered transform's tuple coder does not
    # (if this starts to pass, Prism's table entry may say ordered_list_state=True)
    assert not caps.ordered_list_state and "PrismRunner" in runners.NO_ORDERED_LIST_RUNNERS
    with pytest.raises(Exception, match="unknown coder used for ordered list state"):
        with beam.Pipeline(options=runners.pipeline_options(ENGINE_FLAGS[engine])) as q:
            q | beam.Create([("k", 1), ("k", 2)]) | beam.ParDo(_OrderedTuples())


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
    killed = False
    deadline = time.time() + 120
    while not killed and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
        found = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", prism], capture_output=True,
                               text=True)  # its own engine, not one of this process
        pids = [int(p) for p in found.stdout.split()]
        if pids:
            time.sleep(1.0)  # the job is submitted and running
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            killed = True
    _, err = proc.communicate(timeout=300)
    assert killed, "the run ended before the engine could be killed"
    assert proc.returncode not in (0, None), err
    failures = [ln for ln in err.splitlines() if ln.startswith("beam-dpsu select: failed")]
    assert len(failures) == 1 and "job service stopped answering" in failures[0], err
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith("out")]
    assert not [n for n in leftovers if "items" in n or n.endswith(".json")], leftovers
