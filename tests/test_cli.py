"""The select_partitions command line: contract, summary, validation."""
import glob
import json
import os
import subprocess
import sys

import pytest

from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.pipelines import generate, select_partitions
from conftest import without_progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("data") / "syn.tsv.gz")
    synthetic.write_tsv(path, 2000, seed=1)
    return path


def read_items(prefix):
    items = []
    for path in sorted(glob.glob(prefix + "-items-*")):
        with open(path, encoding="utf-8") as f:
            items += f.read().splitlines()
    return items


def read_private(prefix):
    with open(prefix + ".PRIVATE-run-details.json") as f:
        return json.load(f)


def test_run_writes_items_and_summary(data, tmp_prefix):
    rc = select_partitions.main(["--input", data, "--output", tmp_prefix,
                                 "--mechanism", "weighted-gaussian", "--epsilon", "1",
                                 "--delta", "1e-6", "--max-items-per-user", "20",
                                 "--insecure-test-seed", "5"])
    assert rc == 0
    with open(tmp_prefix + ".json") as f:
        summary = json.load(f)
    for key in ("mechanism", "epsilon", "delta", "rho", "threshold", "noise_scale",
                "max_items_per_user", "num_released", "seeded", "insecure_test_seed",
                "beam_dpsu_version"):
        assert key in summary, key
    for key in ("num_users", "malformed_lines", "runner", "wall_seconds", "input"):
        assert key not in summary, key
    assert summary["mechanism"] == "weighted-gaussian"
    assert summary["epsilon"] == 1 and summary["delta"] == 1e-6 and summary["rho"] is None
    assert summary["seeded"] is True and summary["insecure_test_seed"] == 5
    assert summary["max_items_per_user"] == 20 and isinstance(summary["threshold"], list)
    private = read_private(tmp_prefix)
    assert private["num_users"] == 2000 and private["malformed_lines"] == 0
    assert private["runner"] == "DirectRunner" and private["input"] == data
    assert "NEVER PUBLISH" in private["NEVER_PUBLISH"]
    assert glob.glob(tmp_prefix + "-items-*") == [tmp_prefix + "-items-00000-of-00001"]
    items = read_items(tmp_prefix)
    assert len(items) == summary["num_released"] > 0
    assert "i1" in items and len(set(items)) == len(items) and items == sorted(items)


def test_same_seed_same_release_and_fresh_runs_are_unseeded(data, tmp_path):
    args = ["--input", data, "--mechanism", "count-gaussian", "--epsilon", "1", "--delta", "1e-6",
            "--max-items-per-user", "10"]
    outs = []
    seeded = ["--insecure-test-seed", "9"]
    for name, extra in (("a", seeded), ("b", seeded), ("c", [])):
        prefix = str(tmp_path / name)
        assert select_partitions.main(args + ["--output", prefix] + extra) == 0
        outs.append(sorted(read_items(prefix)))
        with open(prefix + ".json") as f:
            assert json.load(f)["seeded"] is (name != "c")
    assert outs[0] == outs[1]


def test_zcdp_summary(data, tmp_prefix):
    assert select_partitions.main(["--input", data, "--output", tmp_prefix, "--mechanism",
                                   "weighted-gaussian", "--rho", "0.1", "--delta", "1e-5"]) == 0
    with open(tmp_prefix + ".json") as f:
        s = json.load(f)
    assert s["rho"] == 0.1 and s["zcdp_delta"] == 1e-5 and s["delta"] == 2e-5
    assert s["threshold"][0] == pytest.approx(11.7260702142162, rel=1e-8)


def test_malformed_lines_are_counted(tmp_path, tmp_prefix):
    path = tmp_path / "in.tsv"
    path.write_bytes(b"".join(b"u%d\tpopular\n" % u for u in range(300)) + b"junk\n\tx\n")
    assert select_partitions.main(["--input", str(path), "--output", tmp_prefix, "--mechanism",
                                   "count-laplace", "--epsilon", "1", "--delta", "1e-6",
                                   "--max-items-per-user", "1"]) == 0
    s = read_private(tmp_prefix)
    assert s["malformed_lines"] == 2 and s["num_users"] == 300
    # 300 holders against T = 14.12 with Laplace noise of scale 1: not released with
    # probability e^-285.9 / 2 (false failure far below 1e-6)
    assert read_items(tmp_prefix) == ["popular"]


def test_empty_input_is_an_error_and_releases_nothing(tmp_path, tmp_prefix, capsys):
    path = tmp_path / "empty.tsv"
    path.write_bytes(b"")
    assert select_partitions.main(["--input", str(path), "--output", tmp_prefix, "--mechanism",
                                   "weighted-laplace", "--epsilon", "1", "--delta", "1e-6"]) == 1
    err = without_progress(capsys.readouterr().err)
    assert err == [f"select_partitions: error: no well-formed user<TAB>item line in "
                   f"{str(path)!r}: nothing released"]
    assert sorted(os.listdir(tmp_path)) == ["empty.tsv"]


