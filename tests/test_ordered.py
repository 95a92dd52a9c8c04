"""The ordered-user Beam transform and the policy mechanisms.

Every Beam test compares the pipeline with the Beam-free core under a fixed
test key, so the expected output is deterministic (no statistical test here).
"""
import json
import math

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu.dp.privacy import calibration as cal
from beam_dpsu.dp.mechanisms.base import run_local
from beam_dpsu.dp.data.contribution import per_user_counts
from beam_dpsu.transforms import ordered
from beam_dpsu.dp.privacy import params
from beam_dpsu.dp.data import sequential as P
from beam_dpsu.transforms.select import SelectPartitions
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.privacy.params import DEFAULT_GW_ETA, gw_default_max_items
from beam_dpsu.dp.mechanisms.policy import GW, GWKT, PolicyGaussian, PolicyLaplace
from beam_dpsu.transforms.ordered import OrderedUserPolicy
from beam_dpsu.dp.mechanisms.registry import make_mechanism

from conftest import local_pipeline
from test_mechanisms import small_dataset

RK = RunKey.from_test_seed(11)
PUBLIC = {"mid1": 50, "x3": 7, "rare5": 2}

MECHANISMS = [PolicyLaplace(1.0, 1e-5, 3), PolicyGaussian(1.0, 1e-5, 3), GW(1.0, 1e-5),
              GWKT(1.0, 1e-5, PUBLIC)]


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
def test_beam_and_core_release_the_same_set(mechanism):
    occ = small_dataset()
    expected = run_local(per_user_counts(occ), mechanism, RK)
    assert "common" in expected and not any(i.startswith("rare") for i in expected)
    with local_pipeline() as p:
        out = p | beam.Create(occ) | SelectPartitions(mechanism, RK)
        assert_that(out, equal_to(sorted(expected)))


@pytest.mark.parametrize("state", ["ordered_list", "bag"])
def test_histogram_is_exactly_the_cores_in_both_state_backends(state):
    per_user = per_user_counts(small_dataset())
    mechanism = PolicyGaussian(1.0, 1e-5, 3)
    expected = P.run_sequential(per_user, mechanism.policy(RK), RK)
    assert expected and all(w > 0 for w in expected.values())
    with local_pipeline() as p:
        out = (p | beam.Create(sorted(per_user.items()))
               | OrderedUserPolicy(mechanism.policy, RK, state=state, bucket_bits=2))
        assert_that(out, equal_to(sorted(expected.items())))  # same floats, bit for bit


def test_public_counts_from_a_file_and_the_command_line(tmp_path):
    pub = tmp_path / "public.tsv"
    pub.write_text("".join(f"{k}\t{v}\n" for k, v in PUBLIC.items()))
    data = tmp_path / "in.tsv"
    data.write_text("".join(f"{u}\t{i}\n" for u, i in small_dataset()))
    # The command line's default tie-break (it reads the record order), as params declares.
    from_map = run_local(per_user_counts(small_dataset()),
                         GWKT(1.0, 1e-5, PUBLIC, tie_break=params.DEFAULT_TIE_BREAK), RK)
    from beam_dpsu.pipelines import select_partitions
    prefix = str(tmp_path / "out")
    assert select_partitions.main(["--input", str(data), "--output", prefix, "--mechanism",
                                   "gw-kt", "--epsilon", "1", "--delta", "1e-5",
                                   "--public-counts", str(pub), "--insecure-test-seed", "11",
                                   "--runner=DirectRunner"]) == 0
    released = set()
    for path in tmp_path.glob("out-items-*"):
        released |= set(path.read_text().split())
    assert released == from_map
    summary = json.loads((tmp_path / "out.json").read_text())
    assert summary["mechanism"] == "gw-kt" and summary["policy"] == "cascade-free-greedy-public"
    assert summary["variant"] == "cascade-free" and summary["proven"] is True
    assert summary["num_released"] == len(from_map)


def _record_order_files(tmp_path):
    """Users whose items tie (each once but one), spread over three files."""
    rng = np.random.default_rng(5)
    lines = [[] for _ in range(3)]
    for u in range(80):
        words = [f"w{k}" for k in rng.choice(20, int(rng.integers(1, 9)), replace=False)]
        for w in words + words[-1:]:  # the last word twice: ties among the others
            lines[int(rng.integers(0, 3))].append(f"user-{u}\t{w}\n")
    for f, part in enumerate(lines):
        (tmp_path / f"part-{f}.tsv").write_text("".join(part))
    return str(tmp_path / "part-*")


