"""Benchmark: the library's work on a user's pairs before the shuffle, without Beam.

What ``SelectPartitions`` does to each bundle of ``(user, item)`` pairs on the blocks
path (``transforms.columnar.SelectFromPairs``: batches of 65,536 pairs turned into
Arrow strings, ``columnar_text.arrays_block`` and ``columnar.pair_blocks`` with the Δ0
presample), on every line of a ``user<TAB>item`` file, in this process. Prints the
CPU seconds of that work (the file's reading and splitting not counted). Run it once
per tree, alternating, to compare two trees (each imports the ``beam_dpsu`` beside it).

    python benchmarks/bench_pair_blocks.py [--input PATH] [--max-items 100]

Default input: ``../shared/data/commits-rails.pairs.tsv.gz`` (2M lines).
"""
from __future__ import annotations

import argparse
import gzip
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from beam_dpsu.dp.data import columnar, columnar_text  # noqa: E402
from beam_dpsu.dp.randomness.noise import RunKey  # noqa: E402

DEFAULT_INPUT = ROOT.parent / "shared" / "data" / "commits-rails.pairs.tsv.gz"
BATCH = 1 << 16  # SelectFromPairs' default batch_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", default=str(DEFAULT_INPUT))
    ap.add_argument("--max-items", type=int, default=100)
    args = ap.parse_args(argv)
    opener = gzip.open if args.input.endswith(".gz") else open
    with opener(args.input, "rt", encoding="utf-8") as f:
        pairs = [line.rstrip("\n").partition("\t")[::2] for line in f]
    sample = (args.max_items, RunKey.from_test_seed(1).subkey("sample/0"))
    start = time.process_time()
    for a in range(0, len(pairs), BATCH):
        batch = pairs[a:a + BATCH]
        parsed = columnar_text.arrays_block(
            columnar_text.id_strings([p[0] for p in batch]),
            columnar_text.id_strings([p[1] for p in batch], "item"))
        columnar.pair_blocks(parsed, columnar.COLUMNAR_USER_GROUPS, sample)
    print(f"{ROOT.name}: {len(pairs)} pairs, pair blocks CPU {time.process_time() - start:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
