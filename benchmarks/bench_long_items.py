"""Benchmark: the keyed hash's cost per byte at every item length.

Hashes the same number of bytes (``--megabytes``) as items of one length at a time,
from 16 bytes to 1 MB, with ``noise.ItemBits`` (the release rules' bits), and prints
each length's nanoseconds per byte and its ratio against the 16-byte items measured
in the same process (the baseline), alternating the lengths over ``--repeats`` rounds.
``--numpy-only`` measures the base install's path (no numba kernels) where numba is
installed.

    python benchmarks/bench_long_items.py [--megabytes 10] [--repeats 3] [--numpy-only]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from beam_dpsu.dp.randomness import compiled
from beam_dpsu.dp.randomness.noise import ItemBits, RunKey

LENGTHS = [16, 64, 256, 1023, 1024, 16384, 300_000, 1 << 20]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--numpy-only", action="store_true")
    args = parser.parse_args(argv)
    if args.numpy_only:
        compiled.kernel = lambda name, work: None
    total = int(args.megabytes * (1 << 20))
    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    batches = {}
    for n in LENGTHS:
        count = max(1, total // n)
        data = alphabet[rng.integers(0, 26, count * n)].tobytes()
        batches[n] = (data, np.arange(count, dtype=np.int64) * n, np.full(count, n, np.int64))
    bits = ItemBits(RunKey.fresh(), "bench")
    times = {n: [] for n in LENGTHS}
    for _ in range(args.repeats):
        for n in LENGTHS:
            data, starts, lengths = batches[n]
            t = time.perf_counter()
            bits.many_str(data, starts, lengths)
            times[n].append((time.perf_counter() - t) / len(data) * 1e9)
    base = statistics.median(times[LENGTHS[0]])
    print(f"{'item bytes':>10} {'items':>8} {'ns/byte':>9} {'ratio to 16 B':>14}")
    for n in LENGTHS:
        ns = statistics.median(times[n])
        print(f"{n:>10} {len(batches[n][1]):>8} {ns:>9.1f} {ns / base:>14.2f}")


if __name__ == "__main__":
    main()