@pytest.mark.parametrize("argv,message", [
    (["--mechanism", "nope", "--epsilon", "1", "--delta", "1e-5"], "unknown mechanism"),
    (["--mechanism", "count-gaussian", "--epsilon", "0", "--delta", "1e-5"], "--epsilon"),
    (["--mechanism", "count-gaussian", "--epsilon", "-2", "--delta", "1e-5"], "--epsilon"),
    (["--mechanism", "count-gaussian", "--epsilon", "1", "--delta", "1"], "--delta"),
    (["--mechanism", "count-gaussian", "--epsilon", "1", "--delta", "0"], "--delta"),
    (["--mechanism", "count-gaussian", "--epsilon", "1"], "needs --delta"),
    (["--mechanism", "count-gaussian", "--epsilon", "1", "--delta", "1e-5",
      "--max-items-per-user", "0"], "--max-items-per-user"),
    (["--mechanism", "count-gaussian", "--epsilon", "1", "--delta", "1e-5", "--alpha", "3"],
     "does not apply"),
    (["--mechanism", "count-gaussian", "--epsilon", "x", "--delta", "1e-5"], "--epsilon"),
    (["--mechanism", "count-gaussian", "--epsilon", "1", "--delta", "1e-5", "--epsilonn", "2"],
     "unrecognized arguments"),
    (["--epsilon", "1", "--delta", "1e-5"], "--mechanism"),
    (["--mechanism", "gw", "--epsilon", "1", "--delta", "1e-5", "--tie-break", "random"],
     "--tie-break must be one of"),
    (["--mechanism", "weighted-gaussian", "--epsilon", "1", "--delta", "1e-5",
      "--tie-break", "first-occurrence"], "--tie-break does not apply"),
    # The published GW is not proven private: only with --allow-unproven.
    (["--mechanism", "gw", "--epsilon", "1", "--delta", "1e-5", "--variant", "published"],
     "not proven private; pass --allow-unproven"),
    (["--mechanism", "gw", "--epsilon", "1", "--delta", "1e-5", "--variant", "published",
      "--allow-unproven", "--max-items-per-user", "5"], "--max-items-per-user does not apply"),
    (["--mechanism", "gw", "--epsilon", "1", "--delta", "1e-5", "--eta", "1"], "eta"),
    (["--mechanism", "gw", "--epsilon", "1", "--delta", "1e-5", "--variant", "x"], "variant"),
    (["--mechanism", "policy-laplace", "--epsilon", "1", "--delta", "1e-5", "--eta", "0.1"],
     "--eta does not apply"),
])
def test_bad_parameters_exit_2_with_one_line_before_reading(argv, message, capsys, tmp_prefix):
    # The input does not exist: the parameter error must be reported first.
    rc = select_partitions.main(["--input", "/nonexistent/*.tsv", "--output", tmp_prefix] + argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and message in err, err
    assert not os.path.exists(tmp_prefix + ".json")


def test_missing_input_exits_2(capsys, tmp_prefix):
    rc = select_partitions.main(["--input", "/nonexistent/*.tsv", "--output", tmp_prefix,
                                 "--mechanism", "count-gaussian", "--epsilon", "1",
                                 "--delta", "1e-5"])
    assert rc == 2 and "no input file matches" in capsys.readouterr().err


def test_subprocess_exit_status_and_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "pipelines.select_partitions", "--input", "x",
                           "--output", "y", "--mechanism", "weighted-gaussian", "--epsilon", "-1",
                           "--delta", "1e-5"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.startswith("select_partitions")]
    assert lines == ["select_partitions: error: --epsilon must be a finite number > 0, got -1.0"]


