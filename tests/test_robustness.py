"""Odd input: empty, huge users, odd strings and types, None, retries.

Every case runs through the public transforms or the command line and checks
that nothing crashes, nothing is silently changed, and nothing unbounded is
released.
"""
import glob
import json
import pickle

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dpsu.dp.data.contribution import IdTypeError, per_user_counts
from beam_dpsu.transforms.bounding import SampleItems, _SampleDoFn
from beam_dpsu.dp.data.contribution import sample_items
from beam_dpsu.dp.mechanisms import CountGaussian
from beam_dpsu.transforms.select import SelectPartitions
from beam_dpsu.dp.mechanisms import policy as policy_family
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.pipelines import select_partitions

from conftest import local_pipeline


def read_items(prefix):
    out = []
    for path in sorted(glob.glob(prefix + "-items-*")):
        with open(path, encoding="utf-8") as f:
            out += f.read().split("\n")[:-1]
    return out


def run_cli(path, prefix, *extra):
    rc = select_partitions.main(["--input", str(path), "--output", prefix, "--mechanism",
                                 "count-gaussian", "--epsilon", "2", "--delta", "1e-6",
                                 "--max-items-per-user", "3", "--insecure-test-seed", "1", *extra])
    assert rc == 0
    with open(prefix + ".PRIVATE-run-details.json", encoding="utf-8") as f:
        return json.load(f)


def test_user_with_a_million_items_is_bounded(tmp_path):
    # One user with 1,000,000 distinct items plus 200 ordinary users sharing "common".
    path = tmp_path / "huge.tsv"
    with open(path, "w") as f:
        f.write("".join(f"whale\tw{j}\n" for j in range(1_000_000)))
        f.write("".join(f"u{u}\tcommon\n" for u in range(200)))
    prefix = str(tmp_path / "out")
    s = run_cli(path, prefix)
    assert s["num_users"] == 201
    assert read_items(prefix) == ["common"]      # the whale's items are held by one user


def test_sample_of_a_million_items_is_exactly_max_items():
    counts = {f"w{j}": 1 for j in range(1_000_000)}
    kept = sample_items("whale", counts, 100, RunKey.fresh().subkey("sample/0"))
    assert len(kept) == 100 and set(kept) <= set(counts)


def test_unicode_long_and_empty_items_round_trip(tmp_path):
    odd = ["", "é", "日本語", "🙂‍↔️", "\u200f\u05e9\u05dc\u05d5\u05dd", "a b  c", "x" * 1_000_000,
           "tab\tinside", "\u0000nul"]
    path = tmp_path / "odd.tsv"
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for u in range(300):
            for item in odd:
                f.write(f"user{u}\t{item}\n")
    prefix = str(tmp_path / "out")
    rc = select_partitions.main(["--input", str(path), "--output", prefix, "--mechanism",
                                 "count-gaussian", "--epsilon", "2", "--delta", "1e-6",
                                 "--max-items-per-user", "20", "--insecure-test-seed", "1",
                                 "--tabs-in-items"])   # "tab\tinside" is one item
    assert rc == 0
    assert sorted(read_items(prefix)) == sorted(odd)


def test_duplicate_lines_count_once_per_user(tmp_path):
    path = tmp_path / "dup.tsv"
    path.write_text("".join("u1\tonly-u1\n" for _ in range(10_000)) +
                    "".join(f"u{u}\tshared\n" for u in range(2, 300)))
    prefix = str(tmp_path / "out")
    run_cli(path, prefix)
    assert read_items(prefix) == ["shared"]


def test_none_user_ids_and_items_fail_the_pipeline_with_one_clear_error():
    # Refused, not dropped: a None id cannot be what the user meant (tests/test_identity.py).
    for bad, message in [((None, "x"), "a user id of type NoneType"),
                         (("u1", None), "an item of type NoneType")]:
        occ = [bad] + [(f"u{i}", "ok") for i in range(300)]
        with pytest.raises(IdTypeError, match=message):
            with local_pipeline() as p:
                _ = p | beam.Create(occ) | SelectPartitions(CountGaussian(2, 1e-6, 3),
                                                             RunKey.from_test_seed(1))


