"""pipelines.compare: tables, plots, common footing, progress, validation."""
import builtins
import json
import os
import stat

import pytest

from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.pipelines import compare, runs
from conftest import without_progress

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cmp") / "syn.tsv")
    synthetic.write_tsv(path, 800, seed=3, max_occurrences=80)
    return path


def test_comparison_writes_tables_and_plots(data, tmp_path):
    out = str(tmp_path / "cmp")
    messages = []
    s = compare.run(["--input", data, "--output", out, "--delta", "1e-6", "--epsilons", "1,4",
                     "--trials", "2", "--insecure-test-seed", "11", "--mechanisms",
                     "weighted-gaussian:max_items=20,count-gaussian,sips:rounds=2"],
                    progress=messages.append)
    assert len(s["results"]) == 6
    for r in s["results"]:
        assert len(r["released"]) == 2 and r["mean"] == sum(r["released"]) / 2
        assert r["calibration"]["epsilon"] == pytest.approx(r["epsilon"])
    wg = [r for r in s["results"] if r["mechanism"] == "weighted-gaussian"]
    assert all(r["calibration"]["max_items_per_user"] == 20 for r in wg)
    # More budget releases more (seeded: deterministic; the means are far apart at
    # ε = 1 and 4 here).
    assert wg[1]["mean"] > wg[0]["mean"]
    sips = [r for r in s["results"] if r["mechanism"] == "sips"]
    assert all("zCDP, converted" in r["footing"] for r in sips)
    assert all(r["calibration"]["rounds"] == 2 for r in sips)
    with open(os.path.join(out, "results.PRIVATE.json")) as f:
        saved = json.load(f)
        assert saved["trials"] == 2 and "NOT differentially private" in saved["PRIVATE"]
    md = open(os.path.join(out, "results.PRIVATE.md"), encoding="utf-8").read()
    assert "| sips rounds=2 | 4 |" in md and "zCDP, converted" in md
    assert "beam-dpsu compare" in md
    # Every output says PRIVATE in its name and its first line, and is owner-only.
    assert md.splitlines()[0].startswith("# PRIVATE: exact statistics of the input, NOT "
                                         "differentially private")
    assert sorted(os.listdir(out)) == sorted(
        ["results.PRIVATE.md", "results.PRIVATE.json", "released_vs_epsilon.PRIVATE.png",
         "coverage_vs_epsilon.PRIVATE.png", "released_by_users.PRIVATE.png"])
    for name in os.listdir(out):
        assert stat.S_IMODE(os.stat(os.path.join(out, name)).st_mode) == 0o600, name
    for name in ("released_vs_epsilon.PRIVATE.png", "released_by_users.PRIVATE.png"):
        with open(os.path.join(out, name), "rb") as f:
            assert f.read(8) == PNG
    assert any(m.startswith("[12/12]") for m in messages)


def test_tables_without_matplotlib(data, tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out = str(tmp_path / "cmp")
    messages = []
    s = compare.run(["--input", data, "--output", out, "--delta", "1e-6", "--epsilon", "2",
                     "--trials", "1", "--mechanisms", "weighted-laplace"], progress=messages.append)
    assert s["plots"] == [] and os.path.exists(os.path.join(out, "results.PRIVATE.md"))
    assert any("matplotlib is not installed" in m for m in messages)


def test_user_bins():
    assert compare.user_bins(20) == [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32)]


@pytest.mark.parametrize("mechs,message", [
    ("nope", "unknown mechanism"), ("count-gaussian:foo=1", "bad setting"),
    ("count-gaussian:max_items=x", "bad value"), ("count-gaussian:max_items=0", "max-items"),
    ("gw:max_items=3:variant=published", "does not apply"),
    ("gw:variant=published", "--allow-unproven"),
])
def test_bad_mechanism_lists_exit_2(data, tmp_path, capsys, mechs, message):
    rc = compare.main(["--input", data, "--output", str(tmp_path / "o"), "--delta", "1e-6",
                       "--epsilon", "1", "--mechanisms", mechs])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


def test_beam_options_need_the_beam_engine(data, tmp_path, capsys):
    rc = compare.main(["--input", data, "--output", str(tmp_path / "o"), "--delta", "1e-6",
                       "--epsilon", "1", "--mechanisms", "gw", "--runner=DirectRunner"])
    assert rc == 2 and "--engine beam" in capsys.readouterr().err


