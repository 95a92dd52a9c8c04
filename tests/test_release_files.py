"""What a release pipeline leaves on disk reveals nothing beyond the released set.

* the items file's line order is a function of the released set alone (a
  canary user whose lines come first in the input is not at the top of it),
  for every mechanism, on the pure-Python path and with numba;
* a second run never mixes its release with an earlier one under one prefix;
* ``PREFIX.json`` (publishable) holds no exact count, input path or timing;
  those are in the owner-only ``PREFIX.PRIVATE-run-details.json`` (mode 0600);
* bad input is reported (warning, or an error that leaves nothing behind);
* a test seed needs ``--insecure-test-seed``, warns and is recorded.
"""
import glob
import json
import os
import socket
import stat
import subprocess
import sys

import numpy as np
import pytest

from beam_dpsu.dp.data import kernels
from beam_dpsu.dp.mechanisms.registry import REGISTRY
from beam_dpsu.pipelines import select_partitions, top_k
from conftest import without_progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITEMS = "-items-00000-of-00001"
PRIVATE = ".PRIVATE-run-details.json"

COMMON = [f"item-{j:02d}" for j in range(8)]
CANARY = [f"zz-canary-{j}" for j in range(4)]  # sort after every common item
BACKGROUND_USERS = 600
SEQUENTIAL = ("policy-laplace", "policy-gaussian", "gw", "gw-kt")

# Every background user holds all 12 items, the canary holds its 4: every item
# has 601 holders and no user more than Δ0 = 12 items, so nothing is sampled.
# ε = 2, δ = 1e-5, α = 20. Margins of each item above its threshold (from the
# mechanisms' describe()): count-laplace 601 − 80.8 = 86 noise scales (6);
# count-gaussian 601 − 36.3 = 79 σ; weighted-laplace 601/12 − 6.7 = 86 scales
# (0.5); weighted-gaussian 601/√12 − 10.5 = 79 σ; sips round 0 173.5 − 43.6 =
# 16 σ; truncated-geometric keeps a count of 601 with probability exactly 1;
# adaptive: each item's estimate is in bucket 4 or 5 (unless its noise exceeds 28σ_E, when
# it would be light), so its users give it W/8 or more and its statistic
# 0.2·173.5 + 0.8·21.7 = 52.0 is 19.9 σ above T = 10.9; adaptive-2r's first round
# releases it (173.5 − T₀ = 32 σ_E).
# The sequential policies fill each item exactly to the cutoff Γ = T + α·scale
# (the users' budgets, 601 in ℓ1 and 601·√12 in ℓ2, exceed 12·Γ = 201, 197 and
# 622), so the margin is α = 20 scales: an item is missed with probability
# ½e^−20 ≈ 1.03e-9 (Laplace) or Φ(−20) < 1e-88 (Gaussian). Every other margin
# gives a miss probability below 1e-50 per item. Over the 12 items of each of
# the 20 runs below, the chance that any item is missed, i.e. that any of these
# tests fails falsely, is below 20 · 12 · 1.03e-9 < 2.5e-7.
FLAGS = {
    "truncated-geometric": [],
    "count-laplace": [],
    "count-gaussian": [],
    "weighted-laplace": [],
    "weighted-gaussian": [],
    "sips": [],
    "adaptive": [],
    "adaptive-2r": [],
    "policy-laplace": ["--alpha", "20"],
    "policy-gaussian": ["--alpha", "20"],
    "gw": ["--alpha", "20"],
    "gw-kt": ["--alpha", "20"],
}


def test_every_registered_mechanism_is_covered():
    assert set(REGISTRY) == set(FLAGS), sorted(set(REGISTRY) ^ set(FLAGS))


@pytest.fixture(scope="module")
def canary_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("canary")
    lines = [f"canary\t{item}\n" for item in CANARY]  # the canary's lines come FIRST
    for u in range(BACKGROUND_USERS):
        lines += [f"user{u:04d}\t{item}\n" for item in COMMON + CANARY]
    data = folder / "in.tsv"
    data.write_text("".join(lines), encoding="utf-8")
    public = folder / "public.tsv"
    public.write_text("".join(f"{item}\t{1000 - j}\n" for j, item in
                              enumerate(COMMON + CANARY)), encoding="utf-8")
    return str(data), str(public)


