"""The flags every command-line pipeline shares, and the check of Beam's own flags.

A user mistake in a flag raises ``UsageError`` (one line on stderr, exit
status 2) before any data is read; an argument that is neither ours nor a
registered Beam pipeline option is refused (Beam itself would only log and
drop it, so a typo such as ``--epsilonn`` would be ignored silently).

No Beam import here at module level: ``parse`` checks our own flags first and
imports Beam (to know its options) only when there are arguments left for
Beam to take, so a plain parameter mistake is reported in a fraction of the
time Beam takes to import.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, List, Optional, Sequence, TypeVar

T = TypeVar("T")

from beam_dpsu.pipelines import console
from beam_dpsu.pipelines.console import UsageError

__all__ = ["ArgumentParser", "add_io_arguments", "add_column_arguments", "add_test_seed_argument",
           "add_dead_letter_argument", "check_beam_args", "parse", "PATH_FLAGS", "absolute_paths"]


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line) instead of printing usage and exiting."""

    def __init__(self, prog: str, description: str):
        super().__init__(prog=console.command_prog(prog), description=description,
                         allow_abbrev=False)
        console.add_output_flags(self)
        self.set_defaults(_prog=self.prog)

    def error(self, message):
        raise UsageError(message)


class _RefuseSeed(argparse.Action):
    """``--seed`` on a release pipeline: refused, pointing to the unmistakable flag."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError("--seed is not accepted: a seeded run is not private; for tests only, "
                         "use --insecure-test-seed N")


def add_io_arguments(p: argparse.ArgumentParser) -> None:
    """--input, --output, --overwrite and --insecure-test-seed, as every release pipeline
    takes them (``--seed`` is refused with a pointer to ``--insecure-test-seed``)."""
    p.add_argument("--input", required=True, help="input file or glob of user<TAB>item lines")
    p.add_argument("--output", required=True,
                   help="output prefix: the release goes to PREFIX-items-00000-of-00001 and "
                        "PREFIX.json (publishable), the owner-only run details to "
                        "PREFIX.PRIVATE-run-details.json (never publish)")
    p.add_argument("--overwrite", action="store_true",
                   help="delete the outputs of an earlier run under PREFIX (and the "
                        "--dead-letter file) before running; without it such outputs are "
                        "refused")
    add_column_arguments(p)
    add_test_seed_argument(p)


def add_column_arguments(p: argparse.ArgumentParser) -> None:
    """--tabs-in-items and --trust-columns: what the column check of the input
    (``outputs.check_columns``) may take for granted. No privacy effect of their own;
    a wrong --trust-columns publishes what the first column holds."""
    p.add_argument("--tabs-in-items", action="store_true",
                   help="the item is everything after a line's first tab, tabs included "
                        "(default: a line with a third tab-separated field in the first MiB "
                        "is refused, exit 2: a count or date would be glued onto the item)")
    p.add_argument("--trust-columns", action="store_true",
                   help="the first column is the person: skip the check that refuses input "
                        "whose columns look swapped (its second column in runs, as a user's "
                        "lines are); the guarantee protects whatever the first column holds")


def add_test_seed_argument(p: argparse.ArgumentParser) -> None:
    """--insecure-test-seed N (tests only), and ``--seed`` refused with a pointer to it."""
    p.add_argument("--insecure-test-seed", dest="insecure_test_seed", type=int, metavar="N",
                   help="TESTS ONLY: derive all randomness from N; the output is NOT private "
                        "against anyone who knows or guesses N and must never be published")
    p.add_argument("--seed", nargs="?", action=_RefuseSeed, help=argparse.SUPPRESS)


def add_dead_letter_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dead-letter", dest="dead_letter",
                   help="write the malformed input lines to the owner-only file "
                        "PATH.PRIVATE-dead-letter-00000-of-00001 for the data owner (they "
                        "are private input, not a release: never publish it)")


def _beam_option_parser() -> argparse.ArgumentParser:
    """A parser that knows every registered Beam pipeline option."""
    from apache_beam.options.pipeline_options import PipelineOptions
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    seen = set()
    stack = list(PipelineOptions.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
        try:
            cls._add_argparse_args(parser)
        except argparse.ArgumentError:
            pass  # an option registered by two classes
    return parser


def check_beam_args(beam_args: Sequence[str]) -> None:
    """Raises UsageError for an argument that is neither ours nor a Beam option.

    (Beam itself only logs and drops unknown arguments, so a typo such as
    ``--epsilonn`` would otherwise be ignored silently.)
    """
    from beam_dpsu.transforms import runners
    beam_args = runners.resolve_runner_flag(list(beam_args))  # registers --dask_* options
    _, unknown = _beam_option_parser().parse_known_args(list(beam_args))
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")


#: The flags that name local files or prefixes: made absolute before a pipeline is built.
PATH_FLAGS = ("input", "output", "dead_letter", "public_counts")


def absolute_paths(args: argparse.Namespace) -> argparse.Namespace:
    """Makes every local path flag of ``args`` (``PATH_FLAGS``) absolute, in place.

    A pipeline's workers may run in another working directory (a Dask cluster's, a
    Flink task manager's): a relative ``--output`` would be written there, out of the
    user's sight, and a relative ``--input`` read from there. The launcher resolves
    them against its own directory before it builds the pipeline. URLs (``gs://``)
    are left as they are."""
    import os
    for name in PATH_FLAGS:
        value = getattr(args, name, None)
        if isinstance(value, str) and value and "://" not in value:
            # a trailing separator is kept: the checks that refuse it still see it
            tail = os.sep if value.endswith(("/", os.sep)) else ""
            setattr(args, name, os.path.abspath(value).rstrip(os.sep) + tail or os.sep)
    return args


def parse(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]],
          validate: Callable[[argparse.Namespace, List[str]], T]) -> T:
    """Parses ``argv`` (default ``sys.argv[1:]``) with ``parser`` and returns
    ``validate(args, rest)``, ``rest`` being the arguments left for Beam.

    The order of the checks: argparse's own (a missing or malformed flag of ours),
    then ``validate`` (our parameters, with no Beam import), then ``rest`` against
    Beam's registered options (``check_beam_args``, which imports Beam). When
    ``validate`` refuses a parameter and ``rest`` is not empty, ``rest`` is checked
    first, so a misspelt flag (``--epsilonn 1``, leaving ``--epsilon`` missing) is
    reported as the unrecognized argument it is (argparse's own check of a flag the
    parser declares required still comes first).
    """
    args, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    absolute_paths(args)
    try:
        result = validate(args, rest)
    except UsageError:
        if rest:
            check_beam_args(rest)
        raise
    if rest:
        check_beam_args(rest)
    return result