def test_beam_engine_runs_the_pipeline(data, tmp_path):
    s = compare.run(["--input", data, "--output", str(tmp_path / "o"), "--delta", "1e-6",
                     "--epsilon", "2", "--trials", "1", "--engine", "beam",
                     "--insecure-test-seed", "3",
                     "--mechanisms", "weighted-gaussian:max_items=10"], progress=lambda m: None)
    assert s["results"][0]["released"][0] > 0  # seeded: deterministic
    # the Beam engine's trial is the seeded select run: the core engine releases as many
    c = compare.run(["--input", data, "--output", str(tmp_path / "c"), "--delta", "1e-6",
                     "--epsilon", "2", "--trials", "1", "--insecure-test-seed", "3",
                     "--mechanisms", "weighted-gaussian:max_items=10"], progress=lambda m: None)
    assert c["results"][0]["released"] == s["results"][0]["released"]


def test_gw_tie_breaks_side_by_side_in_both_engines(data, tmp_path):
    mechs = "gw,gw:tie_break=first-occurrence"
    assert compare.parse_mechanisms(mechs) == [("gw", {}),
                                               ("gw", {"tie_break": "first-occurrence"})]
    for engine in ("core", "beam"):
        s = compare.run(["--input", data, "--output", str(tmp_path / engine), "--delta", "1e-6",
                         "--epsilon", "2", "--trials", "1", "--engine", engine,
                         "--insecure-test-seed", "5",
                         "--mechanisms", mechs], progress=lambda m: None)
        labels = [r["label"] for r in s["results"]]
        assert labels == ["gw", "gw tie_break=first-occurrence"], labels
        assert all(r["released"][0] > 0 for r in s["results"])
    assert compare._cli_flags("gw", compare.MechanismParams(
        epsilon=2.0, delta=1e-6, tie_break="first-occurrence"))[-2:] == [
            "--tie-break", "first-occurrence"]


@pytest.mark.parametrize("engine", ["core", "beam"])
def test_input_without_a_well_formed_line_exits_1(tmp_path, capsys, engine):
    path = tmp_path / "notab.txt"
    path.write_text("no tab here\n" * 20)
    rc = compare.main(["--input", str(path), "--output", str(tmp_path / "o"), "--delta", "1e-6",
                       "--epsilon", "1", "--trials", "1", "--engine", engine,
                       "--mechanisms", "count-gaussian"])
    err = [l for l in without_progress(capsys.readouterr().err) if l.startswith("compare")]
    assert rc == 1 and len(err) == 1 and "no well-formed" in err[0], err
    assert not os.path.exists(tmp_path / "o" / "results.PRIVATE.json")