@pytest.mark.parametrize("path", ["pure-python", "numba"])
@pytest.mark.parametrize("name", sorted(FLAGS))
def test_canary_first_in_the_input_is_not_first_in_the_release(canary_data, tmp_path,
                                                                 monkeypatch, name, path):
    # Fresh keys (no test seed). False-failure probability: see FLAGS above.
    data, public = canary_data
    built = []
    real_runner = kernels.DenseRunner

    def spy(*args, **kwargs):
        built.append(1)
        return real_runner(*args, **kwargs)

    monkeypatch.setattr(kernels, "DenseRunner", spy)
    if path == "pure-python":
        monkeypatch.setattr(kernels, "available", lambda: False)
    elif not kernels.available():
        pytest.skip("numba is not installed")
    prefix = str(tmp_path / "out")
    extra = (["--max-items-per-user", "12"] if "max_items" in REGISTRY[name].accepts else [])
    extra += ["--public-counts", public] if name == "gw-kt" else []
    summary = select_partitions.run(["--input", data, "--output", prefix, "--mechanism", name,
                                     "--epsilon", "2", "--delta", "1e-5", "--runner=DirectRunner"]
                                    + FLAGS[name] + extra)
    assert summary["seeded"] is False
    if name in SEQUENTIAL:  # the sequential pass took the path under test
        assert built if path == "numba" else not built
    assert glob.glob(prefix + "-items-*") == [prefix + ITEMS]
    with open(prefix + ITEMS, encoding="utf-8") as f:
        lines = f.read().splitlines()
    # Not vacuous: every item is released (the canary's too).
    assert sorted(lines) == sorted(COMMON + CANARY) and summary["num_released"] == 12
    # The order is the released set's own (sorted), not the input's: the canary's
    # items, seen first in the input, are at the bottom, not the top.
    assert lines == sorted(lines)
    assert lines[0] == COMMON[0] and not set(lines[:len(COMMON)]) & set(CANARY)


# -- one release per prefix -----------------------------------------------------

def small_input(tmp_path, users=300):
    path = tmp_path / "in.tsv"
    path.write_text("".join(f"u{u}\tcommon\nu{u}\tx{u % 3}\n" for u in range(users)))
    return str(path)


def sp_args(data, prefix, *extra):
    return ["--input", data, "--output", prefix, "--mechanism", "count-gaussian",
            "--epsilon", "2", "--delta", "1e-6", "--max-items-per-user", "2", *extra]


def outputs(prefix):
    return sorted(os.path.basename(p) for p in glob.glob(prefix + "*"))


def test_a_second_run_is_refused_then_overwrite_replaces_the_first(tmp_path, capsys):
    data = small_input(tmp_path)
    prefix = str(tmp_path / "rel" / "out")
    dead = str(tmp_path / "rel" / "dead")
    assert select_partitions.main(sp_args(data, prefix, "--dead-letter", dead)) == 0
    # Only the release, its two summaries and no probe or temporary file.
    assert outputs(prefix) == ["out" + ITEMS, "out" + PRIVATE, "out.json"]
    assert sorted(os.listdir(tmp_path / "rel")) == ["dead.PRIVATE-dead-letter-00000-of-00001",
                                                    "out" + ITEMS, "out" + PRIVATE, "out.json"]
    before = {p: open(p, "rb").read() for p in glob.glob(prefix + "*")}
    capsys.readouterr()
    for extra in ([], ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]):
        assert select_partitions.main(sp_args(data, prefix, *extra)) == 2
        err = without_progress(capsys.readouterr().err)
        assert len(err) == 1 and "earlier run" in err[0] and "--overwrite" in err[0], err
        assert {p: open(p, "rb").read() for p in glob.glob(prefix + "*")} == before
    # Dead-letter files of an earlier run block a new run too.
    other = str(tmp_path / "rel" / "other")
    assert select_partitions.main(sp_args(data, other, "--dead-letter", dead)) == 2
    assert "dead.PRIVATE-dead-letter-00000-of-00001" in capsys.readouterr().err
    assert not glob.glob(other + "*")
    # --overwrite deletes every earlier output first (also the dead letters the earlier
    # run recorded), then writes one release, here with two worker processes.
    assert select_partitions.main(sp_args(data, prefix, "--overwrite", "--direct_num_workers=2",
                                          "--direct_running_mode=multi_processing")) == 0
    assert outputs(prefix) == ["out" + ITEMS, "out" + PRIVATE, "out.json"]
    assert not glob.glob(dead + "*")
    with open(prefix + PRIVATE) as f:
        assert json.load(f)["dead_letter_files"] is None  # this run's details, not the old
    items = open(prefix + ITEMS).read().splitlines()
    # "common": 300 holders against T = 17.3, σ = 3.25 (count-gaussian, ε = 2, δ = 1e-6,
    # Δ0 = 2): missed with probability Φ(−87), far below 1e-6
    assert items == sorted(items) and "common" in items


