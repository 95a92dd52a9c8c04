"""What the command-line pipelines share: argument checks, the run, the summary.

Conventions of every pipeline here:

* a user mistake (bad parameter, unknown flag, no input file, an output
  location that cannot be written) raises ``UsageError`` before any data is
  read, and ``main`` turns it into one line on stderr and exit status 2;
* any other failure is one line on stderr and exit status 1 (set the
  environment variable ``BEAM_DPSU_DEBUG=1`` to see Beam's own logs and the
  traceback);
* the summary is JSON at ``PREFIX.json``; ``num_users`` and
  ``malformed_lines`` are exact counts for the data owner, not private.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam import coders
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_dpsu import __version__
from beam_dpsu.noise import RunKey
from beam_dpsu.textio import match_files

NOT_PRIVATE_NOTE = ("num_users and malformed_lines are exact counts for the data owner; they "
                    "are not differentially private.")


class UsageError(Exception):
    """A user mistake: reported as one line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line) instead of printing usage and exiting."""

    def __init__(self, prog: str, description: str):
        super().__init__(prog=prog, description=description, allow_abbrev=False)

    def error(self, message):
        raise UsageError(message)


def add_io_arguments(p: argparse.ArgumentParser) -> None:
    """--input, --output and --seed, as every pipeline takes them."""
    p.add_argument("--input", required=True, help="input file or glob of user<TAB>item lines")
    p.add_argument("--output", required=True,
                   help="output prefix: items go to PREFIX-items-*, the summary to PREFIX.json")
    p.add_argument("--seed", type=int,
                   help="TEST ONLY: derive all randomness from this seed (the run is then "
                        "not private against anyone who knows the seed)")


def add_dead_letter_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dead-letter", dest="dead_letter",
                   help="write the malformed input lines to files PATH-* for the data owner "
                        "(they are private input, not a release)")


def _repeat_line(element):
    line, n = element
    return [line] * n


def write_dead_letter(malformed: beam.PCollection, path: Optional[str]) -> None:
    """Writes ``(line, count)`` malformed lines (raw bytes, each occurrence) to ``path-*``."""
    if path:
        (malformed
         | "RepeatMalformed" >> beam.FlatMap(_repeat_line)
         | "WriteDeadLetter" >> beam.io.WriteToText(path, coder=coders.BytesCoder()))


def dead_letter_summary(path: Optional[str]) -> Dict[str, Any]:
    return {"dead_letter": (path + "-*") if path else None}


DEAD_LETTER_NOTE = (" The dead-letter files hold private input lines: they are not a release "
                    "and must not be published.")


def _beam_option_parser() -> argparse.ArgumentParser:
    """A parser that knows every registered Beam pipeline option."""
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
    _, unknown = _beam_option_parser().parse_known_args(list(beam_args))
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")


def flag_names(message: str, names: Sequence[str] = ()) -> str:
    """Names parameters in a validation message as command-line flags."""
    message = message.replace("max_items_per_user", "--max-items-per-user")
    message = re.sub(r"^tie_break ", "--tie-break ", message)
    for name in names:
        message = re.sub(rf"(?<![-\w]){name}\b", "--" + name.replace("_", "-"), message)
    return re.sub(r"^(epsilon|delta|rho|alpha|rounds|ratio|k) ", r"--\1 ", message)


def check_locations(input_pattern: str, *output_prefixes: Optional[str]) -> None:
    """UsageError unless the input matches a file and each output can be written."""
    if not match_files(input_pattern):
        raise UsageError(f"no input file matches {input_pattern!r}")
    for prefix in output_prefixes:
        if not prefix:
            continue
        probe = f"{prefix}.beam-dpsu-probe-{uuid.uuid4().hex}"
        try:
            parent = os.path.dirname(prefix)
            if parent and "://" not in prefix and not os.path.isdir(parent):
                os.makedirs(parent, exist_ok=True)
            with FileSystems.create(probe) as f:
                f.write(b"")
            FileSystems.delete([probe])
        except Exception as e:  # any filesystem's refusal
            raise UsageError(f"cannot write to {prefix!r}: {_last_line(e)}") from None


def make_run_key(seed: Optional[int]) -> RunKey:
    """The run's key: fresh OS randomness, or derived from a test seed (with a warning)."""
    if seed is None:
        return RunKey.fresh()
    print("WARNING: seeded run (--seed): NOT private against anyone who knows the seed",
          file=sys.stderr)
    return RunKey.from_test_seed(seed)


