"""Every number of a public summary says what it is: ``units`` and ``threshold_meaning``."""
import json
import math
import pathlib

import pytest

from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.dp.mechanisms.registry import REGISTRY, make_mechanism
from beam_dpsu.dp.mechanisms.topk import TopKMechanism
from beam_dpsu.pipelines import select_partitions, top_k

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _built():
    out = []
    for name, entry in sorted(REGISTRY.items()):
        if "public_counts" in entry.accepts:
            continue  # needs a file; its describe() is the gw one's
        out.append(make_mechanism(name, epsilon=1.0, delta=1e-6))
    return out + [TopKMechanism(3, 1.0, 1e-6), TopKMechanism(3, 1.0, 1e-6, max_items=5,
                                                             with_counts=True)]


def numeric_fields(summary):
    """Top-level fields holding a number or a list of numbers (bools are not numbers)."""
    def numeric(v):
        if isinstance(v, bool):
            return False
        if isinstance(v, (int, float)):
            return True
        return isinstance(v, list) and bool(v) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    return {k for k, v in summary.items() if numeric(v)}


@pytest.mark.parametrize("mechanism", _built(), ids=lambda m: m.name)
def test_every_number_of_describe_has_a_unit(mechanism):
    d = mechanism.describe()
    missing = numeric_fields(d) - set(d["units"])
    assert not missing, missing
    assert all(isinstance(v, str) and v for v in d["units"].values())
    json.dumps(d)


@pytest.mark.parametrize("name", ["weighted-gaussian", "weighted-laplace", "policy-gaussian",
                                  "sips", "gw"])
def test_weighted_thresholds_are_not_a_number_of_users(name):
    d = make_mechanism(name, epsilon=1.0, delta=1e-6).describe()
    assert "NOT a number of users" in d["threshold_meaning"]
    assert "histogram" in d["units"]["threshold"] and "scale" in d["units"]["noise_scale"]


def test_threshold_meaning_in_users_for_the_weighted_gaussian():
    # Each user adds 1/√n to each of its n items: T is reached by ⌈T⌉ users of one
    # item or ⌈T·√Δ0⌉ users holding Δ0 items each.
    m = make_mechanism("weighted-gaussian", epsilon=1.0, delta=1e-6, max_items=25)
    t = m.rounds[0].threshold
    text = m.describe()["threshold_meaning"]
    assert f"{math.ceil(t)} users who hold only this item" in text
    assert f"{math.ceil(t * 5)} users who each hold Δ0 = 25 items" in text


def test_count_thresholds_are_users_and_sips_names_each_round():
    d = make_mechanism("count-gaussian", epsilon=1.0, delta=1e-6).describe()
    assert "(a number of users)" in d["threshold_meaning"]
    s = make_mechanism("sips", epsilon=1.0, delta=1e-6).describe()
    assert all(f"round {i}: T = " in s["threshold_meaning"] for i in range(3))
    assert "one per round" in s["units"]["threshold"]


def run_release(main, tmp_path, argv):
    data = str(tmp_path / "in.tsv")
    synthetic.write_tsv(data, 200, 3)
    prefix = str(tmp_path / "out")
    assert main(["--input", data, "--output", prefix, "--quiet"] + argv) == 0
    return json.load(open(prefix + ".json", encoding="utf-8"))


@pytest.mark.parametrize("argv", [
    ["--mechanism", "weighted-gaussian", "--epsilon", "1", "--delta", "1e-6"],
    ["--mechanism", "sips", "--epsilon", "1", "--delta", "1e-6"],
    ["--mechanism", "policy-laplace", "--epsilon", "1", "--delta", "1e-6"],
], ids=lambda a: a[1])
def test_the_public_json_explains_every_number(tmp_path, argv):
    public = run_release(select_partitions.main, tmp_path, argv)
    assert not numeric_fields(public) - set(public["units"])
    assert "threshold_meaning" in public and "num_released" in public["units"]
    for entry in public.get("per_round") or []:  # numbers of each round: per_round's unit
        assert "per_round" in public["units"] and isinstance(entry["released"], int)


def test_the_top_k_json_explains_every_number(tmp_path):
    public = run_release(top_k.main, tmp_path,
                         ["--k", "3", "--epsilon", "1", "--delta", "1e-6"])
    assert not numeric_fields(public) - set(public["units"])


def test_readme_explains_units_and_threshold_meaning():
    text = README.read_text(encoding="utf-8")
    assert "`units`" in text and "`threshold_meaning`" in text
    assert "NOT a number of users" in text
