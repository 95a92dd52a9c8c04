"""The Synthetic_80M-style generator."""
import gzip

import numpy as np
import pytest
from scipy import stats

from beam_dpsu.dp.evaluation import synthetic


def test_deterministic_and_prefix_stable():
    a = list(synthetic.occurrences(1500, seed=3))
    b = list(synthetic.occurrences(1500, seed=3))
    c = list(synthetic.occurrences(1200, seed=3))
    assert a == b
    assert a[:len(c)] == c                       # user i does not depend on the user count
    assert a != list(synthetic.occurrences(1500, seed=4))


def test_distribution_shape():
    sizes, items = [], []
    for _, s, it in synthetic.user_blocks(20000, seed=1):
        sizes.append(s)
        items.append(it)
    sizes, items = np.concatenate(sizes), np.concatenate(items)
    assert sizes.min() >= 10                      # Pareto scale 10
    # P(size >= 20) = (10/20)^1.16 = 0.4475; binomial, false failure < 1e-7.
    p = 0.5 ** 1.16
    n = len(sizes)
    assert abs(np.mean(sizes >= 20) - p) < 5.5 * np.sqrt(p * (1 - p) / n)
    # Zipf(1.1): P(item = 1) = 1/ζ(1.1).
    q = stats.zipf(1.1).pmf(1)
    m = min(len(items), 10 ** 6)
    assert abs(np.mean(items[:m] == 1) - q) < 5.5 * np.sqrt(q * (1 - q) / m)


def test_write_tsv(tmp_path):
    path = str(tmp_path / "s.tsv.gz")
    lines = synthetic.write_tsv(path, 50, seed=2, max_occurrences=30)
    with gzip.open(path, "rt") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    assert len(rows) == lines
    assert rows == [list(x) for x in synthetic.occurrences(50, seed=2, max_occurrences=30)]
    assert max(sum(1 for r in rows if r[0] == u) for u in {r[0] for r in rows}) <= 30


def test_bad_arguments():
    with pytest.raises(ValueError):
        list(synthetic.user_blocks(-1))
    with pytest.raises(ValueError):
        list(synthetic.user_blocks(10, seed=-1))


def test_write_tsv_creates_missing_folders(tmp_path):
    path = tmp_path / "new" / "sub" / "data.tsv.gz"
    assert synthetic.write_tsv(str(path), 3, seed=0) > 0 and path.exists()
