"""Every mechanism on the portable job API and on the multi-process DirectRunner (one of
each family in CI, ``FAMILIES``; every one with ``pytest -m exhaustive``).

Flink and Dataflow run pipelines through the same portable path as
``--runner=PortableRunner --job_endpoint=embed --environment_type=LOOPBACK``;
the multi-process DirectRunner runs bundles in separate worker processes, so
anything that relies on module-level state or on closures that do not survive
pickling fails there. Each mechanism runs on the same small data with the same
test seed on the DirectRunner, the portable runner and the multi-process
DirectRunner, and the released sets must be identical (the randomness derives
from the run key carried inside the pipeline, not from process state).
"""
import fcntl
import glob
import json
import os
import tempfile

import pytest

from beam_dpsu.dp.mechanisms.registry import REGISTRY
from beam_dpsu.pipelines import arguments, select_partitions

from conftest import transform_labels

PORTABLE = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]
MULTI = ["--runner=DirectRunner", "--direct_num_workers=2",
         "--direct_running_mode=multi_processing"]

# Flags per registered mechanism for a small run (kept in step with the registry).
FLAGS = {
    "truncated-geometric": ["--epsilon", "2", "--delta", "1e-5", "--max-items-per-user", "5"],
    "count-laplace": ["--epsilon", "2", "--delta", "1e-5", "--max-items-per-user", "5"],
    "count-gaussian": ["--epsilon", "2", "--delta", "1e-5", "--max-items-per-user", "5"],
    "weighted-laplace": ["--epsilon", "2", "--delta", "1e-5", "--max-items-per-user", "5"],
    "weighted-gaussian": ["--epsilon", "2", "--delta", "1e-5", "--max-items-per-user", "5"],
    "weighted-gaussian-zcdp": ["--rho", "0.5", "--delta", "1e-5", "--max-items-per-user", "5"],
    "sips": ["--rho", "0.5", "--delta", "1e-5", "--max-items-per-user", "5"],
    "adaptive": ["--epsilon", "2", "--delta", "1e-5", "--max-items-per-user", "5"],
    "adaptive-2r": ["--epsilon", "2", "--delta", "1e-5", "--max-items-per-user", "5"],
    "policy-laplace": ["--epsilon", "2", "--delta", "1e-5", "--max-items-per-user", "5"],
    "policy-gaussian": ["--epsilon", "2", "--delta", "1e-5", "--max-items-per-user", "5"],
    "gw": ["--epsilon", "2", "--delta", "1e-5"],
    "gw-kt": ["--epsilon", "2", "--delta", "1e-5"],
}
CASES = list(FLAGS)

#: One mechanism of each family: the count and the weighted histogram, DP-SIPS, adaptive,
#: adaptive-2r, a sequential policy (the ordered-user transform, on the runner's state),
#: GW and GW-KT. The mechanisms of one family differ in the core (``beam_dpsu.dp``), not
#: in the transforms a runner executes: a runner's test runs these in CI and the rest of
#: ``CASES`` as ``exhaustive`` (every case still runs on the DirectRunner and Prism).
FAMILIES = ["count-laplace", "weighted-gaussian", "sips", "adaptive", "adaptive-2r",
            "policy-gaussian", "gw", "gw-kt"]


def family_cases():
    """``CASES`` for a runner's test: those outside ``FAMILIES`` marked ``exhaustive``."""
    return [n if n in FAMILIES else pytest.param(n, marks=pytest.mark.exhaustive)
            for n in CASES]


@pytest.fixture(scope="module")
def data(runners_data):
    """(input file, public counts file): 600 users, written once per session."""
    return runners_data


def test_every_registered_mechanism_is_covered():
    assert set(REGISTRY) <= set(FLAGS), sorted(set(REGISTRY) - set(FLAGS))
    assert set(FLAGS) - {"weighted-gaussian-zcdp"} <= set(REGISTRY)


