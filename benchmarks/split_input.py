"""Splits a ``user<TAB>item`` file into N gzip files by a hash of the user id.

Every line of a user goes to the same file (``zlib.crc32(user) % N``), in the
input's order, so the split input holds exactly the same users and lines.

    python benchmarks/split_input.py --input /tmp/syn100k.tsv.gz --output-dir /tmp/syn8 --files 8

Writes ``OUTPUT_DIR/part-0000i-of-0000N.tsv.gz``; the glob for the pipelines is
``OUTPUT_DIR/part-*``.
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys
import zlib


def split(input_path: str, output_dir: str, files: int, level: int = 6) -> int:
    os.makedirs(output_dir, exist_ok=True)
    outs = [gzip.open(os.path.join(output_dir, f"part-{i:05d}-of-{files:05d}.tsv.gz"), "wb",
                      compresslevel=level) for i in range(files)]
    buffers = [[] for _ in range(files)]
    n = 0
    opener = gzip.open if input_path.endswith(".gz") else open
    with opener(input_path, "rb") as f:
        for line in f:
            tab = line.find(b"\t")
            buffers[zlib.crc32(line[:tab] if tab >= 0 else line) % files].append(line)
            n += 1
            if n % 1_000_000 == 0:
                for out, buf in zip(outs, buffers):
                    out.writelines(buf)
                    buf.clear()
    for out, buf in zip(outs, buffers):
        out.writelines(buf)
        out.close()
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True)
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--files", type=int, default=8)
    args = ap.parse_args(argv)
    print(split(args.input, args.output_dir, args.files), "lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
