"""The top_k command line: contract, summary, validation."""
import glob
import json
import os
import subprocess
import sys

import pytest

from beam_dpsu.dp.randomness import noise
from beam_dpsu.dp.privacy.accounting import pay_what_you_get_epsilon
from beam_dpsu.pipelines import top_k

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # Item "i<j>" is held by 400 − 30·j users (j = 0..9); every user also has
    # a few rare items. Counts are far apart and far above the thresholds.
    path = tmp_path_factory.mktemp("data") / "topk.tsv"
    lines = []
    for u in range(400):
        for j in range(10):
            if u < 400 - 30 * j:
                lines.append(f"user{u}\ti{j}\n")
        lines.append(f"user{u}\trare{u % 50}\n")
        lines.append(f"user{u}\ti0\n")  # a repeat: counted once
    path.write_text("".join(lines) + "malformed line\n", encoding="utf-8")
    return str(path)


def read_lines(prefix):
    lines = []
    for path in sorted(glob.glob(prefix + "-items-*")):
        with open(path, encoding="utf-8") as f:
            lines += f.read().splitlines()
    return lines


def test_gumbel_run_writes_ranked_items_and_summary(data, tmp_prefix, capsys):
    rc = top_k.main(["--input", data, "--output", tmp_prefix, "--k", "5", "--k-bar", "8",
                     "--epsilon", "1", "--delta", "1e-6", "--insecure-test-seed", "3"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["num_released"] == 5 and printed["charge"]["selections"] == 5
    with open(tmp_prefix + ".json") as f:
        s = json.load(f)
    for key in ("mechanism", "algorithm", "k", "k_bar", "epsilon", "epsilon_per_selection",
                "delta", "max_items_per_user", "noise", "noise_scale", "threshold_offset",
                "query_guarantee", "charge", "num_released", "seeded", "insecure_test_seed"):
        assert key in s, key
    for key in ("num_users", "malformed_lines", "runner", "wall_seconds", "input"):
        assert key not in s and key not in printed, key
    assert s["mechanism"] == "top-k-gumbel" and s["k"] == 5 and s["k_bar"] == 8
    assert s["seeded"] is True and s["insecure_test_seed"] == 3
    private = json.load(open(tmp_prefix + ".PRIVATE-run-details.json"))
    assert private["num_users"] == 400 and private["malformed_lines"] == 1
    # --epsilon/--delta are the whole query's guarantee, stated as given; the
    # per-selection ε is calibrated from them (5 selections, δ/2 each way).
    eps_sel, delta_q, _ = pay_what_you_get_epsilon(1.0, 1e-6, 5, 1)
    assert s["charge"] == {"selections": 5, "queries": 1, "epsilon_per_selection": eps_sel,
                           "delta": delta_q}
    assert s["epsilon_per_selection"] == printed["epsilon_per_selection"] == eps_sel < 1.0
    assert s["epsilon"] == printed["epsilon"] == s["query_guarantee"]["epsilon"] == 1.0
    assert s["delta"] == printed["delta"] == 1e-6
    assert s["composition"]["epsilon"] <= 1.0 and s["composition"]["delta"] <= 1e-6
    assert read_lines(tmp_prefix) == [f"{r}\ti{r - 1}" for r in range(1, 6)]


def test_with_counts_releases_grid_counts(data, tmp_prefix):
    # Δ = 11 keeps every user's items (10 common + 1 rare); b = 12/4 = 3, the
    # threshold is about 130 + 54, and the top 4 (400, 370, 340, 310) are 10·b apart.
    rc = top_k.main(["--input", data, "--output", tmp_prefix, "--k", "4", "--k-bar", "9",
                     "--epsilon", "4", "--delta", "1e-6", "--max-items-per-user", "11",
                     "--with-counts", "--insecure-test-seed", "2"])
    assert rc == 0
    with open(tmp_prefix + ".json") as f:
        s = json.load(f)
    assert s["mechanism"] == "top-k-laplace" and s["noise_scale"] == 3.0
    assert s["charge"]["selections"] is None and s["num_released"] == 4
    lines = [l.split("\t") for l in read_lines(tmp_prefix)]
    assert [(r, i) for r, i, _ in lines] == [(str(r), f"i{r - 1}") for r in range(1, 5)]
    g = noise.grid_granularity(3.0)
    for _, item, count in lines:
        c = float(count)
        assert (c / g).is_integer()
        assert abs(c - (400 - 30 * int(item[1:]))) < 3.0 * 44  # the sampler's noise bound


def test_same_seed_same_output(data, tmp_path):
    outs = []
    for name in ("a", "b"):
        prefix = str(tmp_path / name)
        assert top_k.main(["--input", data, "--output", prefix, "--k", "3", "--epsilon", "0.05",
                           "--delta", "1e-3", "--max-items-per-user", "3", "--with-counts",
                           "--insecure-test-seed", "11"]) == 0
        outs.append(read_lines(prefix))
    assert outs[0] == outs[1]


def test_nothing_released_writes_empty_output(tmp_path, tmp_prefix):
    # Unseeded. With k = k̄ = 2 and the whole query's (1, 1e-12), the Gumbel runs at
    # ε = 0.5 per selection with δ/2 = 5e-13 (the calibration of --epsilon), so the
    # offset is 1 + ln(4e12)/0.5 = 59.0 above the bottom count 0: 'a' (2 users) is
    # released with probability expit(0.5·(2 − 59.0)) ≈ 4.1e-13 and 'b' with less, so
    # a false failure has probability below 1e-12.
    path = tmp_path / "small.tsv"
    path.write_text("u1\ta\nu2\ta\nu3\tb\n")
    assert top_k.main(["--input", str(path), "--output", tmp_prefix, "--k", "2",
                       "--epsilon", "1", "--delta", "1e-12"]) == 0
    with open(tmp_prefix + ".json") as f:
        s = json.load(f)
    assert s["num_released"] == 0 and s["charge"]["selections"] == 1 and s["seeded"] is False
    assert read_lines(tmp_prefix) == []


BASE = ["--k", "5", "--epsilon", "1", "--delta", "1e-6"]


@pytest.mark.parametrize("argv,message", [
    (["--k", "0", "--epsilon", "1", "--delta", "1e-6"], "--k must be an integer >= 1"),
    (["--k", "5", "--k-bar", "3", "--epsilon", "1", "--delta", "1e-6"], "--k-bar must be >= k"),
    (["--k", "5", "--epsilon", "0", "--delta", "1e-6"], "--epsilon"),
    (["--k", "5", "--epsilon", "1", "--delta", "1"], "--delta"),
    (BASE + ["--max-items-per-user", "0"], "--max-items-per-user"),
    (BASE + ["--with-counts"], "--with-counts (Algorithm 1) needs --max-items-per-user"),
    (["--epsilon", "1", "--delta", "1e-6"], "--k"),
    (["--k", "5", "--delta", "1e-6"], "--epsilon"),
    (["--k", "x", "--epsilon", "1", "--delta", "1e-6"], "--k"),
    (BASE + ["--kbar", "3"], "unrecognized arguments"),
])
def test_bad_parameters_exit_2_with_one_line_before_reading(argv, message, capsys, tmp_prefix):
    rc = top_k.main(["--input", "/nonexistent/*.tsv", "--output", tmp_prefix] + argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and message in err, err
    assert not os.path.exists(tmp_prefix + ".json")


def test_missing_input_exits_2(capsys, tmp_prefix):
    rc = top_k.main(["--input", "/nonexistent/*.tsv", "--output", tmp_prefix] + BASE)
    assert rc == 2 and "no input file matches" in capsys.readouterr().err


def test_subprocess_exit_status_and_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "pipelines.top_k", "--input", "x", "--output",
                           "y", "--k", "3", "--epsilon", "-1", "--delta", "1e-5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.startswith("top_k")]
    assert lines == ["top_k: error: --epsilon must be a finite number > 0, got -1.0"]


def test_dead_letter_and_malformed_count(tmp_path, tmp_prefix):
    path = tmp_path / "in.tsv"
    path.write_bytes(b"".join(b"u%d\tpopular\n" % u for u in range(200)) + b"junk\njunk\n")
    dead = str(tmp_path / "dead")
    assert top_k.main(["--input", str(path), "--output", tmp_prefix, "--k", "1",
                       "--epsilon", "1", "--delta", "1e-6", "--dead-letter", dead]) == 0
    lines = b"".join(open(f, "rb").read() for f in glob.glob(dead + ".PRIVATE-*")).splitlines()
    assert lines == [b"junk", b"junk"]
    summary = json.load(open(tmp_prefix + ".PRIVATE-run-details.json"))
    assert summary["malformed_lines"] == 2 and summary["dead_letter_files"] == (
        dead + ".PRIVATE-dead-letter-00000-of-00001")
    assert "not a release" in summary["dead_letter_note"]
    assert "malformed_lines" not in json.load(open(tmp_prefix + ".json"))
