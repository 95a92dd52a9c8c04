"""Makes GW-KT's public counts from public ``user<TAB>item`` data.

Usage::

    beam-dpsu public-counts --input PUBLIC_PAIRS --output COUNTS.tsv [--overwrite]

Writes one ``item<TAB>count`` line per item of the input, the count being the number
of distinct users holding the item, largest first: the file ``select --mechanism
gw-kt --public-counts`` reads. The input must be PUBLIC data similar to the private
input (an earlier public release, another project's data), never the private input
itself: the counts are used without noise and cost no privacy budget only then.

An existing ``COUNTS.tsv`` is refused (exit status 2, nothing written) unless
``--overwrite`` is given. The file is written under a temporary name and renamed into
place when complete (``.gz`` compresses).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os

from beam_dpsu.dp.data import sequential
from beam_dpsu.pipelines import console, flags
from beam_dpsu.pipelines.console import UsageError, run_main

__all__ = ["main"]

PROG = "public-counts"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=console.command_prog(PROG),
                                description=__doc__.split("\n")[0], allow_abbrev=False)
    console.add_output_flags(p)
    p.add_argument("--input", required=True,
                   help="PUBLIC file or glob of user<TAB>item lines (never the private input)")
    p.add_argument("--output", required=True,
                   help="the item<TAB>count file to write (.gz compresses), for --public-counts")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --output if it exists (default: refused)")
    flags.add_column_arguments(p)
    args = p.parse_args(argv)

    def body() -> int:
        from beam_dpsu.pipelines import outputs
        progress = console.Progress(console.command_prog(PROG), args.quiet)
        target = os.path.abspath(args.output)
        if args.output.endswith(("/", os.sep)) or os.path.isdir(target):
            raise UsageError(f"--output {args.output!r} is a directory; give a file, e.g. "
                             f"{os.path.join(args.output, 'public-counts.tsv')!r}")
        if os.path.lexists(target) and not args.overwrite:
            raise UsageError(f"{args.output!r} exists; pass --overwrite to replace it")
        paths = outputs.check_input(args.input)
        if os.path.abspath(args.input) == target:
            raise UsageError("--output is the --input file")
        outputs.check_columns(paths, args.tabs_in_items, args.trust_columns)
        directory = os.path.dirname(target)
        if not os.path.isdir(directory):
            raise UsageError(f"--output's directory {directory!r} does not exist")
        progress(f"counting the users of each item in {len(paths)} file(s)")
        counts, malformed = sequential.public_counts_from_pairs(paths)
        if not counts:
            raise UsageError(f"no well-formed user<TAB>item line in {args.input!r}")
        def write(temp: str) -> None:
            opener = gzip.open if target.endswith(".gz") else open
            with opener(temp, "wt", encoding="utf-8", newline="\n") as f:
                f.writelines(sequential.format_public_counts(counts))
        outputs.replace_local(target, write)
        if malformed:
            console.write_line(f"WARNING: {malformed} malformed line(s) of the public input "
                           f"skipped (no tab, empty user id or invalid UTF-8)")
        progress(f"wrote {len(counts)} items to {args.output}")
        print(json.dumps({"output": args.output, "items": len(counts)}))
        return 0

    return run_main(PROG, body)

