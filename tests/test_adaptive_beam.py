"""Adaptive weighting on Beam: every path releases ``Adaptive.run_local``'s set under the
same key, each item once (``adaptive-2r``'s first round included): ``SelectPartitions``
on per-user data (``transforms.adaptive``), on pairs, and ``SelectFromText`` from files
(``transforms.columnar``), staged or not, with several groups and shards."""
import random

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu.dp.data import columnar, columnar_text
from beam_dpsu.dp.data.contribution import per_user_counts, sample_items
from beam_dpsu.dp.mechanisms.adaptive import (RELEASED, Adaptive, adaptive_histogram,
                                              adaptive_pairs_histogram, marks_arrays,
                                              marks_message, released_first)
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.transforms import staging
from beam_dpsu.transforms.adaptive import AdaptiveRounds
from beam_dpsu.transforms.columnar import SelectFromText
from beam_dpsu.transforms.select import SelectPartitions

from conftest import local_pipeline


def _lines(seed=2, users=3000):
    # Pareto-popular items: some are far above the cutoff (heavy), most are rare.
    rng = random.Random(seed)
    out = []
    for u in range(users):
        for _ in range(rng.choice([1, 3, 8, 30])):
            out.append(f"u{u}\ti{min(int(rng.paretovariate(1.2)), 300)}\n")
    rng.shuffle(out)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("adaptive")
    lines = _lines()
    half = len(lines) // 2
    (folder / "a.tsv").write_text("".join(lines[:half]), encoding="utf-8")
    (folder / "b.tsv").write_text("".join(lines[half:]) + "no tab here\n", encoding="utf-8")
    per_user = per_user_counts(tuple(line.rstrip("\n").split("\t")) for line in lines)
    return str(folder / "*.tsv"), per_user


MECHANISMS = {"adaptive": dict(release_rounds=1), "adaptive-2r": dict(release_rounds=2)}


def _expected(m, per_user, key):
    rounds = m.run_local_with_rounds(per_user, key)
    if len(m.rounds) == 2:  # not vacuous: both rounds release
        assert 0 in rounds.values() and 1 in rounds.values()
    assert len(rounds) > 10
    return sorted(rounds)


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_select_partitions_per_user_and_on_pairs(files, name):
    _, per_user = files
    m = Adaptive(1.0, 1e-5, 20, **MECHANISMS[name])
    key = RunKey.from_test_seed(5)
    want = _expected(m, per_user, key)
    pairs = [(u, i) for u, counts in per_user.items() for i in counts]
    with local_pipeline() as p:
        users = p | "Users" >> beam.Create(list(per_user.items()))
        assert_that(users | "PerUser" >> SelectPartitions(m, run_key=key, per_user=True),
                    equal_to(want), label="per-user")
        assert_that(users | "Groups" >> AdaptiveRounds(m, key, user_groups=3, num_shards=5),
                    equal_to(want), label="groups")
        assert_that(p | "Pairs" >> beam.Create(pairs) | "OnPairs" >> SelectPartitions(
            m, run_key=key), equal_to(want), label="pairs")


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_select_from_text(files, name, staged, tmp_path):
    pattern, per_user = files
    m = Adaptive(1.0, 1e-5, 20, **MECHANISMS[name])
    key = RunKey.from_test_seed(6)
    want = _expected(m, per_user, key)
    stage = staging.make_directory(str(tmp_path / "stage")) if staged else None
    with local_pipeline() as p:
        released, malformed, users = p | SelectFromText(pattern, m, run_key=key, user_groups=3,
                                                        item_shards=2, staging_dir=stage)
        assert_that(released, equal_to(want), label="released")
        assert_that(users | beam.CombineGlobally(sum), equal_to([len(per_user)]),
                    label="users")


def test_the_columnar_adaptive_histogram_is_the_dict_one():
    rng = random.Random(1)
    data = {f"u{u}": {f"i{rng.randint(0, 50)}": 1 for _ in range(rng.choice([1, 3, 8, 20]))}
            for u in range(300)}
    users = [u for u, c in data.items() for _ in c]
    items = [i for c in data.values() for i in c]
    block = columnar.pair_blocks(columnar_text.arrays_block(pa.array(users), pa.array(items)), 1)[0]
    pairs = columnar.group_pairs([block])
    key = RunKey.from_test_seed(3).subkey("sample/0")
    for trial in range(20):
        marks = [(f"i{j}", rng.choice([0, 1, 2, 3, 5, RELEASED])) for j in range(50)
                 if rng.random() < 0.4]
        marks += [(item, RELEASED) for item, _ in marks[:3]]   # released and heavy
        merged = released_first(marks)
        got = adaptive_pairs_histogram(pairs, 6, key, merged)
        assert np.array_equal(
            adaptive_pairs_histogram(pairs, 6, key, marks_arrays(marks)).weights, got.weights)
        kept = {u: list(sample_items(u, c, 6, key)) for u, c in data.items()}
        want = adaptive_histogram(
            kept, {i: b for i, b in merged.items() if b != RELEASED},
            {i for i, b in merged.items() if b == RELEASED})
        assert dict(zip(got.items.to_pylist(), got.weights.tolist())) == pytest.approx(
            want, rel=1e-12, abs=0)
        assert set(got.items.to_pylist()) == set(want)


def test_released_first_and_marks_arrays():
    marks = [("a", 3), ("a", RELEASED), ("b", RELEASED), ("b", 2), ("c", 4), ("d", 1)]
    assert released_first(marks) == {"a": RELEASED, "b": RELEASED, "c": 4, "d": 1}
    items, values = marks_arrays(marks)
    assert dict(zip(items.to_pylist(), values.tolist())) == released_first(marks)
    items, values = marks_arrays([])
    assert len(items) == 0 and values.size == 0
    # messages and pairs mixed, a released pair overriding a message's bucket
    message = marks_message(pa.array(["a", "e", "f"]), np.array([2, 5, 1]))
    items, values = marks_arrays([message, ("a", RELEASED), ("g", 3)])
    assert dict(zip(items.to_pylist(), values.tolist())) == {"a": RELEASED, "e": 5, "f": 1,
                                                             "g": 3}