@pytest.mark.parametrize("state", ["ordered_list", "bag"])
def test_first_occurrence_tie_break_reads_record_order_in_beam_as_in_the_core(tmp_path, state):
    from beam_dpsu.transforms.textio import ReadUserItems, read_per_user
    pattern = _record_order_files(tmp_path)
    per_user = read_per_user(pattern)
    by_record = GW(1.0, 0.3, tie_break="first-occurrence").policy
    expected = P.run_sequential(per_user, by_record(RK), RK)
    # The tie-break matters on this data: the hash gives another histogram.
    assert expected != P.run_sequential(per_user, GW(1.0, 0.3).policy(RK), RK)
    with local_pipeline() as p:
        out = (p | ReadUserItems(pattern, flush_pairs=5, keep_order=True)
               | OrderedUserPolicy(by_record, RK, state=state, bucket_bits=2))
        assert_that(out, equal_to(sorted(expected.items())))


def test_first_occurrence_tie_break_on_the_command_line(tmp_path):
    from beam_dpsu.transforms.textio import read_per_user
    pattern = _record_order_files(tmp_path)
    mechanism = GW(1.0, 0.3, tie_break="first-occurrence")
    expected = run_local(read_per_user(pattern), mechanism, RK)
    assert expected
    from beam_dpsu.pipelines import select_partitions
    prefix = str(tmp_path / "out")
    assert select_partitions.main(["--input", pattern, "--output", prefix, "--mechanism", "gw",
                                   "--epsilon", "1", "--delta", "0.3", "--tie-break",
                                   "first-occurrence", "--insecure-test-seed", "11",
                                   "--runner=DirectRunner"]) == 0
    released = set()
    for path in tmp_path.glob("out-items-*"):
        released |= set(path.read_text().split())
    assert released == expected
    assert json.loads((tmp_path / "out.json").read_text())["tie_break"] == "first-occurrence"


def test_first_occurrence_needs_per_user_counts_in_record_order():
    m = GW(1.0, 1e-5, tie_break="first-occurrence")
    assert m.needs_record_order and not GW(1.0, 1e-5).needs_record_order
    with pytest.raises(ValueError, match="record order"):
        SelectPartitions(m, RK)
    SelectPartitions(m, RK, per_user=True)  # per-user input: the caller's order
    with pytest.raises(ValueError, match="tie_break"):
        GWKT(1.0, 1e-5, PUBLIC, tie_break="hash")
    assert make_mechanism("gw-kt", epsilon=1.0, delta=1e-5, public_counts=__file__,
                          tie_break="first-occurrence").tie_break == "first-occurrence"
    with pytest.raises(ValueError, match="--tie-break does not apply"):
        make_mechanism("policy-laplace", epsilon=1.0, delta=1e-5, tie_break="item-hash")


def test_the_default_tie_break_is_first_occurrence_where_the_record_order_is_read(tmp_path):
    from beam_dpsu.transforms.textio import read_per_user
    pattern = _record_order_files(tmp_path)
    per_user = read_per_user(pattern)
    for seed in range(11, 61):  # a test key under which the tie-break matters on this data
        key = RunKey.from_test_seed(seed)
        by_record = run_local(per_user, GW(1.0, 0.3, tie_break="first-occurrence"), key)
        by_hash = run_local(per_user, GW(1.0, 0.3, tie_break="item-hash"), key)
        if by_record != by_hash:
            break
    assert by_record != by_hash
    # The constructors keep item-hash (an embedded pipeline may have no record order).
    assert GW(1.0, 0.3).tie_break == GWKT(1.0, 0.3, PUBLIC).tie_break == "item-hash"
    # The registry (the command line's builder) defaults to first-occurrence ...
    built = make_mechanism("gw", epsilon=1.0, delta=0.3)
    assert built.tie_break == params.DEFAULT_TIE_BREAK == "first-occurrence"
    assert run_local(per_user, built, key) == by_record
    # ... and the command line reads the record order for it, without --tie-break.
    from beam_dpsu.pipelines import select_partitions
    prefix = str(tmp_path / "out")
    assert select_partitions.main(["--input", pattern, "--output", prefix, "--mechanism", "gw",
                                   "--epsilon", "1", "--delta", "0.3",
                                   "--insecure-test-seed", str(seed),
                                   "--runner=DirectRunner"]) == 0
    released = set()
    for path in tmp_path.glob("out-items-*"):
        released |= set(path.read_text().split())
    assert released == by_record
    assert json.loads((tmp_path / "out.json").read_text())["tie_break"] == "first-occurrence"
    # On (user, item) pairs, which carry no record order, the defaulted tie-break falls
    # back to item-hash; an explicit first-occurrence is refused.
    fallback = built.without_record_order()
    assert fallback.tie_break == "item-hash" and built.tie_break == "first-occurrence"
    assert fallback.describe()["tie_break"] == "item-hash"
    explicit = make_mechanism("gw", epsilon=1.0, delta=0.3, tie_break="first-occurrence")
    with pytest.raises(ValueError, match="record order"):
        explicit.without_record_order()
    with pytest.raises(ValueError, match="record order"):
        SelectPartitions(explicit, RK)
    pairs = [(u, i) for u, counts in per_user.items() for i, c in counts.items()
             for _ in range(c)]
    with local_pipeline() as p:
        out = p | beam.Create(pairs) | SelectPartitions(built, key)
        assert_that(out, equal_to(sorted(by_hash)))


