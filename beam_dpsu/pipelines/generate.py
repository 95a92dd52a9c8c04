"""Writes synthetic user-keyed data (Synthetic_80M style) in the pipelines' input format.

Usage::

    beam-dpsu generate --output PATH [--users N] [--seed S] [--max-occurrences M]
        [--overwrite]

Writes ``user_id<TAB>item`` lines, one per occurrence (gzip when PATH ends in
``.gz``). Each user's number of occurrences is Pareto(scale 10, shape 1.16),
each item Zipf(1.1); see ``beam_dpsu.synthetic``. The same seed and user count
give the same file.

An existing ``PATH`` is refused (exit status 2, nothing written) unless
``--overwrite`` is given: ``PATH`` may be someone's real data. The file is
written under a temporary name in the same directory and renamed into place
when complete, so a failed or interrupted run (exit status 1 or 130) leaves
neither a partial file nor a directory it created.
"""
from __future__ import annotations

import argparse
import json
import os
import time
import uuid

from beam_dpsu.dp.evaluation import synthetic
from beam_dpsu.pipelines import console
from beam_dpsu.pipelines.console import UsageError, run_main


__all__ = ["main"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=console.command_prog("generate"),
                                description=__doc__.split("\n")[0], allow_abbrev=False)
    console.add_output_flags(p)
    p.add_argument("--output", required=True, help="file to write (.gz for gzip)")
    p.add_argument("--users", type=int, default=10_000, help="number of users (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="data seed (default 0)")
    p.add_argument("--max-occurrences", type=int, default=None,
                   help="cap on one user's lines (default: no cap)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace PATH if it exists (default: an existing PATH is refused)")
    args = p.parse_args(argv)

    def body() -> int:
        start = time.time()
        progress = console.Progress(console.command_prog("generate"), args.quiet)
        if args.output.endswith(("/", os.sep)) or os.path.isdir(args.output):
            raise UsageError(f"--output {args.output!r} is a directory; give a file, e.g. "
                             f"{os.path.join(args.output, 'data.tsv.gz')!r}")
        if os.path.lexists(args.output) and not args.overwrite:
            raise UsageError(f"{args.output!r} exists; pass --overwrite to replace it")
        if args.users < 1:
            raise UsageError(f"--users must be an integer >= 1, got {args.users}")
        if args.max_occurrences is not None and args.max_occurrences < 1:
            raise UsageError(f"--max-occurrences must be an integer >= 1, got "
                             f"{args.max_occurrences}")
        progress(f"writing {args.users} synthetic users to {args.output}")
        lines = _write_atomically(args)
        progress(f"wrote {lines} lines")
        print(json.dumps({"output": args.output, "users": args.users, "lines": lines,
                          "seed": args.seed, "seconds": round(time.time() - start, 2)}))
        return 0

    return run_main("generate", body)


def _write_atomically(args) -> int:
    """``synthetic.write_tsv`` to a temporary file next to ``args.output``, renamed into
    place; on any failure (or Ctrl-C) the temporary file and the directories this
    created are removed."""
    target = os.path.abspath(args.output)
    directory = os.path.dirname(target)
    missing = []
    parent = directory
    while not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    # the file keeps its own name inside a temporary directory next to it (gzip
    # records the name; write_tsv compresses by the suffix)
    temp_dir = os.path.join(directory, f".beam-dpsu-temp-{uuid.uuid4().hex}")
    temp = os.path.join(temp_dir, os.path.basename(target))
    try:
        try:
            os.makedirs(directory, exist_ok=True)
            os.mkdir(temp_dir)
            lines = synthetic.write_tsv(temp, args.users, args.seed, args.max_occurrences)
        except ValueError as e:
            raise UsageError(str(e)) from None
        os.replace(temp, target)
        os.rmdir(temp_dir)
        return lines
    except BaseException:
        cleanup = [(os.remove, temp), (os.rmdir, temp_dir)] + [(os.rmdir, m) for m in missing]
        for remove, path in cleanup:  # the file, then directories innermost first
            try:
                remove(path)
            except OSError:
                pass
        raise