def test_a_directory_as_input_exits_2(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    rc = compare.main(["--input", str(tmp_path / "data"), "--output", str(tmp_path / "o"),
                       "--delta", "1e-6", "--epsilon", "1", "--mechanisms", "count-gaussian"])
    err = without_progress(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and "is a directory" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["data"]


def test_published_and_cascade_free_gw_side_by_side_with_allow_unproven(data, tmp_path):
    mechs = "gw,gw:variant=published,gw:max_items=5:eta=0.1"
    s = compare.run(["--input", data, "--output", str(tmp_path / "o"), "--delta", "1e-6",
                     "--epsilon", "2", "--trials", "1", "--mechanisms", mechs,
                     "--allow-unproven"], progress=lambda m: None)
    cal = [(r["calibration"]["variant"], r["calibration"]["proven"],
            r["calibration"]["max_items_per_user"], r["calibration"]["eta"])
           for r in s["results"]]
    from beam_dpsu.dp.privacy.params import DEFAULT_GW_ETA, gw_default_max_items
    assert cal == [("cascade-free", True, gw_default_max_items(2.0), DEFAULT_GW_ETA),
                   ("published", False, None, None), ("cascade-free", True, 5, 0.1)]
    # The beam engine gets the same mechanism through the command-line flags.
    flags = compare._cli_flags("gw", compare.MechanismParams(
        epsilon=2.0, delta=1e-6, variant="published", eta=None, allow_unproven=True))
    assert flags[-3:] == ["--variant", "published", "--allow-unproven"]
    assert compare._cli_flags("gw", compare.MechanismParams(epsilon=2.0, delta=1e-6, eta=0.1,
                                                            allow_unproven=None))[-2:] == \
        ["--eta", "0.1"]


def test_occurrence_coverage_and_missing_mass_by_hand():
    from beam_dpsu.dp.evaluation import utility
    per_user = {"u1": {"a": 3, "b": 1}, "u2": {"a": 1, "c": 2}, "u3": {"d": 1}}
    occ = utility.item_occurrences(per_user)
    assert occ == {"a": 4, "b": 1, "c": 2, "d": 1}
    # 8 lines; a and c released: 6 of them covered.
    assert utility.occurrence_coverage(["a", "c", "c"], occ) == 6 / 8
    assert utility.missing_mass({"a", "c"}, occ) == 2 / 8
    assert utility.occurrence_coverage(["zzz"], occ) == 0.0        # never held: no mass
    assert utility.occurrence_coverage([], {}) == 0.0
    assert utility.occurrence_coverage(occ, occ) == 1.0


@pytest.mark.parametrize("engine", ["core", "beam"])
def test_compare_reports_the_coverage_of_each_trial(tmp_path, engine):
    # 300 users, each with "common" twice, "mid" once and a rare item of their own:
    # 1,200 lines, of which common and mid are 900. Weighted Gaussian (ε = 4,
    # δ = 1e-10, Δ0 = 3) gives common and mid weight 300/√3 ≈ 173 against T ≈ 11 with
    # σ ≈ 1.5 (never missed), and releases each rare item (weight 1/√3) with
    # probability ≤ δ'_3 < 2e-11, so the coverage is exactly 900/1200 unless one of
    # 300 rare items escapes: false failure < 2 trials × 300 × 2e-11 < 1.2e-8.
    data = tmp_path / "in.tsv"
    data.write_text("".join(f"u{u}\tcommon\nu{u}\tcommon\nu{u}\tmid\nu{u}\trare{u}\n"
                            for u in range(300)))
    out = str(tmp_path / "cmp")
    s = compare.run(["--input", str(data), "--output", out, "--delta", "1e-10",
                     "--epsilon", "4", "--trials", "2", "--engine", engine,
                     "--mechanisms", "weighted-gaussian:max_items=3"], progress=lambda m: None)
    (row,) = s["results"]
    assert row["released"] == [2, 2]
    assert row["occurrence_coverage"] == [0.75, 0.75]
    assert row["coverage_mean"] == 0.75 and row["missing_mass_mean"] == 0.25
    md = open(os.path.join(out, "results.PRIVATE.md"), encoding="utf-8").read()
    assert "| 75.00% ± 0.00 | 25.00% |" in md
    with open(os.path.join(out, "coverage_vs_epsilon.PRIVATE.png"), "rb") as f:
        assert f.read(8) == PNG


def test_plot_colours_are_distinct_hues_not_pairs():
    import colorsys
    for n in (2, 5, 10, 14):
        colors = compare.distinct_colors(n)
        assert len(set(colors)) == n
        hues = sorted(colorsys.rgb_to_hsv(*c)[0] for c in colors if max(c) - min(c) > 0.1)
        # No two chromatic colours share a hue (a light/dark pair would).
        assert all(b - a > 0.02 for a, b in zip(hues, hues[1:])), (n, hues)


def test_a_seeded_comparison_is_reproducible_and_its_trials_differ(data, tmp_path, capsys):
    def run(out, seed):
        return compare.run(["--input", data, "--output", str(tmp_path / out), "--delta", "1e-6",
                            "--epsilon", "1", "--trials", "3", "--insecure-test-seed", seed,
                            "--mechanisms", "weighted-gaussian:max_items=5"],
                           progress=lambda m: None)
    a, b = run("a", "7"), run("b", "7")
    assert a["results"][0]["released"] == b["results"][0]["released"]
    assert "NOT private" in capsys.readouterr().err
    with open(tmp_path / "a" / compare.RESULTS_MD, encoding="utf-8") as f:
        assert "--insecure-test-seed 7" in f.read()
    # each trial its own key: the three releases are not one release repeated
    keys = {runs.trial_key(7, step).subkey("noise/0") for step in (1, 2, 3)}
    assert len(keys) == 3


def test_an_earlier_comparison_is_refused_without_overwrite(data, tmp_path, capsys):
    out = str(tmp_path / "o")
    argv = ["--input", data, "--output", out, "--delta", "1e-6", "--epsilon", "1",
            "--mechanisms", "gw", "--engine", "core", "--insecure-test-seed", "1"]
    assert compare.main(argv) == 0
    stale = os.path.join(out, "old-plot.PRIVATE.png")
    open(stale, "wb").close()
    before = {n: os.path.getmtime(os.path.join(out, n)) for n in os.listdir(out)}
    capsys.readouterr()
    assert compare.main(argv) == 2                    # as select refuses an earlier run
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overwrite" in err[0], err
    assert {n: os.path.getmtime(os.path.join(out, n)) for n in os.listdir(out)} == before
    assert compare.main(argv + ["--overwrite"]) == 0
    assert not os.path.exists(stale) and os.path.exists(os.path.join(out, compare.RESULTS_MD))