def test_empty_input_releases_nothing():
    with local_pipeline() as p:
        out = p | beam.Create([]) | SelectPartitions(GW(1.0, 1e-5), RunKey.from_test_seed(1))
        assert_that(out, equal_to([]))


def test_buckets_sort_by_full_key_then_user_and_pack_ids():
    order_key = RK.subkey("order")
    users = ["alice", "bob", "carol", "dave"]
    keys = {u: P.user_sort_key(order_key, u) for u in users}
    # Two groups from different bundles, out of order; "dave" shares alice's hash.
    entries = [(keys[u][0], keys[u][1], ordered.encode_ids([i, i + 10]))
               for i, u in enumerate(users[:3])]
    entries.append((keys["alice"][0], keys["dave"][1], ordered.encode_ids([3, 13])))
    key, (bucket, lengths, ids) = ordered.sort_bucket((5, [entries[2:], entries[:2]]))
    assert key == 0 and bucket == 5
    assert np.frombuffer(lengths, dtype="<i4").tolist() == [2, 2, 2, 2]
    order = sorted(range(4), key=lambda i: (entries[i][0], entries[i][1]))
    assert ordered.decode_ids(ids) == [x for i in order for x in (i, i + 10)]
    with pytest.raises(ValueError, match="bucket_bits"):
        OrderedUserPolicy(PolicyGaussian(1.0, 1e-5, 3).policy, RK, bucket_bits=40)


def test_id_map_shards_by_the_ids_low_bits_and_a_shared_id_is_caught():
    n = ordered.ID_SHARDS
    item_to_id = {"a": 5, "b": 3 * n + 5, "c": 2, "d": n + 2, ("t", 1): 7 * n - 1}
    parts = ordered.shard_id_map(item_to_id)
    assert [s for s, _ in parts] == [2, 5, n - 1]                 # increasing, non-empty only
    assert [list(p.items()) for _, p in parts] == [             # the mapping's order within one
        [(2, "c"), (n + 2, "d")], [(5, "a"), (3 * n + 5, "b")], [(7 * n - 1, ("t", 1))]]
    assert ordered.shard_id_map({}) == []
    # The prepare step checks the sizes: two items with one id fail the run.
    fn = ordered._PrepareDoFn(PolicyGaussian(1.0, 1e-5, 3).policy, 2)
    fn.start_bundle()
    fn._item_ids = dict(item_to_id)
    shards = fn._id_shards()
    assert [s for s, _ in shards] == [2, 5, n - 1] and fn._item_ids == {}
    fn._item_ids = {"a": 5, "b": 3 * n + 5, "e": 5}
    with pytest.raises(P.ItemIdCollision):
        fn._id_shards()


def _greedy_policy(run_key):
    return P.GreedyPolicy(2.0, run_key.subkey("item-order"))


@pytest.mark.parametrize("bits", [0, 1, 10])
def test_any_number_of_buckets_gives_the_cores_histogram(bits):
    per_user = per_user_counts(small_dataset())
    expected = P.run_sequential(per_user, _greedy_policy(RK), RK)
    with local_pipeline() as p:
        out = (p | beam.Create(sorted(per_user.items()))
               | OrderedUserPolicy(_greedy_policy, RK, state="bag", bucket_bits=bits))
        assert_that(out, equal_to(sorted(expected.items())))