class CountUsers(beam.DoFn):
    """Passes per-user elements through, counting them in ``beam_dpsu/users``."""

    def __init__(self):
        self._users = beam.metrics.Metrics.counter("beam_dpsu", "users")

    def process(self, element):
        self._users.inc()
        yield element


def run_pipeline(beam_args: Sequence[str], build: Callable[[beam.Pipeline], None]):
    """Builds and runs a pipeline; returns (result, wall seconds, runner name)."""
    options = PipelineOptions(list(beam_args))
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    start = time.time()
    p = beam.Pipeline(options=options)
    build(p)
    result = p.run()
    result.wait_until_finish()
    return result, time.time() - start, runner


def counter(result, name: str) -> Optional[int]:
    """A ``beam_dpsu`` counter's value, or None where the runner has no metrics."""
    try:
        counters = result.metrics().query(MetricsFilter().with_namespace("beam_dpsu")
                                          .with_name(name))["counters"]
    except Exception:  # a runner without metrics support
        return None
    if not counters:
        return 0
    return int(sum((c.committed if c.committed is not None else c.attempted) or 0
                   for c in counters))


def count_output_lines(prefix: str) -> int:
    """Non-empty lines in the files ``PREFIX-items-*`` (fallback without metrics)."""
    total = 0
    for path in match_files(prefix + "-items-*"):
        with FileSystems.open(path) as f:
            total += sum(1 for line in f if line.strip())
    return total


def run_summary(result, args, run_key: RunKey, runner: str, wall: float) -> Dict[str, Any]:
    """The run statistics every summary has."""
    released = counter(result, "released")
    if released is None:
        released = count_output_lines(args.output)
    return {
        "num_users": counter(result, "users"),
        "num_released": released,
        "malformed_lines": counter(result, "malformed_lines"),
        "seeded": run_key.seeded,
        "runner": runner,
        "wall_seconds": round(wall, 3),
        "input": args.input,
        "items_output": args.output + "-items-*",
        "beam_dpsu_version": __version__,
        "not_private": ["num_users", "malformed_lines"],
    }


def write_summary(prefix: str, summary: Dict[str, Any]) -> None:
    with FileSystems.create(prefix + ".json") as f:
        f.write((json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


def _last_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"


def main_wrapper(prog: str, run: Callable[[Optional[Sequence[str]]], Dict[str, Any]],
                 argv: Optional[Sequence[str]], echo: Sequence[str]) -> int:
    """Runs ``run(argv)`` with the exit-status conventions; prints ``echo`` keys as JSON."""
    debug = bool(os.environ.get("BEAM_DPSU_DEBUG"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s: %(message)s")
    if not debug:  # Beam logs worker failures with tracebacks; we print one line instead
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
        logging.getLogger().setLevel(logging.ERROR)
    try:
        summary = run(argv)
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a failure while running: one line (details with BEAM_DPSU_DEBUG)
        logging.debug("pipeline failed", exc_info=True)
        print(f"{prog}: failed: {_last_line(e)}", file=sys.stderr)
        return 1
    print(json.dumps({k: summary.get(k) for k in echo}, ensure_ascii=False))
    return 0


def parse_known(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]
                ) -> Tuple[argparse.Namespace, List[str]]:
    """Our flags and the rest (Beam's), after checking the rest are Beam options."""
    args, beam_args = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    check_beam_args(beam_args)
    return args, beam_args
