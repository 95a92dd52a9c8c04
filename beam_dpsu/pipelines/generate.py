"""Writes synthetic user-keyed data (Synthetic_80M style) in the pipelines' input format.

Usage::

    beam-dpsu generate --output PATH [--users N] [--seed S] [--max-occurrences M]

Writes ``user_id<TAB>item`` lines, one per occurrence (gzip when PATH ends in
``.gz``). Each user's number of occurrences is Pareto(scale 10, shape 1.16),
each item Zipf(1.1); see ``beam_dpsu.synthetic``. The same seed and user count
give the same file.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from beam_dpsu.dp import synthetic
from beam_dpsu.pipelines import cli
from beam_dpsu.pipelines.cli import UsageError, run_main


__all__ = ["main"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=cli.command_prog("generate"),
                                description=__doc__.split("\n")[0], allow_abbrev=False)
    cli.add_output_flags(p)
    p.add_argument("--output", required=True, help="file to write (.gz for gzip)")
    p.add_argument("--users", type=int, default=10_000, help="number of users (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="data seed (default 0)")
    p.add_argument("--max-occurrences", type=int, default=None,
                   help="cap on one user's lines (default: no cap)")
    args = p.parse_args(argv)

    def body() -> int:
        start = time.time()
        progress = cli.Progress(cli.command_prog("generate"), args.quiet)
        progress(f"writing {args.users} synthetic users to {args.output}")
        try:
            lines = synthetic.write_tsv(args.output, args.users, args.seed,
                                        args.max_occurrences)
        except ValueError as e:
            raise UsageError(str(e)) from None
        progress(f"wrote {lines} lines")
        print(json.dumps({"output": args.output, "users": args.users, "lines": lines,
                          "seed": args.seed, "seconds": round(time.time() - start, 2)}))
        return 0

    return run_main("generate", body)


if __name__ == "__main__":
    # Runs the importable module (not this __main__ copy), so that what a runner
    # pickles refers to beam_dpsu.pipelines.generate, one name on every worker.
    from beam_dpsu.pipelines import cli as _cli
    sys.exit(_cli.run_module("generate", sys.argv[1:]))
