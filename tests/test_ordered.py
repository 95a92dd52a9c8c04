"""The ordered-user Beam transform and the policy mechanisms.

Every Beam test compares the pipeline with the Beam-free core under a fixed
test key, so the expected output is deterministic (no statistical test here).
"""
import json
import math

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu import core, ordered
from beam_dpsu import policies as P
from beam_dpsu.mechanisms import SelectPartitions
from beam_dpsu.noise import RunKey
from beam_dpsu.ordered import GW, GWKT, OrderedUserPolicy, PolicyGaussian, PolicyLaplace
from beam_dpsu.registry import make_mechanism

from conftest import beam_options
from test_mechanisms import small_dataset

RK = RunKey.from_test_seed(11)
PUBLIC = {"mid1": 50, "x3": 7, "rare5": 2}

MECHANISMS = [PolicyLaplace(1.0, 1e-5, 3), PolicyGaussian(1.0, 1e-5, 3), GW(1.0, 1e-5),
              GWKT(1.0, 1e-5, PUBLIC)]


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
def test_beam_and_core_release_the_same_set(mechanism):
    occ = small_dataset()
    expected = core.run_local(core.per_user_counts(occ), mechanism, RK)
    assert "common" in expected and not any(i.startswith("rare") for i in expected)
    with beam.Pipeline(options=beam_options()) as p:
        out = p | beam.Create(occ) | SelectPartitions(mechanism, RK)
        assert_that(out, equal_to(sorted(expected)))


@pytest.mark.parametrize("state", ["ordered_list", "bag"])
def test_histogram_is_exactly_the_cores_in_both_state_backends(state):
    per_user = core.per_user_counts(small_dataset())
    policy = PolicyGaussian(1.0, 1e-5, 3).policy(RK)
    expected = P.run_sequential(per_user, policy, RK)
    assert expected and all(w > 0 for w in expected.values())
    with beam.Pipeline(options=beam_options()) as p:
        out = (p | beam.Create(sorted(per_user.items()))
               | OrderedUserPolicy(policy, RK, state=state, batch_users=7))
        assert_that(out, equal_to(sorted(expected.items())))  # same floats, bit for bit


def test_public_counts_from_a_file_and_the_command_line(tmp_path):
    pub = tmp_path / "public.tsv"
    pub.write_text("".join(f"{k}\t{v}\n" for k, v in PUBLIC.items()))
    data = tmp_path / "in.tsv"
    data.write_text("".join(f"{u}\t{i}\n" for u, i in small_dataset()))
    from_map = core.run_local(core.per_user_counts(small_dataset()), GWKT(1.0, 1e-5, PUBLIC), RK)
    from pipelines import select_partitions
    prefix = str(tmp_path / "out")
    assert select_partitions.main(["--input", str(data), "--output", prefix, "--mechanism",
                                   "gw-kt", "--epsilon", "1", "--delta", "1e-5",
                                   "--public-counts", str(pub), "--seed", "11",
                                   "--runner=DirectRunner"]) == 0
    released = set()
    for path in tmp_path.glob("out-items-*"):
        released |= set(path.read_text().split())
    assert released == from_map
    summary = json.loads((tmp_path / "out.json").read_text())
    assert summary["mechanism"] == "gw-kt" and summary["policy"] == "greedy-public"
    assert summary["num_released"] == len(from_map)


def test_empty_input_releases_nothing():
    with beam.Pipeline(options=beam_options()) as p:
        out = p | beam.Create([]) | SelectPartitions(GW(1.0, 1e-5), RunKey.from_test_seed(1))
        assert_that(out, equal_to([]))


def test_equal_sort_keys_are_ordered_by_full_key_then_user():
    policy = P.GreedyPolicy(1.5, RK.subkey("item-order"))
    order_key = RK.subkey("order")
    fn = ordered._OrderedListDoFn(policy, order_key)
    users = ["alice", "bob", "carol"]
    blob = ordered.encode_ids([7])
    # All three arrive with the same (clamped) state key and in reverse order.
    got_order = []
    seq = [(ordered._MAX_SORT_MICROS, u, ordered.encode_ids([i])) for i, u in
           enumerate(reversed(users))]
    fn._apply_group({}, [(u, b) for _, u, b in seq], lambda h, ids: got_order.append(ids[0]))
    expected = sorted(range(3), key=lambda i: P.user_sort_key(order_key, list(reversed(users))[i]))
    assert got_order == expected
    assert ordered._sort_micros((1 << 64) - 1) == ordered._MAX_SORT_MICROS
    assert ordered._sort_micros(0) == -(1 << 63)
    assert ordered.decode_ids(blob) == [7]


def test_describe_and_calibration():
    m = PolicyGaussian(3, math.exp(-10), 300, alpha=5)
    d = m.describe()
    assert d["mechanism"] == "policy-gaussian" and d["policy"] == "l2-descent"
    assert d["cutoff"] == pytest.approx(d["threshold"][0] + 5 * d["noise_scale"], rel=1e-15)
    g = GW(3, math.exp(-10))
    assert g.calibration.threshold == pytest.approx(1 + (10 - math.log(2)) / 3, rel=1e-12)
    assert g.max_items is None and g.cutoff == pytest.approx(g.calibration.threshold + 1.0)
    assert make_mechanism("policy-laplace", epsilon=1, delta=1e-6).alpha == 3.0
    assert make_mechanism("gw", epsilon=1, delta=1e-6, alpha=0).cutoff == \
        pytest.approx(make_mechanism("gw", epsilon=1, delta=1e-6).calibration.threshold)


def test_validation():
    with pytest.raises(ValueError, match="alpha"):
        PolicyLaplace(1, 1e-5, 3, alpha=-1)
    with pytest.raises(ValueError, match="delta"):
        GW(1, 0.5)
    with pytest.raises(ValueError, match="public_counts"):
        GWKT(1, 1e-5, 3)
    with pytest.raises(ValueError, match="state"):
        PolicyGaussian(1, 1e-5, state="memory")
    with pytest.raises(ValueError, match="needs public_counts"):
        OrderedUserPolicy(GWKT(1, 1e-5, PUBLIC).policy(RK), RK)
    with pytest.raises(ValueError, match="does not use public_counts"):
        OrderedUserPolicy(GW(1, 1e-5).policy(RK), RK, public_counts=PUBLIC)
    with pytest.raises(ValueError, match="--max-items-per-user does not apply"):
        make_mechanism("gw", epsilon=1, delta=1e-5, max_items=3)
    with pytest.raises(ValueError, match="needs --delta and --public-counts"):
        make_mechanism("gw-kt", epsilon=1)
    with pytest.raises(ValueError, match="not found"):
        make_mechanism("gw-kt", epsilon=1, delta=1e-5, public_counts="/nonexistent/p.tsv")


def test_auto_state_choice():
    t = OrderedUserPolicy(GW(1, 1e-5).policy(RK), RK)
    assert t._resolve_state(beam.Pipeline(options=beam_options())) == "ordered_list"

    class OtherRunner:
        pass

    class FakePipeline:
        runner = OtherRunner()
    assert t._resolve_state(FakePipeline()) == "bag"