def test_describe_and_calibration():
    m = PolicyGaussian(3, math.exp(-10), 300, alpha=5)
    d = m.describe()
    assert d["mechanism"] == "policy-gaussian" and d["policy"] == "l2-descent"
    assert d["cutoff"] == pytest.approx(d["threshold"][0] + 5 * d["noise_scale"], rel=1e-15)
    g = GW(3, math.exp(-10), variant="published")
    assert g.calibration.threshold == pytest.approx(1 + (10 - math.log(2)) / 3, rel=1e-12)
    assert g.max_items is None and g.cutoff == pytest.approx(g.calibration.threshold + 1.0)
    d = g.describe()
    assert d["variant"] == "published" and d["proven"] is False and "NOT PROVEN" in d["guarantee"]
    assert d["policy"] == "greedy" and d["eta"] is None
    c = GW(3, math.exp(-10))      # the default: cascade-free, Δ0 by the rule of ε, η
    assert c.max_items == gw_default_max_items(3) == 16 and c.eta == DEFAULT_GW_ETA
    assert GW(1, 1e-6).max_items == 6 and GW(5, 1e-6).max_items == 26
    assert c.calibration.threshold == cal.gw_cascade_free_threshold(3, math.exp(-10), 16)
    assert c.cutoff == pytest.approx(c.calibration.threshold + 1.0)
    d = c.describe()
    assert (d["variant"], d["proven"], d["policy"], d["eta"], d["max_items_per_user"]) == \
        ("cascade-free", True, "cascade-free-greedy", DEFAULT_GW_ETA, 16)
    assert make_mechanism("gw", epsilon=3, delta=1e-6, max_items=7, eta=0.2).describe()[
        "max_items_per_user"] == 7
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
        OrderedUserPolicy(GWKT(1, 1e-5, PUBLIC).policy, RK)
    with pytest.raises(ValueError, match="does not use public_counts"):
        OrderedUserPolicy(GW(1, 1e-5).policy, RK, public_counts=PUBLIC)
    with pytest.raises(ValueError, match="--max-items-per-user does not apply"):
        make_mechanism("gw", epsilon=1, delta=1e-5, max_items=3, variant="published",
                       allow_unproven=True)
    with pytest.raises(ValueError, match="--eta does not apply"):
        make_mechanism("gw", epsilon=1, delta=1e-5, eta=0.1, variant="published",
                       allow_unproven=True)
    with pytest.raises(ValueError, match="not proven private; pass --allow-unproven"):
        make_mechanism("gw", epsilon=1, delta=1e-5, variant="published")
    with pytest.raises(ValueError, match="variant"):
        make_mechanism("gw", epsilon=1, delta=1e-5, variant="fast")
    with pytest.raises(ValueError, match="eta"):
        GW(1, 1e-5, eta=0)
    with pytest.raises(ValueError, match="max_items"):
        GW(1, 1e-5, max_items=0)
    with pytest.raises(ValueError, match="apply to the cascade-free GW only"):
        GW(1, 1e-5, max_items=3, variant="published")
    with pytest.raises(ValueError, match="--variant does not apply"):
        make_mechanism("policy-laplace", epsilon=1, delta=1e-5, variant="published")
    assert make_mechanism("gw", epsilon=1, delta=1e-5, variant="published",
                          allow_unproven=True).proven is False
    assert make_mechanism("policy-laplace", epsilon=1, delta=1e-5, allow_unproven=True)
    with pytest.raises(ValueError, match="needs --delta and --public-counts"):
        make_mechanism("gw-kt", epsilon=1)
    with pytest.raises(ValueError, match="not found"):
        make_mechanism("gw-kt", epsilon=1, delta=1e-5, public_counts="/nonexistent/p.tsv")


def test_auto_state_choice():
    assert ordered.resolve_state("auto", local_pipeline()) == "ordered_list"

    class OtherRunner:
        pass

    class FakePipeline:
        runner = OtherRunner()
    assert ordered.resolve_state("auto", FakePipeline()) == "bag"
    with pytest.raises(ValueError, match="state must be one of"):
        ordered.resolve_state("ordered", local_pipeline())


