"""The compiled policy kernels give bit-for-bit the dict policies' histogram."""
import zlib

import numpy as np
import pytest

from beam_dpsu.dp.data import kernels
from beam_dpsu.dp.data import sequential as policies
from beam_dpsu.dp.randomness.noise import RunKey

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba is not installed")

ETA = 0.05
UPDATES = {"l1-descent": policies.apply_l1, "l2-descent": policies.apply_l2,
           "greedy": policies.apply_greedy,
           "cascade-free-greedy": lambda h, u, c: policies.apply_cascade_free(h, u, c, ETA,
                                                                              1.0 - ETA)}


def random_users(seed, n_users, n_items):
    # Test data only: a seeded generator makes the case reproducible.
    rng = np.random.default_rng(seed)
    users = []
    for _ in range(n_users):
        k = int(rng.integers(1, 40))
        users.append(list(dict.fromkeys(rng.integers(0, n_items, k).tolist())))
    return users


@pytest.mark.parametrize("name", sorted(UPDATES))
@pytest.mark.parametrize("cutoff", [0.7, 2.5, 9.0])
def test_dense_runner_equals_the_dict_policy_bit_for_bit(name, cutoff):
    users = random_users(zlib.crc32(f"{name}/{cutoff}".encode()) % 1000, 3000, 500)
    hist = {}
    for u in users:
        UPDATES[name](hist, u, cutoff)
    runner = kernels.DenseRunner(name, cutoff, initial_items=4, eta=ETA)  # forces rehashing
    lengths = np.array([len(u) for u in users])
    ids = np.array([i for u in users for i in u], dtype=np.int64)
    cuts = [0, 1, 700, 701, 2500, 3000]                              # uneven batches
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for a, b in zip(cuts[:-1], cuts[1:]):
        runner.add_users(ids[offsets[a]:offsets[b]], lengths[a:b])
    assert runner.histogram() == {k: v for k, v in hist.items() if v > 0}


def test_run_sequential_is_the_same_with_and_without_numba(monkeypatch):
    rk = RunKey.from_test_seed(3)
    per_user = {f"u{i}": {f"i{j}": 1 + (i * j) % 3 for j in range(i % 30 + 1)}
                for i in range(800)}
    policy = policies.L2DescentPolicy(3.0, 10, rk.subkey("sample/0"), rk.subkey("item-order"))
    fast = policies.run_sequential(per_user, policy, rk)
    monkeypatch.setattr(kernels, "available", lambda: False)
    slow = policies.run_sequential(per_user, policy, rk)
    assert fast == slow and fast


@pytest.mark.parametrize("public", [False, True])
def test_run_sequential_cascade_free_is_the_same_with_and_without_numba(monkeypatch, public):
    rk = RunKey.from_test_seed(4)
    per_user = {f"u{i}": {f"i{(i * 7 + j) % 300}": 1 + (i * j) % 4 for j in range(i % 40 + 1)}
                for i in range(800)}
    pub = {f"i{j}": j % 5 for j in range(0, 300, 3)} if public else None
    policy = policies.CascadeFreeGreedyPolicy(3.0, rk.subkey("item-order"), 12, 0.02,
                                              use_public_counts=public)
    fast = policies.run_sequential(per_user, policy, rk, pub)
    monkeypatch.setattr(kernels, "available", lambda: False)
    slow = policies.run_sequential(per_user, policy, rk, pub)
    assert fast == slow and len(fast) > 100


def test_bad_policy_name():
    with pytest.raises(ValueError, match="no compiled kernel"):
        kernels.DenseRunner("l3-descent", 1.0)
    with pytest.raises(ValueError, match="eta"):    # η = 0 would break the support condition
        kernels.DenseRunner("cascade-free-greedy", 1.0)


def test_a_policy_with_its_own_update_is_not_replaced_by_a_kernel():
    # A subclass that overrides update (e.g. the auditor's deliberately broken greedy)
    # must run its own update, never the compiled kernel of its base class.
    calls = []

    class Custom(policies.GreedyPolicy):
        def update(self, hist, prepared):
            calls.append(len(prepared))
            super().update(hist, prepared)

    rk = RunKey.from_test_seed(1)
    policy = Custom(2.0, rk.subkey("item-order"))
    out = dict(policies.run_packed([(np.array([2, 1]), np.array([5, 6, 7]))], policy))
    assert calls == [2, 1] and out



def test_warm_up_compiles_the_batch_and_the_table_growth():
    # A first real batch that outgrows the table must not compile anything more.
    kernels.warm_up()
    assert len(kernels._apply_batch.signatures) == 1
    assert len(kernels._rehash.signatures) == 1
    runner = kernels.DenseRunner("l2-descent", 2.0, initial_items=4)
    runner.add_users(np.frombuffer(np.arange(1000, dtype="<i8").tobytes(), dtype="<i8"),
                     np.array([10] * 100))
    assert len(kernels._apply_batch.signatures) == 1
    assert len(kernels._rehash.signatures) == 1