def run(data, name, runner_flags, out):
    path, public = data
    mech = "weighted-gaussian" if name == "weighted-gaussian-zcdp" else name
    extra = ["--public-counts", public] if name == "gw-kt" else []
    summary = select_partitions.run(["--input", path, "--output", out, "--mechanism", mech,
                                     "--insecure-test-seed", "17"] + FLAGS[name] + extra +
                                    runner_flags)
    # One items file of a fixed name, sorted, on every runner (also with two workers).
    assert glob.glob(out + "-items-*") == [out + "-items-00000-of-00001"]
    with open(out + "-items-00000-of-00001", encoding="utf-8") as fh:
        items = fh.read().splitlines()
    assert items == sorted(items)
    return summary, items


@pytest.fixture(scope="session")
def reference(runners_data, tmp_path_factory):
    """``reference(name)``: the DirectRunner's (summary, items) for case ``name``, run once
    per session and shared by the xdist workers (through a file per case, under a lock);
    every runner's test compares its own release with it."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # this session's folder, above each worker's own
    folder = shared / "direct-references"
    folder.mkdir(exist_ok=True)
    cache = {}

    def get(name):
        if name not in cache:
            with open(folder / f"{name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                done = folder / f"{name}.json"
                if done.exists():
                    cache[name] = tuple(json.loads(done.read_text(encoding="utf-8")))
                else:
                    out = str(tmp_path_factory.mktemp("direct") / name)
                    cache[name] = run(runners_data, name, ["--runner=DirectRunner"], out)
                    part = folder / f"{name}.part"
                    part.write_text(json.dumps(cache[name]), encoding="utf-8")
                    part.replace(done)
        return cache[name]
    return get


def _same_release(reference, data, name, flags, out):
    direct, items = reference(name)
    assert items, "the test data should release something"
    assert direct["num_released"] == len(items)
    assert direct["PRIVATE_run_details"]["num_users"] == 600
    summary, other = run(data, name, flags, out)
    assert other == items
    assert summary["threshold"] == direct["threshold"]
    assert summary["epsilon"] == direct["epsilon"] and summary["seeded"] is True
    return summary


@pytest.mark.parametrize("name", family_cases())
def test_multiprocess_releases_the_same_set(reference, data, name, tmp_path):
    _same_release(reference, data, name, MULTI, str(tmp_path / "multi"))


@pytest.mark.parametrize("name", family_cases())
def test_portable_releases_the_same_set(reference, data, name, tmp_path):
    # the portable job API, in process (every case runs through the same job API on Prism)
    _same_release(reference, data, name, PORTABLE, str(tmp_path / "portable"))


@pytest.mark.parametrize("with_counts", [False, True])
def test_top_k_on_portable_and_multiprocess(data, tmp_path, with_counts):
    from beam_dpsu.pipelines import top_k
    path, _ = data
    flags = ["--input", path, "--k", "5", "--k-bar", "8", "--epsilon", "2", "--delta", "1e-6",
             "--insecure-test-seed", "3"] + (
                 ["--with-counts", "--max-items-per-user", "5"] if with_counts else [])
    outputs = []
    for label, runner in (("direct", ["--runner=DirectRunner"]), ("portable", PORTABLE),
                          ("multi", MULTI)):
        prefix = str(tmp_path / label)
        top_k.run(flags + ["--output", prefix] + runner)
        lines = []
        for f in sorted(glob.glob(prefix + "-items-*")):
            lines += open(f, encoding="utf-8").read().splitlines()
        outputs.append(lines)
    assert outputs[0] and outputs[0] == outputs[1] == outputs[2]


def _interleaved_and_split(path, folder, parts):
    """The file's lines with the users interleaved (each user's lines in their order,
    the users taking turns), as one file and as ``parts`` files of consecutive lines
    (sorted names): read in name order they are the same records in the same order,
    while most users' lines span several files."""
    per_user = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            per_user.setdefault(line.split("\t", 1)[0], []).append(line)
    queues = list(per_user.values())
    lines = []
    for turn in range(max(len(q) for q in queues)):
        lines += [q[turn] for q in queues if turn < len(q)]
    folder.mkdir()
    whole = folder / "whole.tsv"
    whole.write_text("".join(lines))
    size = -(-len(lines) // parts)
    for k in range(parts):
        (folder / f"part-{k}.tsv").write_text("".join(lines[k * size:(k + 1) * size]))
    firsts = [{l.split("\t", 1)[0] for l in lines[k * size:(k + 1) * size]} for k in (0, 1)]
    assert len(firsts[0] & firsts[1]) > 100  # users do span files
    return str(whole), str(folder / "part-*.tsv")


# One mechanism per family: histogram, iterative rounds, ordered (record order
# across files matters to the policies), GW (first-occurrence tie break).
@pytest.mark.parametrize("name", ["weighted-gaussian", "sips", "policy-gaussian", "gw"])
def test_several_files_release_what_one_file_releases(data, name, tmp_path):
    """With several input files the command line builds another graph (no whole-file
    users part: every user through the merge); the release is the same."""
    path, pattern = _interleaved_and_split(data[0], tmp_path / "split", 3)
    _, whole = run((path, data[1]), name, ["--runner=DirectRunner"], str(tmp_path / "one"))
    _, split = run((pattern, data[1]), name, ["--runner=DirectRunner"], str(tmp_path / "three"))
    assert whole and split == whole


def test_several_files_with_top_k_release_what_one_file_releases(data, tmp_path):
    outputs = []
    for label, path in zip(("one", "three"), _interleaved_and_split(data[0], tmp_path / "s", 3)):
        prefix = str(tmp_path / label)
        select_partitions.run([
            "--input", path, "--output", prefix, "--mechanism", "weighted-gaussian",
            "--max-items-per-user", "5", "--budget-epsilon", "4", "--budget-delta", "1e-5",
            "--top-k", "3", "--insecure-test-seed", "5"])
        outputs.append([open(f, encoding="utf-8").read()
                        for f in sorted(glob.glob(prefix + "-*-000*"))])
    assert len(outputs[0]) == 2 and all(outputs[0]) and outputs[0] == outputs[1]


@pytest.mark.parametrize("name", ["weighted-gaussian", "count-laplace", "sips", "gw",
                                  "policy-gaussian"])
def test_every_mechanism_reads_columns(data, name, tmp_path):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from beam_dpsu.dp.randomness.noise import RunKey
    flags = FLAGS.get(name, ["--epsilon", "1", "--delta", "1e-5"])
    out = str(tmp_path / "out")
    _, plan, _ = arguments.parse_select(
        ["--input", data[0], "--output", out, "--mechanism", name] + flags)
    p = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"]))
    select_partitions.build_pipeline(p, data[0], out, plan.mechanism, RunKey.from_test_seed(1))
    labels = transform_labels(p)
    assert any(label.startswith("SelectFromText") for label in labels)
    assert not any(label.startswith("ReadUserItems") for label in labels)


def test_a_top_k_release_beside_the_key_set_reads_columns_too(data, tmp_path):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from beam_dpsu.dp.mechanisms.topk import TopKMechanism
    from beam_dpsu.dp.randomness.noise import RunKey
    out = str(tmp_path / "out")
    _, plan, _ = arguments.parse_select(
        ["--input", data[0], "--output", out, "--mechanism", "policy-gaussian"]
        + FLAGS["policy-gaussian"])
    p = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"]))
    select_partitions.build_pipeline(p, data[0], out, plan.mechanism, RunKey.from_test_seed(1),
                                     top_k=TopKMechanism(k=3, k_bar=5, epsilon=1.0,
                                                         delta=1e-6))
    labels = transform_labels(p)
    assert any(label.startswith("SelectFromText") for label in labels)
    assert any(label.startswith("TopK/ReadPairs") for label in labels)
    assert not any("ReadUserItems" in label or "PerUser" in label for label in labels)


@pytest.mark.parametrize("method", ["limited-domain", "discover-peel"])
def test_top_k_reads_columns(data, method):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from beam_dpsu.dp.randomness.noise import RunKey
    from beam_dpsu.dp.mechanisms.peeling import DiscoverPeelTopK
    from beam_dpsu.dp.mechanisms.topk import TopKMechanism
    from beam_dpsu.pipelines import top_k
    p = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"]))
    mechanism = (TopKMechanism(k=3, k_bar=5, epsilon=1.0, delta=1e-6)
                 if method == "limited-domain" else DiscoverPeelTopK(3, 1.0, 1e-6))
    top_k.build_pipeline(p, data[0], "/nonexistent/out", mechanism, RunKey.from_test_seed(1))
    labels = transform_labels(p)
    assert any(label.startswith("RankFromText") for label in labels)
    assert not any("ReadUserItems" in label or "PerUser" in label for label in labels)


@pytest.mark.parametrize("flags, pinned", [
    ([], True), (["--runner=DirectRunner"], True), (["--runner=SwitchingDirectRunner"], True),
    (["--runner=apache_beam.runners.direct.direct_runner.DirectRunner"], True),
    (["--runner=direct"], True), (["--runner=directrunner"], True),
    (["--runner=PrismRunner", "--prism_location=/p"], False), (["--runner=PortableRunner"], False),
    (["--runner=FlinkRunner", "--flink_job_server_jar=/j.jar"], False)])
def test_the_direct_runner_is_pinned_to_the_fnapi_runner(flags, pinned):
    from apache_beam.options.pipeline_options import StandardOptions
    from beam_dpsu.transforms import runners
    options = runners.pipeline_options(flags)
    name = options.view_as(StandardOptions).runner
    assert (name == runners.LOCAL_RUNNER) if pinned else name == flags[0].split("=")[1]
    if pinned:
        import apache_beam as beam
        # A name Beam itself resolves, to its FnApiRunner (public: ALL_KNOWN_RUNNERS).
        assert runners.LOCAL_RUNNER in StandardOptions.KNOWN_RUNNER_NAMES
        p = beam.Pipeline(options=runners.pipeline_options(flags + MULTI[1:]))
        assert type(p.runner).__name__ == "FnApiRunner"
        assert runners.capabilities(p).ordered_list_state and runners.dealt_workers(p) == 2


def test_the_command_line_never_tries_prism(data, tmp_path, monkeypatch):
    """Beam's DirectRunner (SwitchingDirectRunner) tries Prism first, downloading it
    where it can: the command lines run the DirectRunner's FnApiRunner directly, on
    one worker and on several."""
    from apache_beam.runners.direct import direct_runner
    from apache_beam.runners.portability import prism_runner

    def refuse(*args, **kwargs):
        raise AssertionError("the command line went through Beam's SwitchingDirectRunner")
    monkeypatch.setattr(direct_runner.SwitchingDirectRunner, "run_pipeline", refuse)
    monkeypatch.setattr(prism_runner.PrismRunner, "run_pipeline", refuse)
    # A temporary directory of this test's own (other processes may use the system's).
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    _, one = run(data, "weighted-gaussian", [], str(tmp_path / "one"))
    _, two = run(data, "weighted-gaussian", MULTI, str(tmp_path / "two"))
    assert one == two and one
    # The failed Prism attempt used to leave beam-temp* and tmp* directories there.
    assert os.listdir(private_tmp) == []


def test_a_failed_wait_cancels_the_run():
    # wait_for cancels a job whose wait failed (the launcher then removes the run's
    # files: the job must not write them again); a runner that cannot cancel, or a job
    # already over, is left as it is and the wait's own error goes on
    import apache_beam as beam
    from beam_dpsu.transforms.run_key import wait_for

    class Result:
        def __init__(self, cancel_error=None):
            self.cancelled, self._error = 0, cancel_error

        def wait_until_finish(self):
            raise KeyboardInterrupt

        def cancel(self):
            self.cancelled += 1
            if self._error:
                raise self._error

    for result in (Result(), Result(NotImplementedError("no cancel here"))):
        with pytest.raises(KeyboardInterrupt):
            wait_for(beam.Pipeline(), result)
        assert result.cancelled == 1

    class Done(Result):
        def wait_until_finish(self):
            return "DONE"
    done = Done()
    wait_for(beam.Pipeline(), done)
    assert done.cancelled == 0
