"""Every mechanism (one of each family in CI, every one with ``pytest -m exhaustive``) and
top-k on Beam's Dask runner, on a real two-process cluster.

A ``distributed.LocalCluster`` with two worker processes (one thread each) is
started once for the module; every pipeline runs through the command line
with ``--runner=DaskRunner --dask_client_address=ADDRESS`` and the same
``--insecure-test-seed`` as on the DirectRunner, and the released sets must be
identical. The workers import ``beam_dpsu`` through ``PYTHONPATH`` (set here to
the repository root, inherited by the worker processes).

Also: the capability-driven refusals (``beam_dpsu.runners.check_pipeline``)
and the fresh run key, which must be the same in every dask partition.
"""
import glob
import json
import os

import pytest

distributed = pytest.importorskip(
    "distributed", reason="dask[distributed] is not installed (pip install '.[dask]')")

import apache_beam as beam  # noqa: E402

from beam_dpsu.transforms import runners  # noqa: E402
from beam_dpsu.pipelines import select_partitions, top_k  # noqa: E402
from tests.test_runners import data, family_cases, reference  # noqa: E402,F401  (fixtures)
from tests.test_runners import run as run_select  # noqa: E402  (one items file, sorted)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cluster():
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = ROOT + (os.pathsep + old if old else "")
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None) as c:
            yield c.scheduler_address
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def dask_flags(address):
    return ["--runner=DaskRunner", f"--dask_client_address={address}"]


def items_of(prefix):
    assert glob.glob(prefix + "-items-*") == [prefix + "-items-00000-of-00001"]
    with open(prefix + "-items-00000-of-00001", encoding="utf-8") as fh:
        return fh.read().splitlines()




@pytest.mark.parametrize("name", family_cases())
def test_dask_releases_what_the_direct_runner_releases(cluster, data, reference, name,
                                                      tmp_path):
    direct, items = reference(name)
    assert items and items == sorted(items)
    summary, other = run_select(data, name, dask_flags(cluster), str(tmp_path / "k"))
    assert other == items
    assert summary["num_released"] == len(items)
    assert summary["threshold"] == direct["threshold"]
    assert summary["PRIVATE_run_details"]["runner"] == "DaskRunner"


@pytest.mark.parametrize("with_counts", [False, True])
def test_top_k_on_dask(cluster, data, tmp_path, with_counts):
    path, _ = data
    flags = ["--input", path, "--k", "5", "--k-bar", "8", "--epsilon", "2", "--delta", "1e-6",
             "--insecure-test-seed", "3"] + (
                 ["--with-counts", "--max-items-per-user", "5"] if with_counts else [])
    top_k.run(flags + ["--output", str(tmp_path / "d"), "--runner=DirectRunner"])
    top_k.run(flags + ["--output", str(tmp_path / "k")] + dask_flags(cluster))
    direct = items_of(str(tmp_path / "d"))
    assert direct and items_of(str(tmp_path / "k")) == direct


def test_dead_letter_and_release_both_written(cluster, tmp_path):
    path = tmp_path / "in.tsv"
    path.write_text("".join(f"u{i}\ti{i % 3}\n" for i in range(200)) + "no tab here\n")
    out, dead = str(tmp_path / "o"), str(tmp_path / "dead")
    select_partitions.run(["--input", str(path), "--output", out, "--mechanism",
                           "weighted-gaussian", "--epsilon", "2", "--delta", "1e-5",
                           "--max-items-per-user", "1", "--insecure-test-seed", "1",
                           "--dead-letter", dead] + dask_flags(cluster))
    assert items_of(out) == ["i0", "i1", "i2"]
    assert open(dead + ".PRIVATE-dead-letter-00000-of-00001").read() == "no tab here\n"


from beam_dpsu.transforms import run_key as keys  # noqa: E402


class _Show(beam.DoFn):
    def __init__(self, path):
        self._path = path

    def process(self, element, key):
        with open(self._path, "a") as f:
            f.write(keys.key_bytes(key).hex() + "\n")
        yield element


def test_fresh_key_is_the_same_in_every_partition(cluster, tmp_path):
    from beam_dpsu.dp.randomness.noise import RunKey
    log = str(tmp_path / "keys")
    p = beam.Pipeline(argv=runners.resolve_runner_flag(dask_flags(cluster)))
    run_key = RunKey.fresh()
    (p | beam.Create(list(range(1000)))  # several dask partitions, each reads the key
       | beam.ParDo(_Show(log), keys.key_side_input(p | "x" >> beam.Create([0]), run_key)))
    result = p.run()
    result.wait_until_finish()
    keys.delete_shared_keys(p, result.client)
    result.client.close()
    seen = set(open(log).read().split())
    assert len(open(log).read().split()) == 1000 and len(seen) == 1