def test_bytes_ints_and_tuples_are_released_unchanged():
    # float items are refused (tests/test_identity.py).
    items = [b"\xff\x00raw", 42, ("tuple", 1), "42"]
    occ = [(u, it) for u in range(300) for it in items]
    with local_pipeline() as p:
        out = p | beam.Create(occ) | SelectPartitions(CountGaussian(2, 1e-6, 10),
                                                       RunKey.from_test_seed(2))
        assert_that(out, equal_to(items))


def test_integer_and_string_user_ids_are_distinct_users():
    # 150 users as ints and the same 150 as strings: 300 distinct users.
    occ = [(u, "x") for u in range(150)] + [(str(u), "x") for u in range(150)]
    per_user = per_user_counts(occ)
    assert len(per_user) == 300


def test_a_retried_bundle_draws_the_same_sample():
    # A runner that retries a bundle re-runs the same DoFn (deserialised again) on the
    # same input: the sample must be identical, so a retry cannot leak a second draw.
    # The key bytes reach the DoFn as a side input (the same committed value on
    # every attempt), never inside the pickled DoFn.
    key_bytes = RunKey.from_test_seed(77)._material()
    users = [(f"u{i}", {f"i{j}": 1 for j in range(50)}) for i in range(20)]
    def bundle(fn, elements, key):
        # one bundle: the DoFn samples its users in a batch, emitted at the bundle's end
        fn.start_bundle()
        out = [o for u in elements for o in fn.process(u, key)]
        out += [getattr(o, "value", o) for o in fn.finish_bundle()]
        return dict(out)

    fn = _SampleDoFn(5, "sample/0")
    first = bundle(fn, users, key_bytes)
    assert len(first) == 20 and all(len(kept) == 5 for kept in first.values())
    retried_fn = pickle.loads(pickle.dumps(fn))
    assert bundle(retried_fn, users[::-1], key_bytes) == first  # other order, same samples
    # And with a fresh (secret) key per run, two runs differ.
    assert bundle(fn, users, RunKey.fresh()._material()) != first


def test_users_with_one_item_and_empty_users():
    per_user = [("a", {"x": 1}), ("b", {}), ("c", {"x": 5})]
    with local_pipeline() as p:
        out = p | beam.Create(per_user) | SampleItems(1, RunKey.from_test_seed(0))
        assert_that(out, equal_to([("a", {"x": 1}), ("c", {"x": 5})]))


def test_a_retried_bundle_gets_the_same_user_order_and_preparation():
    from beam_dpsu.transforms import ordered
    from beam_dpsu.dp.data import sequential as policies
    rk = RunKey.from_test_seed(5)
    mech = policy_family.PolicyGaussian(1.0, 1e-6, 5)
    users = [(f"u{i}", {f"i{j}": 1 for j in range(i % 12 + 1)}) for i in range(40)]

    def plain(o):
        if isinstance(o, beam.pvalue.TaggedOutput):
            return (o.tag, o.value)
        return getattr(o, "value", o)

    def run_bundle(fn):
        fn.start_bundle()
        out = [plain(o) for u in users for o in fn.process(u, rk._material())]
        return out, [plain(v) for v in fn.finish_bundle()]

    fn = ordered._PrepareDoFn(mech.policy, 8)
    first = run_bundle(fn)
    retried = run_bundle(pickle.loads(pickle.dumps(fn)))
    assert first == retried
    # The order key of a user depends on the run key and the user id only.
    assert policies.user_sort_key(rk.subkey("order"), "u3") == \
        policies.user_sort_key(RunKey.from_test_seed(5).subkey("order"), "u3")