def test_runner_capabilities_choose_the_fallback_or_fail_clearly():
    from apache_beam.options.pipeline_options import PipelineOptions
    policy = PolicyGaussian(1.0, 1e-5, 3).policy
    p = beam.Pipeline(runner="FlinkRunner", options=PipelineOptions(["--flink_master=[local]"]))
    users = p | beam.Create([("u", {"a": 1})])
    assert ordered.resolve_state("auto", p) == "bag"          # Flink has no OrderedListState
    with pytest.raises(ValueError, match="FlinkRunner does not support"):
        _ = users | OrderedUserPolicy(policy, RK, state="ordered_list")
    direct = local_pipeline()
    assert ordered.resolve_state("auto", direct) == "ordered_list"


def test_gw_kt_kt_selection_defaults_describe_and_validation():
    m = GWKT(3.0, 1e-5, PUBLIC)
    assert (m.kt_selection, m.max_items, m.front_scale, m.front_margin) == \
        ("front", 20, params.DEFAULT_FRONT_SCALE, params.DEFAULT_FRONT_MARGIN)
    d = m.describe()
    assert (d["kt_selection"], d["front_scale"], d["front_margin"],
            d["max_items_per_user"]) == ("front", params.DEFAULT_FRONT_SCALE,
                                         params.DEFAULT_FRONT_MARGIN, 20)
    assert {"kt_selection", "front_scale", "front_margin"} <= set(d["units"])
    pol = m.policy(RK)
    assert (pol.selection, pol.front_scale, pol.front_margin) == \
        ("front", params.DEFAULT_FRONT_SCALE, params.DEFAULT_FRONT_MARGIN)
    prefix = GWKT(3.0, 1e-5, PUBLIC, kt_selection="prefix")
    assert (prefix.max_items, prefix.front_scale, prefix.policy(RK).selection) == \
        (100, None, "prefix")
    # Same threshold as GW with the same Δ0: the selection has no privacy effect.
    assert m.calibration.threshold == GW(3.0, 1e-5, max_items=20).calibration.threshold
    custom = GWKT(3.0, 1e-5, PUBLIC, max_items=7, front_scale=3, front_margin=0)
    assert (custom.max_items, custom.policy(RK).front_scale, custom.policy(RK).front_margin) \
        == (7, 3.0, 0)
    published = GWKT(3.0, 1e-5, PUBLIC, variant="published")
    assert published.describe()["kt_selection"] is None
    for kwargs, match in [({"kt_selection": "window"}, "kt_selection"),
                          ({"front_scale": 0}, "front_scale"),
                          ({"front_scale": float("nan")}, "front_scale"),
                          ({"front_margin": -1}, "front_margin"),
                          ({"front_margin": 0.5}, "front_margin"),
                          ({"kt_selection": "prefix", "front_scale": 2.0}, "'front' only"),
                          ({"variant": "published", "kt_selection": "front"}, "cascade-free"),
                          ({"variant": "published", "front_margin": 1}, "cascade-free")]:
        with pytest.raises(ValueError, match=match):
            GWKT(3.0, 1e-5, PUBLIC, **kwargs)


def test_gw_kt_kt_selection_through_the_registry():
    m = make_mechanism("gw-kt", epsilon=1.0, delta=1e-5, public_counts=__file__,
                       kt_selection="prefix")
    assert (m.kt_selection, m.max_items) == ("prefix", 100)
    m = make_mechanism("gw-kt", epsilon=1.0, delta=1e-5, public_counts=__file__,
                       front_scale=10.0, front_margin=2)
    assert (m.kt_selection, m.front_scale, m.front_margin) == ("front", 10.0, 2)
    with pytest.raises(ValueError, match="--kt-selection does not apply to mechanism 'gw'"):
        make_mechanism("gw", epsilon=1.0, delta=1e-5, kt_selection="front")
    with pytest.raises(ValueError, match="--front-scale applies to --kt-selection front only"):
        make_mechanism("gw-kt", epsilon=1.0, delta=1e-5, public_counts=__file__,
                       kt_selection="prefix", front_scale=3.0)
    with pytest.raises(ValueError, match="variant 'published'"):
        make_mechanism("gw-kt", epsilon=1.0, delta=1e-5, public_counts=__file__,
                       variant="published", allow_unproven=True, kt_selection="prefix")