def test_generate_cli(tmp_path, capsys):
    out = str(tmp_path / "g.tsv")
    assert generate.main(["--output", out, "--users", "30", "--seed", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["users"] == 30
    assert generate.main(["--output", out, "--users", "-3"]) == 2


@pytest.mark.parametrize("flags", [["--users", "0"], ["--users", "-3"],
                                   ["--max-occurrences", "0"]])
def test_generate_refuses_an_empty_data_set_and_creates_nothing(tmp_path, capsys, flags):
    out = str(tmp_path / "new" / "g.tsv")
    assert generate.main(["--output", out] + flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ">= 1" in err[0], err
    assert os.listdir(tmp_path) == []


def test_dead_letter_holds_the_malformed_lines(tmp_path, tmp_prefix):
    path = tmp_path / "in.tsv"
    path.write_bytes(b"u1\ta\nbad line\n\tnouser\nu2\tb\nbad line\nu3\t\xff\n")
    dead = str(tmp_path / "dead")
    assert select_partitions.main(["--input", str(path), "--output", tmp_prefix, "--mechanism",
                                   "count-gaussian", "--epsilon", "1", "--delta", "1e-5",
                                   "--dead-letter", dead]) == 0
    # One owner-only file whose name says PRIVATE: raw private input lines.
    assert glob.glob(dead + "*") == [dead + ".PRIVATE-dead-letter-00000-of-00001"]
    assert os.stat(glob.glob(dead + "*")[0]).st_mode & 0o777 == 0o600
    lines = open(dead + ".PRIVATE-dead-letter-00000-of-00001", "rb").read().splitlines()
    assert sorted(lines) == sorted([b"bad line", b"bad line", b"\tnouser", b"u3\t\xff"])
    s = read_private(tmp_prefix)
    assert s["malformed_lines"] == 4
    assert s["dead_letter_files"] == dead + ".PRIVATE-dead-letter-00000-of-00001"
    assert "not a release" in s["dead_letter_note"]
    with open(tmp_prefix + ".json") as f:
        assert "dead" not in f.read()


def test_unwritable_output_is_a_usage_error_without_traceback(tmp_path, capsys):
    path = tmp_path / "in.tsv"
    path.write_text("u\ti\n")
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc = select_partitions.main(["--input", str(path), "--output", str(blocker / "sub" / "out"),
                                 "--mechanism", "count-gaussian", "--epsilon", "1",
                                 "--delta", "1e-5"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot write to" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["file", "in.tsv"]


def test_published_gw_runs_with_allow_unproven_and_is_marked_unproven(tmp_path):
    data = tmp_path / "in.tsv"
    data.write_text("".join(f"u{i}\tw{j}\n" for i in range(40) for j in range(i % 3 + 1)))
    prefix = str(tmp_path / "out")
    assert select_partitions.main(["--input", str(data), "--output", prefix, "--mechanism", "gw",
                                   "--epsilon", "1", "--delta", "1e-5", "--variant", "published",
                                   "--allow-unproven", "--insecure-test-seed", "3",
                                   "--runner=DirectRunner"]) == 0
    summary = json.loads((tmp_path / "out.json").read_text())
    assert summary["variant"] == "published" and summary["proven"] is False
    assert summary["max_items_per_user"] is None
    prefix2 = str(tmp_path / "out2")
    assert select_partitions.main(["--input", str(data), "--output", prefix2, "--mechanism", "gw",
                                   "--epsilon", "1", "--delta", "1e-5", "--max-items-per-user",
                                   "2", "--eta", "0.2", "--insecure-test-seed", "3",
                                   "--runner=DirectRunner"]) == 0
    summary = json.loads((tmp_path / "out2.json").read_text())
    assert (summary["variant"], summary["proven"], summary["max_items_per_user"],
            summary["eta"]) == ("cascade-free", True, 2, 0.2)


def test_public_counts_are_distinct_users_per_item(tmp_path, capsys):
    from beam_dpsu.dp.data.sequential import read_public_counts
    from beam_dpsu.pipelines import public_counts
    lines = ["u1\ta", "u1\ta", "u2\ta", "u2\tb b", "u3\tb b\r", "no tab", "\tnouser",
             "u3\ta", "u4\tc\td"]
    path = tmp_path / "public.tsv"
    path.write_bytes(("\n".join(lines) + "\n").encode())
    out = str(tmp_path / "counts.tsv.gz")
    assert public_counts.main(["--input", str(path), "--output", out]) == 2  # 3 fields
    capsys.readouterr()
    path.write_bytes(("\n".join(lines[:-1]) + "\n").encode())
    assert public_counts.main(["--input", str(path), "--output", out]) == 0
    # independently: distinct (user, item) pairs of the well-formed lines, per item
    pairs = {tuple(l.rstrip("\r").split("\t")) for l in lines[:-1]
             if "\t" in l and not l.startswith("\t")}
    expected = {}
    for _, item in pairs:
        expected[item] = expected.get(item, 0) + 1
    assert read_public_counts(out) == expected == {"a": 3, "b b": 2}
    err = capsys.readouterr().err
    assert "WARNING: 2 malformed line(s)" in err
    assert public_counts.main(["--input", str(path), "--output", out]) == 2   # exists
    assert "--overwrite" in capsys.readouterr().err
    # the column check's way out, which its refusal names, is a flag of this command too
    path.write_bytes(("\n".join(lines) + "\n").encode())
    assert public_counts.main(["--input", str(path), "--output", out, "--overwrite",
                               "--tabs-in-items"]) == 0
    assert read_public_counts(out) == {"a": 3, "b b": 2, "c\td": 1}