def test_top_k_refuses_an_earlier_run_too(tmp_path, capsys):
    data = small_input(tmp_path)
    prefix = str(tmp_path / "out")
    args = ["--input", data, "--output", prefix, "--k", "1", "--epsilon", "1", "--delta", "1e-6"]
    assert top_k.main(args) == 0
    assert outputs(prefix) == ["out" + ITEMS, "out" + PRIVATE, "out.json"]
    os.remove(prefix + ".json")  # any one leftover is enough
    assert top_k.main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert top_k.main(args + ["--overwrite"]) == 0
    assert outputs(prefix) == ["out" + ITEMS, "out" + PRIVATE, "out.json"]


# -- the public summary and the owner-only details --------------------------------

@pytest.mark.parametrize("rounds", [3, 1])
def test_public_summary_holds_no_exact_count_path_or_timing(tmp_path, capsys, rounds):
    # DP-SIPS releases "common" (257 holders, weight 257/√2 ≈ 182 against a round-0
    # threshold near 45 with σ near 8, a margin above 15 σ): a false failure of
    # "num_released > 0" has probability below 1e-50.
    data = small_input(tmp_path, users=257)
    (tmp_path / "in.tsv").write_text(open(data).read() + "junk\n")
    prefix = str(tmp_path / "out")
    old_umask = os.umask(0)  # the owner-only mode must not depend on the umask
    try:
        assert select_partitions.main(sp_args(data, prefix, "--mechanism", "sips",
                                              "--rounds", str(rounds))) == 0
    finally:
        os.umask(old_umask)
    printed = json.loads(capsys.readouterr().out)
    public_text = open(prefix + ".json", encoding="utf-8").read()
    public = json.loads(public_text)
    private = json.load(open(prefix + PRIVATE, encoding="utf-8"))
    assert private["num_users"] == 257 and private["malformed_lines"] == 1
    assert private["input"] == data and private["wall_seconds"] >= 0
    assert private["runner"] == "DirectRunner" and "NEVER PUBLISH" in private["NEVER_PUBLISH"]
    assert stat.S_IMODE(os.stat(prefix + PRIVATE).st_mode) == 0o600
    for forbidden in ("num_users", "malformed_lines", "input", "runner", "wall_seconds",
                      "dead_letter", "PRIVATE_run_details"):
        assert forbidden not in public and forbidden not in printed, forbidden
    assert str(tmp_path) not in public_text
    assert set(printed) <= set(public) and printed["num_released"] == public["num_released"]
    # Released counts (per round for DP-SIPS), the guarantee, the version, the seed.
    assert public["num_released"] == sum(r["released"] for r in public["per_round"]) > 0
    assert {"epsilon", "delta", "rho", "threshold", "beam_dpsu_version",
            "insecure_test_seed"} <= set(public)
    assert public["items_file"] == "out" + ITEMS and "never be published" in public["note"]


# -- bad input ------------------------------------------------------------------