def _prepare_outputs(fn, users, key_bytes, abandon_after=None):
    """Runs one bundle of ``_PrepareDoFn`` by hand: (buckets {bucket: users}, id map
    {id: item}) of what it emitted, merged over its flushes. ``abandon_after``: the
    bundle fails after that many users (nothing is returned, as a runner drops it)."""
    buckets, id_map = {}, {}

    def take(o):
        tagged = isinstance(o, beam.pvalue.TaggedOutput)
        value = getattr(o.value if tagged else o, "value", o.value if tagged else o)
        if tagged:
            part = pickle.loads(value[1])
            assert all(id_map.get(i, item) == item for i, item in part.items())
            id_map.update(part)
        else:
            buckets.setdefault(value[0], []).extend(value[1])

    fn.start_bundle()
    for k, u in enumerate(users):
        if abandon_after is not None and k == abandon_after:
            return None
        for o in fn.process(u, key_bytes):
            take(o)
    for o in fn.finish_bundle():
        take(o)
    return {b: sorted(v) for b, v in buckets.items()}, id_map


@pytest.mark.parametrize("mechanism", ["policy-gaussian", "gw"])
def test_prepare_id_maps_hold_every_prepared_item_once_per_bundle(mechanism):
    """The id map a bundle emits holds exactly the items its users' ids stand for,
    whatever the flush sizes, and a bundle retried on the same DoFn instance (its
    policy's item-id cache then already holds the items) emits all of them again."""
    from beam_dpsu.transforms import ordered
    rk = RunKey.from_test_seed(6)
    mech = (policy_family.PolicyGaussian(1.0, 1e-6, 5) if mechanism == "policy-gaussian"
            else policy_family.GW(1.0, 1e-6))
    users = [(f"u{i}", {f"i{(i * 7 + j) % 60}": 1 + j % 3 for j in range(i % 13 + 1)})
             for i in range(80)]
    policy = mech.policy(rk)
    expected_items = set()
    for user, counts in users:
        ids, items = policy.prepare(user, counts)
        expected_items |= set(items) if ids else set()

    fn = ordered._PrepareDoFn(mech.policy, 8)
    whole = _prepare_outputs(fn, users, rk._material())
    assert set(whole[1].values()) == expected_items
    assert all(policy.item_ids(item) == i for i, item in whole[1].items())
    # Retried on the same instance after a failure half way: the same outputs.
    assert _prepare_outputs(fn, users, rk._material(), abandon_after=40) is None
    assert _prepare_outputs(fn, users, rk._material()) == whole
    # Small flushes: the same users per bucket, the same id map.
    small = ordered._PrepareDoFn(mech.policy, 8)
    small.FLUSH_PAIRS, small.FLUSH_IDS = 7, 11
    assert _prepare_outputs(small, users, rk._material()) == whole


def test_prepare_per_group_sends_the_id_map_once_per_group():
    """Where finish_bundle outputs are dropped (Dask), a group of users is prepared as
    one bundle: its buckets and its id map leave once per group (each id shard once),
    not once per user, and hold every prepared item."""
    from beam_dpsu.transforms import ordered
    rk = RunKey.from_test_seed(7)
    mech = policy_family.PolicyGaussian(1.0, 1e-6, 5)
    users = [(f"u{i}", {f"i{(i * 5 + j) % 40}": 1 for j in range(i % 9 + 1)})
             for i in range(60)]
    fn = ordered._PrepareGroupDoFn(mech.policy, 8)
    out = list(fn.process(("group", users), rk._material()))
    id_parts = [value for tag, value in out if tag == ordered._PrepareDoFn.IDS]
    shards = [shard for shard, _ in id_parts]
    assert len(shards) == len(set(shards))  # each shard once for the whole group
    id_map = {}
    for _, blob in id_parts:
        id_map.update(pickle.loads(blob))
    policy = mech.policy(rk)
    want = set()
    for user, counts in users:
        ids, items = policy.prepare(user, counts)
        want |= set(items)
    assert set(id_map.values()) == want