def test_worker_key_is_drawn_once_for_the_cluster_and_never_staged(cluster):
    """Each worker process resolves the key itself; all get the first draw; the
    job graph carries only the key's public name; the launcher deletes the copy."""
    import pickle
    from beam_dpsu.dp.randomness.noise import RunKey
    p = beam.Pipeline(argv=runners.resolve_runner_flag(dask_flags(cluster)))
    pcoll = p | beam.Create([0])
    worker_key = keys.key_side_input(pcoll, RunKey.fresh())
    assert isinstance(worker_key, keys.WorkerKey)
    other = keys.key_side_input(pcoll, RunKey.fresh())
    assert other.name != worker_key.name
    with distributed.Client(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == 2

        def resolve_on_each():  # a task in each worker process, concurrently
            return client.gather([client.submit(worker_key.resolve, workers=[w], pure=False)
                                  for w in workers])

        got = resolve_on_each()
        assert len(set(got)) == 1
        key = got[0]
        assert len(key) == 32 and key not in pickle.dumps(worker_key)
        assert resolve_on_each() == got  # cached per process
        assert keys.shared_key_names(p) == [worker_key.name, other.name]
        assert keys.shared_key(client, worker_key.name) == key  # the scheduler's copy
        keys.delete_shared_keys(p, client)
        # the scheduler's copy is gone at once (set_metadata waits for the scheduler)
        assert keys.shared_key(client, worker_key.name) is None
        assert client.get_metadata([keys.SHARED_KEYS, worker_key.name], "absent") is None


def test_what_dask_would_mistranslate_is_refused(cluster, tmp_path):
    p = beam.Pipeline(argv=runners.resolve_runner_flag(dask_flags(cluster)))
    p | beam.Create([1, 2]) | beam.Map(str) | beam.io.WriteToText(str(tmp_path / "x"))
    with pytest.raises(ValueError, match="file sink"):
        runners.check_pipeline(p)
    p = beam.Pipeline(argv=runners.resolve_runner_flag(dask_flags(cluster)))
    p | beam.Create([1, 2]) | beam.combiners.Top.Of(1)
    with pytest.raises(ValueError, match="finish_bundle"):
        runners.check_pipeline(p)
    from beam_dpsu.transforms.ordered import OrderedUserPolicy
    from beam_dpsu.dp.data.sequential import L1DescentPolicy  # noqa: F401
    assert runners.capabilities("DaskRunner").user_state is False
    assert runners.capabilities("DirectRunner").ordered_list_state is True
    assert OrderedUserPolicy  # state='bag' on Dask: see test_ordered_state_refused


def test_dask_flag_is_accepted_by_the_command_line(cluster, data, tmp_path):
    from beam_dpsu.pipelines import flags, console
    flags.check_beam_args(dask_flags(cluster) + ["--dask_npartitions", "2"])
    with pytest.raises(console.UsageError):
        flags.check_beam_args(["--dask_client_adress=x"])


@pytest.fixture(scope="module")
def three_files(data, tmp_path_factory):
    """The test data in three files of consecutive lines (a user's lines may span files)."""
    path, public = data
    lines = open(path, encoding="utf-8").read().splitlines(keepends=True)
    folder = tmp_path_factory.mktemp("three")
    step = -(-len(lines) // 3)
    for i in range(3):
        (folder / f"part-{i}.tsv").write_text("".join(lines[i * step:(i + 1) * step]))
    return str(folder / "part-*.tsv"), public


def _merged_partitions(flags, pattern, keep_order, npartitions=None):
    """The dask partitions of ``ReadUserItems``' per-user merge, as Beam's Dask runner
    translates the graph (nothing is run; ``npartitions``: ``--dask_npartitions``,
    which the runner hands to its translation)."""
    from apache_beam.runners.dask.dask_runner import DaskRunner
    from apache_beam.runners.dask.overrides import dask_overrides
    from beam_dpsu.transforms.textio import ReadUserItems
    p = beam.Pipeline(argv=runners.resolve_runner_flag(flags))
    p | "Read" >> ReadUserItems(pattern, keep_order=keep_order)
    p.replace_all(dask_overrides())
    visitor = DaskRunner.to_dask_bag_visitor(
        {"npartitions": npartitions} if npartitions else None)
    p.visit(visitor)
    merged = [bag for node, bag in visitor.bags.items()
              if node.full_label.startswith("Read/MergePerUser")]
    assert merged
    return {bag.npartitions for bag in merged}


def test_input_files_are_dealt_into_partitions_per_worker_thread(cluster, three_files,
                                                                 monkeypatch):
    """Three files on the two one-thread workers, one partition per thread: two
    partitions, so every shuffle of the run has two (not three); ``--dask_npartitions``
    decides instead when given."""
    monkeypatch.setattr(runners, "DASK_PARTITIONS_PER_THREAD", 1)
    for keep_order in (False, True):
        assert _merged_partitions(dask_flags(cluster), three_files[0], keep_order) == {2}
        # one Create of the three files, which dask splits into two partitions
        assert _merged_partitions(dask_flags(cluster) + ["--dask_npartitions=2"],
                                  three_files[0], keep_order, npartitions=2) == {2}


def test_read_partitions(cluster, caplog, tmp_path):
    def on_dask(*flags):
        return beam.Pipeline(argv=runners.resolve_runner_flag(["--runner=DaskRunner", *flags]))
    at = f"--dask_client_address={cluster}"
    per = runners.DASK_PARTITIONS_PER_THREAD
    assert runners.read_partitions(on_dask(at), 16, 1024) == 2 * per  # two threads
    assert runners.read_partitions(on_dask(at), 1, 1024) == 1
    assert runners.read_partitions(on_dask(at), 0, 1024) == 1
    assert runners.read_partitions(on_dask(at), 3, 1024) == min(3, 2 * per)
    assert runners.read_partitions(on_dask(at), 1000, 1024) == max(8, 2 * per)  # <= 128 each
    assert runners.read_partitions(on_dask(at, "--dask_npartitions=5"), 16, 1024) == 1
    assert runners.read_partitions(on_dask(at, "--dask_partition_size=5"), 16, 1024) == 1
    # no scheduler answers: one per file, at most `most`, with a warning
    nobody = ["--dask_client_address=tcp://127.0.0.1:9", "--dask_connection_timeout=1"]
    with caplog.at_level("WARNING", logger=runners.__name__):
        assert runners.read_partitions(on_dask(*nobody), 16, 1024) == 16
    assert "could not count the Dask cluster's worker threads" in caplog.text
    assert runners.read_partitions(on_dask(*nobody), 16, 4) == 4
    # a scheduler file that does not exist yet: not waited for
    missing = f"--dask_scheduler_file={tmp_path / 'scheduler.json'}"
    assert runners.read_partitions(on_dask(missing), 16, 1024) == 16
    # a scheduler file that exists: its cluster is asked
    (tmp_path / "cluster.json").write_text(json.dumps({"address": cluster}))
    found = f"--dask_scheduler_file={tmp_path / 'cluster.json'}"
    assert runners.read_partitions(on_dask(found), 16, 1024) == 2 * per
    from dask.system import CPU_COUNT  # Beam's runner starts a cluster of this machine's cores
    assert runners.read_partitions(on_dask(), 100, 1024) == min(100, per * CPU_COUNT)
    import dask.config  # a cluster named in dask's configuration is the one Beam's runner
    # joins: asked (here it does not answer), not taken for a local one of CPU_COUNT threads
    with dask.config.set({"scheduler-address": "tcp://127.0.0.1:9"}):
        assert runners.read_partitions(on_dask("--dask_connection_timeout=1"), 16, 1024) == 16
    # any other runner: one per file (it redistributes the files itself)
    assert runners.read_partitions(beam.Pipeline(), 16, 1024) == 16


@pytest.mark.parametrize("name", ["weighted-gaussian", "sips", "policy-gaussian", "gw"])
def test_several_input_files_release_what_the_direct_runner_releases(cluster, three_files,
                                                                     reference, name,
                                                                     tmp_path):
    _, items = reference(name)
    _, direct = run_select(three_files, name, ["--runner=DirectRunner"], str(tmp_path / "d"))
    assert direct == items  # the same records, in the same order
    _, other = run_select(three_files, name, dask_flags(cluster), str(tmp_path / "k"))
    assert other == direct


def test_files_dealt_two_to_a_partition_release_the_same(cluster, three_files, data,
                                                         tmp_path, monkeypatch):
    # one partition per thread: the three files in two partitions, one of them reading
    # two files; GW's first-occurrence order (files in sorted order) is the same
    monkeypatch.setattr(runners, "DASK_PARTITIONS_PER_THREAD", 1)

    def release(runner_flags, out):
        select_partitions.run(["--input", three_files[0], "--output", str(tmp_path / out),
                               "--mechanism", "gw", "--tie-break", "first-occurrence",
                               "--epsilon", "2", "--delta", "1e-5", "--insecure-test-seed",
                               "17", "--quiet"] + runner_flags)
        return items_of(str(tmp_path / out))
    direct = release(["--runner=DirectRunner"], "d")
    assert direct and release(dask_flags(cluster), "k") == direct


def test_compare_runs_on_dask(cluster, data, tmp_path):
    """``compare --engine beam`` hands the Dask flags to every trial's pipeline."""
    from beam_dpsu.pipelines import compare
    path, _ = data
    flags = ["--input", path, "--delta", "1e-6", "--epsilon", "2", "--trials", "1",
             "--engine", "beam", "--insecure-test-seed", "9",
             "--mechanisms", "weighted-gaussian:max_items=5,sips:max_items=5"]
    direct = compare.run(flags + ["--output", str(tmp_path / "d")], progress=lambda m: None)
    dask = compare.run(flags + ["--output", str(tmp_path / "k")] + dask_flags(cluster),
                       progress=lambda m: None)
    for d, k in zip(direct["results"], dask["results"]):
        # the same seeded trials: the same releases on both runners
        assert k["released"] == d["released"] and d["released"][0] > 0


@pytest.mark.parametrize("command", ["top-k discover-peel", "hitting-set"])
def test_discovery_then_peeling_on_dask(cluster, data, tmp_path, command):
    # Discovery (Weighted Gaussian), the domain as a side input, then one peeling pass:
    # the same rows on Dask as on the DirectRunner under one test seed.
    from beam_dpsu.pipelines import hitting_set
    path, _ = data
    flags = ["--input", path, "--k", "5", "--epsilon", "2", "--delta", "1e-6",
             "--max-items-per-user", "10", "--insecure-test-seed", "4"]
    run = hitting_set.run if command == "hitting-set" else top_k.run
    if command != "hitting-set":
        flags += ["--method", "discover-peel"]
    run(flags + ["--output", str(tmp_path / "d"), "--runner=DirectRunner"])
    run(flags + ["--output", str(tmp_path / "k")] + dask_flags(cluster))
    direct = items_of(str(tmp_path / "d"))
    assert direct and items_of(str(tmp_path / "k")) == direct


def _sizes_of_windowed_values(n, payload_bytes):
    """Dask's ``sizeof`` of one ``WindowedValue`` holding ``payload_bytes`` bytes and of
    a list of ``n`` of them (as a bag partition of Beam's Dask runner)."""
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.windowed_value import WindowedValue
    from dask.sizeof import sizeof
    wv = WindowedValue((7, b"x" * payload_bytes), 0, (GlobalWindow(),))
    return sizeof(wv), sizeof([wv] * n)


def test_workers_count_the_true_size_of_beams_elements(cluster):
    # Beam's Dask runner hands Dask WindowedValues (a GroupByKey's input values);
    # without the package's dask.sizeof entry point (setup.py,
    # transforms/_dask_sizeof.py) Dask counted each as ~100 bytes, so a worker
    # never spilled the Arrow messages it held and paused, full.
    from importlib.metadata import entry_points
    names = {e.value for e in entry_points(group="dask.sizeof")}
    assert "beam_dpsu.transforms._dask_sizeof:register_beam_sizes" in names, (
        f"the installed beam_dpsu declares no dask.sizeof entry point ({names}): "
        f"reinstall it (pip install -e .)")
    payload = 1 << 20
    one, many = _sizes_of_windowed_values(50, payload)
    assert payload <= one < payload + 1000 and 50 * payload <= many < 50 * (payload + 1000)
    with distributed.Client(cluster) as client:
        on_workers = client.run(_sizes_of_windowed_values, 50, payload)
    assert len(on_workers) == 2 and set(on_workers.values()) == {(one, many)}


def _writer_of(path, pids):
    """The pid among ``pids`` that has ``path`` open (Linux's /proc), or None."""
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                    return pid
            except OSError:
                pass
    return None


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux's /proc")
def test_a_worker_killed_mid_run_does_not_change_the_release(tmp_path_factory, tmp_path):
    # A cluster of its own (the module's keeps its workers). The worker writing the
    # first staged file is killed (SIGKILL; its nanny starts a new one) while it
    # writes: the task runs again elsewhere and writes a new file (the staged files
    # outnumber those of a run without failure: one per input file and one per user
    # group), the dead attempt's partial file is never read, and the release is the
    # DirectRunner's.
    import signal
    import threading
    import time
    from beam_dpsu.dp.evaluation import synthetic
    from beam_dpsu.dp.data.columnar import user_groups_for
    folder = tmp_path_factory.mktemp("killed")
    path = str(folder / "all.tsv")
    synthetic.write_tsv(path, 4000, seed=3, max_occurrences=60)
    lines = open(path, encoding="utf-8").read().splitlines(keepends=True)
    step = -(-len(lines) // 6)
    for i in range(6):
        (folder / f"part-{i}.tsv").write_text("".join(lines[i * step:(i + 1) * step]))
    files = (str(folder / "part-*.tsv"), None)
    untroubled = 6 + user_groups_for(os.path.getsize(path))  # staged files of a clean run
    _, direct = run_select(files, "weighted-gaussian", ["--runner=DirectRunner"],
                           str(tmp_path / "d"))
    assert direct
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = ROOT + (os.pathsep + old if old else "")
    staged = str(tmp_path / "beam-temp-k.PRIVATE-staging-*" / "*.blocks")
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None) as c, \
                distributed.Client(c) as client:
            pids = list(client.run(os.getpid).values())
            out = str(tmp_path / "k")
            result = {}

            def run():
                try:
                    result["items"] = run_select(files, "weighted-gaussian",
                                                 dask_flags(c.scheduler_address), out)[1]
                except BaseException as e:  # reported below
                    result["error"] = e
            thread = threading.Thread(target=run)
            thread.start()
            killed, seen = None, set()
            deadline = time.time() + 300
            while thread.is_alive() and time.time() < deadline:
                now = set(glob.glob(staged))
                seen |= now
                for name in sorted(now) if killed is None else ():
                    writer = _writer_of(name, pids)  # None once the file is closed
                    if writer is not None:
                        os.kill(writer, signal.SIGKILL)
                        killed = writer
                        break
                time.sleep(0.005)
            thread.join(600)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    assert killed is not None, "no worker was caught writing a staged file"
    assert "error" not in result, result.get("error")
    assert result["items"] == direct
    assert len(seen) > untroubled  # the killed attempt's task ran again
    assert not glob.glob(str(tmp_path / "beam-temp-*"))


def test_beams_own_read_is_refused_while_the_pipeline_is_built(tmp_path):
    # ReadFromText's Impulse is not executed by Beam's Dask runner (an AttributeError
    # deep inside Beam when it runs): the library's transforms refuse it in one line
    # naming what to use instead; nothing is run, no cluster is needed
    from beam_dpsu.dp.mechanisms.adaptive import Adaptive
    from beam_dpsu.dp.mechanisms.topk import TopKMechanism
    from beam_dpsu.transforms.select import SelectPartitions
    from beam_dpsu.transforms.topk import TopK
    path = tmp_path / "in.tsv"
    path.write_text("u1\ta\n")
    for transform in (SelectPartitions(Adaptive(1.0, 1e-6, 5)), TopK(TopKMechanism(2, 1.0, 1e-6))):
        p = beam.Pipeline(options=runners.pipeline_options(
            ["--runner=DaskRunner", "--dask_client_address=tcp://127.0.0.1:9"]))
        pairs = (p | beam.io.ReadFromText(str(path))
                 | beam.Map(lambda line: tuple(line.split("\t", 1))))
        with pytest.raises(ValueError) as refused:
            pairs | transform
        message = str(refused.value)
        assert "\n" not in message and "columnar.SelectFromText" in message
        assert "ReadFromText" in message
    # the same pipeline from a Create, and ReadFromText on the DirectRunner, are accepted
    p = beam.Pipeline(options=runners.pipeline_options(
        ["--runner=DaskRunner", "--dask_client_address=tcp://127.0.0.1:9"]))
    p | beam.Create([("u1", "a")]) | SelectPartitions(Adaptive(1.0, 1e-6, 5))
    p = beam.Pipeline(options=runners.pipeline_options(["--runner=DirectRunner"]))
    (p | beam.io.ReadFromText(str(path)) | beam.Map(lambda line: tuple(line.split("\t", 1)))
     | SelectPartitions(Adaptive(1.0, 1e-6, 5)))


def test_relative_paths_are_the_launchers_on_a_cluster(cluster, tmp_path, monkeypatch):
    # the workers run in the directory the cluster started in, not the launcher's: every
    # relative path (command line and WriteRelease) means the launcher's directory
    from beam_dpsu.dp.mechanisms.histogram_threshold import WeightedGaussian
    from beam_dpsu.transforms.select import SelectPartitions
    from beam_dpsu.transforms.write import WriteRelease
    with distributed.Client(cluster) as client:
        worker_dirs = set(client.run(os.getcwd).values())
    here = tmp_path / "launcher"
    here.mkdir()
    assert str(here) not in worker_dirs
    monkeypatch.chdir(here)
    (here / "in.tsv").write_text("".join(f"u{i}\ti{i % 3}\n" for i in range(200)))
    select_partitions.run(["--input", "in.tsv", "--output", "rel", "--mechanism",
                           "weighted-gaussian", "--epsilon", "2", "--delta", "1e-5",
                           "--max-items-per-user", "1", "--insecure-test-seed", "1",
                           "--dead-letter", "dead"] + dask_flags(cluster))
    assert items_of(str(here / "rel")) == ["i0", "i1", "i2"]
    with beam.Pipeline(options=runners.pipeline_options(dask_flags(cluster))) as p:
        (p | beam.Create([(f"user{u}", w) for u in range(300) for w in ("the", "of")])
         | SelectPartitions(WeightedGaussian(epsilon=1.0, delta=1e-9, max_items=20),
                            run_key=None)
         | WriteRelease("vocabulary.txt"))
    assert open(here / "vocabulary.txt").read().split() == ["of", "the"]
    for folder in worker_dirs:                        # nothing on the workers' side
        assert not glob.glob(os.path.join(folder, "rel*")), folder
        assert not glob.glob(os.path.join(folder, "vocabulary.txt*")), folder


def _slow_release_write(markers, seconds):
    """On a worker: the release's write (``write.write_one_file``) marks in ``markers``
    that it started, sleeps ``seconds``, writes, then marks that it ended."""
    import time
    from beam_dpsu.transforms import write
    original = getattr(write, "_unslowed_write_one_file", write.write_one_file)
    write._unslowed_write_one_file = original

    def slow(path, parts):
        open(os.path.join(markers, "started"), "w").close()
        time.sleep(seconds)
        try:
            original(path, parts)
        finally:
            open(os.path.join(markers, "ended"), "w").close()
    write.write_one_file = slow


def _restore_release_write():
    from beam_dpsu.transforms import write
    write.write_one_file = getattr(write, "_unslowed_write_one_file", write.write_one_file)


def test_a_launcher_failing_mid_run_leaves_nothing_anywhere(cluster, tmp_path_factory,
                                                            tmp_path, monkeypatch):
    # The launcher is interrupted while a worker writes the release: the job must not
    # go on to write it (or the run's counts) after the launcher's clean-up, neither
    # next to --output nor in the workers' directory.
    import time
    from apache_beam.runners.dask.dask_runner import DaskRunnerResult
    markers = str(tmp_path_factory.mktemp("markers"))
    started, ended = os.path.join(markers, "started"), os.path.join(markers, "ended")

    def interrupted(self, duration=None):  # Ctrl-C once the release's write has begun
        deadline = time.time() + 120
        while not os.path.exists(started) and time.time() < deadline:
            time.sleep(0.01)
        raise KeyboardInterrupt
    monkeypatch.setattr(DaskRunnerResult, "wait_until_finish", interrupted)
    path = tmp_path / "in.tsv"
    path.write_text("".join(f"u{i}\ti{i % 3}\n" for i in range(200)))
    with distributed.Client(cluster) as client:
        worker_dirs = set(client.run(os.getcwd).values())
        client.run(_slow_release_write, markers, 3.0)
        try:
            with pytest.raises(KeyboardInterrupt):
                select_partitions.run(["--input", str(path), "--output", str(tmp_path / "rel"),
                                       "--mechanism", "weighted-gaussian", "--epsilon", "2",
                                       "--delta", "1e-5", "--max-items-per-user", "1",
                                       "--dead-letter", str(tmp_path / "dead")]
                                      + dask_flags(cluster))
            assert os.path.exists(started)
            deadline = time.time() + 60  # until the job would have finished
            while not os.path.exists(ended) and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)
        finally:
            client.run(_restore_release_write)
    assert os.path.exists(ended)
    assert sorted(os.listdir(tmp_path)) == ["in.tsv"]  # no release, counts or temp file
    for folder in worker_dirs:
        assert not glob.glob(os.path.join(folder, "rel*")), folder
        assert not glob.glob(os.path.join(folder, "beam-temp-rel*")), folder