def test_a_file_without_a_tab_is_an_error_and_leaves_nothing(tmp_path, capsys):
    path = tmp_path / "notab.txt"
    path.write_text("".join(f"user {u} item\n" for u in range(50)))
    dest = tmp_path / "new" / "dir"
    rc = select_partitions.main(sp_args(str(path), str(dest / "out")))
    err = without_progress(capsys.readouterr().err)
    assert rc == 1 and len(err) == 1, err
    assert "no well-formed" in err[0] and "malformed" not in err[0]  # counts: --verbose
    assert sorted(os.listdir(tmp_path)) == ["notab.txt"]  # no release, no dirs, no temp


def test_malformed_lines_give_a_one_line_warning_with_the_count(tmp_path, capsys):
    data = small_input(tmp_path)  # 600 good lines
    (tmp_path / "in.tsv").write_text(open(data).read() + "bad\n" * 600)
    assert select_partitions.main(sp_args(data, str(tmp_path / "out"))) == 0
    err = without_progress(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("WARNING: malformed input lines were skipped"), err
    assert "600" not in err[0]  # the count is in the private run details (or --verbose)


def test_clean_input_gives_no_warning(tmp_path, capsys):
    data = small_input(tmp_path)
    assert select_partitions.main(sp_args(data, str(tmp_path / "out"))) == 0
    assert without_progress(capsys.readouterr().err) == []


def _gzip_bytes(text):
    import gzip
    return gzip.compress(text.encode(), mtime=0)


@pytest.mark.parametrize("name,content,reason", [
    ("pic.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 8, "a PNG image"),
    ("data.tsv", _gzip_bytes("u1\ta\nu2\tb\n" * 50), "gzip-compressed (name it .gz)"),
    ("blob.bin", np.random.default_rng(5).integers(0, 256, 50000, np.uint8).tobytes(),
     "not UTF-8"),
    ("utf16.tsv", "u1\ta\nu2\tb\n".encode("utf-16-le") * 50, "NUL"),
], ids=["png", "gzip-named-tsv", "random-bytes", "utf-16"])
@pytest.mark.parametrize("flags", [[], ["--tabs-in-items", "--trust-columns"]])
def test_input_that_is_not_text_is_refused_as_such(tmp_path, capsys, name, content, reason,
                                                   flags):
    # a binary input used to be refused for its tab-separated fields, or not at all
    path = tmp_path / name
    path.write_bytes(content)
    check_refused(tmp_path, capsys, sp_args(str(path), str(tmp_path / "o"), *flags),
                  f"{path} is not user<TAB>item text: ")
    from beam_dpsu.dp.data.lines import not_text_reason, sniff_head
    assert reason in not_text_reason(sniff_head(str(path)))


def test_text_with_odd_bytes_is_still_text():
    from beam_dpsu.dp.data.lines import not_text_reason
    # an item with a NUL, a few invalid lines (skipped as malformed), a cut character
    for head in (b"", b"u1\ta\n", "u\té\u00ff\n".encode(), b"u1\t\xff\xfe\nu2\ta\nu3\tb\n",
                 b"\xef\xbb\xbfu\ta\n", b"user1\tan item with a \x00 inside\n" * 3, "u\t日本".encode()[:-1],
                 # text lines that start like a binary format's signature
                 b"BZhang\tpizza\n", b"PAR1\titem\n", b"%PDF\tmanual\n", b"%PDF-1.4\tpdf\n"):
        assert not_text_reason(head) is None, head


def check_refused(tmp_path, capsys, argv, message, main=select_partitions.main):
    before = sorted(os.listdir(tmp_path))
    rc = main(argv)
    err = without_progress(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert sorted(os.listdir(tmp_path)) == before  # nothing created: no dirs, temp or probe


def test_a_directory_as_input_exits_2_before_running(tmp_path, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "part-0.tsv").write_text("u\ti\n")
    out = str(tmp_path / "new" / "out")
    check_refused(tmp_path, capsys, sp_args(str(folder), out), "is a directory")
    check_refused(tmp_path, capsys, ["--input", str(folder), "--output", out, "--k", "1",
                                     "--epsilon", "1", "--delta", "1e-6"], "is a directory",
                  main=top_k.main)


def test_a_directory_as_input_in_a_subprocess_has_no_traceback(tmp_path):
    (tmp_path / "data").mkdir()
    proc = subprocess.run([sys.executable, "-m", "pipelines.select_partitions"] +
                          sp_args(str(tmp_path / "data"), str(tmp_path / "out")),
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [l for l in proc.stderr.splitlines() if l.startswith("select_partitions")] == [
        f"select_partitions: error: input {str(tmp_path / 'data')!r} is a directory; give "
        f"files or a glob, e.g. --input {str(tmp_path / 'data' / '*')!r}"]
    assert sorted(os.listdir(tmp_path)) == ["data"]


def test_an_unreadable_input_exits_2(tmp_path, capsys):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "in.sock"))  # a file nobody, not even root, can open
    try:
        check_refused(tmp_path, capsys, sp_args(str(tmp_path / "in.sock"),
                                                str(tmp_path / "out")), "cannot read input")
    finally:
        sock.close()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root reads files whatever their mode")
def test_an_input_without_read_permission_exits_2(tmp_path, capsys):
    path = tmp_path / "in.tsv"
    path.write_text("u\ti\n")
    path.chmod(0)
    check_refused(tmp_path, capsys, sp_args(str(path), str(tmp_path / "out")),
                  "cannot read input")


def test_an_output_that_cannot_be_written_exits_2_leaving_nothing(tmp_path, capsys):
    data = small_input(tmp_path)
    (tmp_path / "blocker").write_text("")
    check_refused(tmp_path, capsys, sp_args(data, str(tmp_path / "blocker" / "a" / "out")),
                  "is not a directory")
    check_refused(tmp_path, capsys, sp_args(data, str(tmp_path / "out"), "--dead-letter",
                                            str(tmp_path / "blocker" / "dead")),
                  "cannot write to")
    check_refused(tmp_path, capsys, sp_args(data, str(tmp_path) + "/"), "ends with a separator")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes in any directory")
def test_a_read_only_output_directory_exits_2(tmp_path, capsys):
    data = small_input(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        check_refused(tmp_path, capsys, sp_args(data, str(locked / "sub" / "out")),
                      "no permission")
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o755)


def test_permission_refusals_exit_2_whoever_runs_the_tests(tmp_path, capsys, monkeypatch):
    # The two tests above are skipped as root, who may read and write anything;
    # here the system's refusals are simulated, so the same checks run as root too.
    data = small_input(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    real_open, real_access = os.open, os.access

    def refusing_open(path, *args, **kwargs):
        if os.fspath(path) == data:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    def refusing_access(path, mode, *args, **kwargs):
        if os.fspath(path) in (data, str(locked)):
            return False
        return real_access(path, mode, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(os, "open", refusing_open)
        check_refused(tmp_path, capsys, sp_args(data, str(tmp_path / "out")),
                      "cannot read input file")
    with monkeypatch.context() as m:   # open succeeds, but the read bit is missing
        m.setattr(os, "access", refusing_access)
        check_refused(tmp_path, capsys, sp_args(data, str(tmp_path / "out")),
                      "permission denied")
        check_refused(tmp_path, capsys, sp_args(small_input(tmp_path / "locked"),
                                                str(locked / "sub" / "out")),
                      "no permission")
    assert os.listdir(locked) == ["in.tsv"]


class _FileSystemsWithoutDelete:
    """``runners.FileSystems`` whose ``delete`` fails: ``write_one_file`` cannot remove its
    temporary file, so only the launcher's cleanup can."""

    def __getattr__(self, name):
        from apache_beam.io.filesystems import FileSystems
        return getattr(FileSystems, name)

    @staticmethod
    def delete(paths):
        raise OSError("no delete")


def test_a_failed_run_leaves_no_temporary_file(tmp_path, capsys, monkeypatch):
    # A failure inside the pipeline (writing the items file raises half way, in-process,
    # and the writer cannot delete its temporary file) exits 1 with one line, leaves no
    # partial release, and the launcher removes the temporary file and the output
    # directory the run created.
    from beam_dpsu.transforms import write
    data = small_input(tmp_path)
    seen = []
    real_write = write._write_parts

    def failing_write(f, parts):
        real_write(f, list(parts)[:1])
        f.flush()
        seen.extend((p, os.path.getsize(p))
                    for p in glob.glob(str(tmp_path / "new" / "beam-temp-out-items-*")))
        raise RuntimeError("injected failure")

    monkeypatch.setattr(write, "_write_parts", failing_write)
    monkeypatch.setattr(write, "FileSystems", _FileSystemsWithoutDelete())
    rc = select_partitions.main(sp_args(data, str(tmp_path / "new" / "out")))
    err = without_progress(capsys.readouterr().err)
    assert rc == 1 and len(err) == 1 and "injected failure" in err[0], err
    assert len(seen) == 1 and seen[0][1] > 0  # it existed, partly written
    assert sorted(os.listdir(tmp_path)) == ["in.tsv"]


def test_a_failed_run_keeps_temporary_files_it_did_not_make(tmp_path, capsys, monkeypatch):
    # Only what the failing run made is removed: a temporary file that was there before
    # (a killed run's) stays, and so do other prefixes' (concurrent runs).
    from beam_dpsu.transforms import write
    data = small_input(tmp_path)
    (tmp_path / "new").mkdir()
    before = tmp_path / "new" / "beam-temp-out-items-00000-of-00001-old"
    before.write_text("x")

    others = ["beam-temp-out2-items-00000-of-00001-abc",  # prefixes out2, out-2, out-top
              "beam-temp-out-2-items-00000-of-00001-abc",
              "beam-temp-out-top-items-00000-of-00001-abc",
              "beam-temp-out-2.PRIVATE-staging-abc"]

    def failing_write(f, parts):
        for name in others:
            (tmp_path / "new" / name).write_text("y")
        raise RuntimeError("injected failure")

    monkeypatch.setattr(write, "_write_parts", failing_write)
    monkeypatch.setattr(write, "FileSystems", _FileSystemsWithoutDelete())
    assert select_partitions.main(sp_args(data, str(tmp_path / "new" / "out"))) == 1
    assert sorted(os.listdir(tmp_path / "new")) == sorted([before.name, *others])


def test_a_release_counted_but_not_written_fails_the_run(tmp_path, capsys, monkeypatch):
    # A missing items file is created empty only for an empty release: when the run
    # counted released items, a missing file is an error, never an empty release.
    from beam_dpsu.transforms import write
    data = small_input(tmp_path)
    monkeypatch.setattr(write, "write_one_file", lambda path, parts: None)
    rc = select_partitions.main(sp_args(data, str(tmp_path / "out")))
    err = without_progress(capsys.readouterr().err)
    assert rc == 1 and len(err) == 1 and "released item(s) but wrote no" in err[0], err


# -- top-k's stated ε -------------------------------------------------------------

def test_top_k_prints_the_query_guarantee_as_epsilon(tmp_path, capsys):
    from beam_dpsu.dp.mechanisms.topk import TopKMechanism
    data = small_input(tmp_path)
    prefix = str(tmp_path / "out")
    # --epsilon is the whole query's: stated as given, the per-selection ε calibrated
    assert top_k.main(["--input", data, "--output", prefix, "--k", "10", "--epsilon", "1",
                       "--delta", "1e-6"]) == 0
    printed = json.loads(capsys.readouterr().out)
    public = json.load(open(prefix + ".json"))
    whole = TopKMechanism(k=10, epsilon=1.0, delta=1e-6)
    for out in (printed, public):
        assert (out["epsilon"], out["delta"]) == (1.0, 1e-6)
        assert out["epsilon_per_selection"] == whole.epsilon_per_selection < 1.0
    # --epsilon-per-selection 1: ten selections of ε = 1 each, composed
    assert top_k.main(["--input", data, "--output", prefix, "--k", "10",
                       "--epsilon-per-selection", "1", "--delta", "1e-6", "--overwrite"]) == 0
    printed = json.loads(capsys.readouterr().out)
    public = json.load(open(prefix + ".json"))
    query = TopKMechanism(k=10, epsilon_per_selection=1.0, delta=1e-6).guarantee
    assert query.epsilon > 8
    assert public["epsilon"] == query.epsilon and public["delta"] == query.delta
    assert printed["epsilon"] == 8.84589  # readable, rounded up
    assert public["epsilon_per_selection"] == printed["epsilon_per_selection"] == 1.0
    # With counts (Algorithm 1) the flag's ε is already the query's.
    prefix2 = str(tmp_path / "out2")
    assert top_k.main(["--input", data, "--output", prefix2, "--k", "2", "--epsilon", "3",
                       "--delta", "1e-6", "--with-counts", "--max-items-per-user", "2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["epsilon"] == 3.0 and printed["epsilon_per_selection"] is None


# -- test seeds -----------------------------------------------------------------------

@pytest.mark.parametrize("seed_args", [["--seed", "5"], ["--seed=5"], ["--seed"]])
def test_seed_is_refused_with_a_pointer_to_the_insecure_flag(tmp_path, capsys, seed_args):
    data = small_input(tmp_path)
    check_refused(tmp_path, capsys, sp_args(data, str(tmp_path / "out"), *seed_args),
                  "use --insecure-test-seed N")
    check_refused(tmp_path, capsys, ["--input", data, "--output", str(tmp_path / "o"),
                                     "--k", "1", "--epsilon", "1", "--delta", "1e-6",
                                     *seed_args], "use --insecure-test-seed N", main=top_k.main)


def test_insecure_test_seed_warns_is_recorded_and_reproduces(tmp_path, capsys):
    data = small_input(tmp_path)
    outs = []
    for name in ("a", "b"):
        prefix = str(tmp_path / name)
        assert select_partitions.main(sp_args(data, prefix, "--insecure-test-seed", "77")) == 0
        captured = capsys.readouterr()
        err = without_progress(captured.err)
        assert len(err) == 1 and "--insecure-test-seed" in err[0] and "NOT private" in err[0]
        assert json.loads(captured.out)["insecure_test_seed"] == 77
        public = json.load(open(prefix + ".json"))
        assert public["insecure_test_seed"] == 77 and public["seeded"] is True
        assert "NOT private" in public["note"]
        outs.append(open(prefix + ITEMS).read())
    assert outs[0] == outs[1]
    assert select_partitions.main(sp_args(data, str(tmp_path / "c"))) == 0
    captured = capsys.readouterr()
    assert without_progress(captured.err) == [] and "insecure_test_seed" not in json.loads(captured.out)
    public = json.load(open(str(tmp_path / "c") + ".json"))
    assert public["insecure_test_seed"] is None and public["seeded"] is False


def test_a_bare_relative_prefix_keeps_its_release_and_is_refused_when_stale(tmp_path,
                                                                            monkeypatch, capsys):
    # `--output out` (no directory): Beam's local match finds nothing for a bare relative
    # glob, which once hid the written items file: it was then truncated to an empty file
    # and a second run into the same prefix was not refused. Deterministic (test seed).
    from beam_dpsu.dp.evaluation import synthetic
    from beam_dpsu.pipelines import select_partitions
    data = tmp_path / "in.tsv"
    synthetic.write_tsv(str(data), 300, seed=2, max_occurrences=40)
    monkeypatch.chdir(tmp_path)
    args = ["--input", "in.tsv", "--output", "out", "--mechanism", "weighted-gaussian",
            "--epsilon", "2", "--delta", "1e-6", "--max-items-per-user", "20",
            "--insecure-test-seed", "4"]
    assert select_partitions.main(args) == 0
    released = (tmp_path / "out-items-00000-of-00001").read_text().split()
    summary = json.loads((tmp_path / "out.json").read_text())
    assert released and len(released) == summary["num_released"]
    capsys.readouterr()
    assert select_partitions.main(args) == 2
    assert "earlier run" in capsys.readouterr().err
