"""What every command of the project shares: one-line errors and exit statuses, progress
lines, the commands' names and Beam's log lines.

``run_main(prog, body)`` runs ``body()`` and turns what it raises into one
line on stderr and an exit status: ``UsageError`` (a user mistake) → 2,
``prog: error: ...``; an exception with an ``exit_status`` attribute (e.g.
``beam_dpsu.pipelines.runs.NoWellFormedInput``) → that status, ``prog: error: ...``;
Ctrl-C or SIGTERM → 130, ``prog: interrupted`` (also when a runner reports the
KeyboardInterrupt of a worker thread as another exception: ``interrupted``);
anything else → 1, ``prog: failed: Type: last line`` (the traceback is logged
at DEBUG level). Beam's own log lines (the ``apitools not found`` warning printed
when apache_beam is imported, INFO lines of its workers) are suppressed unless
``--verbose`` is given (or ``BEAM_DPSU_DEBUG=1``); progress lines go to stderr
unless ``--quiet`` is given.

Every command module imports this one; only ``cli`` (the ``beam-dpsu`` dispatcher)
imports the command modules.
"""
from __future__ import annotations

import argparse
import contextvars
import logging
import re
import signal
import time
import os
import sys
import threading
from typing import Callable, Optional, Sequence


__all__ = ["UsageError", "last_line", "command_prog", "add_output_flags", "write_line", "Progress", "interrupted", "run_main", "COMMANDS", "MODULE_COMMANDS", "wants_verbose", "beam_logs_shown", "configure_logging"]


class UsageError(Exception):
    """A user mistake: reported as one line, exit status 2."""

    exit_status = 2


def last_line(e: BaseException) -> str:
    """``Type: last line of the message`` (a one-line summary of a failure)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"


#: the name a command reports itself under (``beam-dpsu select``), set by
#: ``run_command``; None: the module's own name (``select_partitions``).
_PROG: contextvars.ContextVar = contextvars.ContextVar("beam_dpsu_prog", default=None)


def command_prog(default: str) -> str:
    """The name of the running command: ``beam-dpsu SUBCOMMAND`` under the console
    command, else ``default`` (the module's name)."""
    return _PROG.get() or default


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """``--verbose`` and ``--quiet``, which every command takes (no privacy effect)."""
    parser.add_argument("--verbose", action="store_true",
                        help="also show Apache Beam's own log lines and the input's exact "
                             "counts (users, malformed lines: owner-only, like the private "
                             "run details; a shared cluster's logs are seen by others). "
                             "Default: our progress lines, without exact counts")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress lines on stderr (default: stage and progress "
                             "lines)")


def write_line(text: str, stream=None) -> None:
    """Writes ``text`` and its newline to ``stream`` (default ``sys.stderr``) in ONE
    write, then flushes.

    A command's workers share its stderr. ``print`` writes the text and the
    newline separately, and with ``PYTHONUNBUFFERED`` set (common in containers
    and CI) each write is its own system call: two processes printing at once
    then leave one line holding both texts and an empty line. One write of a
    whole line shorter than the pipe's atomic size (4 KiB on Linux) is never
    split by another process's.

    Best effort: when the stream cannot be written (its reader is gone, e.g.
    ``beam-dpsu select ... 2>&1 | head -1``, or it is closed), the line is
    dropped and the run goes on; a worker whose progress line failed used to
    fail its bundle, and a two-worker run then waited forever.
    """
    stream = sys.stderr if stream is None else stream
    try:
        stream.write(text + "\n")
        stream.flush()
    except (OSError, ValueError):  # BrokenPipeError; ValueError: a closed file
        pass


class Progress:
    """Progress lines on stderr: ``PROG: [12.3 s] message``, unless quiet.

    Args:
      prog: the command's name, first on each line.
      quiet: True: print nothing (``--quiet``). Default False.
    """

    def __init__(self, prog: str, quiet: bool = False):
        self.prog, self.quiet, self.start = prog, quiet, time.time()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            write_line(f"{self.prog}: [{time.time() - self.start:.1f} s] {message}")


#: How Beam reports a KeyboardInterrupt raised inside a DoFn: it cannot rebuild the
#: exception with the step's name, so it raises
#: ``RuntimeError("KeyboardInterrupt [while running 'STEP']")`` instead.
_WRAPPED_INTERRUPT = re.compile(r"^KeyboardInterrupt(\s*\[while running .*\])?\s*$")


def interrupted(e: BaseException) -> bool:
    """Whether ``e`` comes from a Ctrl-C: a KeyboardInterrupt, an exception raised while
    one was being handled or caused by one (its ``__context__`` / ``__cause__``
    chain), or a RuntimeError whose message's first or last line is Beam's report of
    one (``KeyboardInterrupt [while running 'STEP']``)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt):
            return True
        lines = [l for l in str(e).strip().splitlines() if l.strip()]
        if isinstance(e, RuntimeError) and lines and any(
                _WRAPPED_INTERRUPT.match(l.strip()) for l in (lines[0], lines[-1])):
            return True
        e = e.__cause__ or e.__context__
    return False


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_main(prog: str, body: Callable[[], int]) -> int:
    """``body()``'s exit status, or the status of what it raised (see the module).

    A SIGTERM (``kill``, a scheduler ending a job) is handled as a Ctrl-C: the run
    stops, removes what it made (its staged shuffles among them) and exits 130."""
    prog = command_prog(prog)
    main = threading.current_thread() is threading.main_thread()
    if main:
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _run_body(prog, body)
    finally:
        if main:  # a handler installed outside Python reads as None: the default then
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _run_body(prog: str, body: Callable[[], int]) -> int:
    try:
        return body()
    except KeyboardInterrupt:
        write_line(f"{prog}: interrupted")
        return 130
    except Exception as e:  # one line per failure
        if interrupted(e):  # Ctrl-C, as a runner reported it
            logging.debug("%s interrupted", prog, exc_info=True)
            write_line(f"{prog}: interrupted")
            return 130
        status = getattr(e, "exit_status", None)
        if isinstance(status, int):
            write_line(f"{prog}: error: {e}")
            return status
        logging.debug("%s failed", prog, exc_info=True)
        write_line(f"{prog}: failed: {_rpc_failure(e) or last_line(e)}")
        return 1


def _rpc_failure(e: BaseException) -> Optional[str]:
    """A gRPC error (a portable runner's job service or engine gone) as one line; None
    for any other exception (whose own last line is clearer than gRPC's repr)."""
    code, details = getattr(e, "code", None), getattr(e, "details", None)
    if not (callable(code) and callable(details)):
        return None
    try:
        return (f"the runner's job service stopped answering ({getattr(code(), 'name', code())}"
                f": {details()})")
    except Exception:  # a look-alike that is not a gRPC error
        return None


#: subcommand → (module, one-line description); the modules are imported only
#: when their subcommand runs (importing apache_beam takes seconds).
COMMANDS = {
    "select": ("beam_dpsu.pipelines.select_partitions",
               "differentially private set union of a user<TAB>item file"),
    "top-k": ("beam_dpsu.pipelines.top_k", "differentially private top-k items"),
    "hitting-set": ("beam_dpsu.pipelines.hitting_set",
                    "differentially private k-hitting set: items that hit the most users"),
    "compare": ("beam_dpsu.pipelines.compare",
                "compare mechanisms on your data: tables and plots (NOT private)"),
    "generate": ("beam_dpsu.pipelines.generate", "write synthetic user<TAB>item data"),
    "public-counts": ("beam_dpsu.pipelines.public_counts",
                      "gw-kt's --public-counts file from PUBLIC user<TAB>item data"),
    "audit": ("beam_dpsu.pipelines.audit", "empirical privacy audit: a lower bound on epsilon"),
    "setup-engines": ("beam_dpsu.pipelines.setup_engines",
                      "fetch or build Prism, Flink's or Spark's engine for --runner"),
    "flink-cluster": ("beam_dpsu.pipelines.flink_cluster",
                      "start or stop a local Flink session cluster for --runner=FlinkRunner"),
}

#: checkout module names (``python -m pipelines.NAME``) → subcommand.
MODULE_COMMANDS = {"select_partitions": "select", "top_k": "top-k", "compare": "compare",
                   "generate": "generate", "audit": "audit", "hitting_set": "hitting-set",
                   "public_counts": "public-counts"}

_LOG_FORMAT = "%(levelname)s: %(message)s"


def wants_verbose(argv: Sequence[str]) -> bool:
    """``--verbose`` among the arguments, or ``BEAM_DPSU_DEBUG`` set."""
    return "--verbose" in argv or bool(os.environ.get("BEAM_DPSU_DEBUG"))


_BEAM_LOGS = {"shown": True}

#: Python's own hook for an exception that ends a thread (restored by ``--verbose``).
_THREAD_EXCEPTHOOK = threading.excepthook


def _log_thread_exception(args) -> None:
    """``threading.excepthook`` of a command without ``--verbose``: a DEBUG log line."""
    logging.debug("thread %s ended by an exception",
                  getattr(args.thread, "name", "?"),
                  exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def beam_logs_shown() -> bool:
    """False once a command configured logging without ``--verbose`` (then worker
    subprocesses are quietened too); True otherwise (library use: untouched)."""
    return _BEAM_LOGS["shown"]


def configure_logging(verbose: bool) -> None:
    """Sets up logging for a command, BEFORE apache_beam is imported.

    Args:
      verbose: True: Beam's log lines (INFO and up) are shown, as Beam prints
        them; False (default of the commands): only errors of our own are
        logged, so Beam's import-time ``apitools`` warning and its INFO lines
        never reach stderr, and an exception that ends a background thread
        (Beam's worker-handler threads when a worker process dies, e.g. on
        Ctrl-C) is logged at DEBUG level instead of printed as a traceback: the
        command's own one-line report says what happened. No privacy effect.
    """
    _BEAM_LOGS["shown"] = verbose
    threading.excepthook = (_THREAD_EXCEPTHOOK if verbose or os.environ.get("BEAM_DPSU_DEBUG")
                            else _log_thread_exception)
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        handler._beam_dpsu = True
        root.addHandler(handler)
    for handler in root.handlers:
        if getattr(handler, "_beam_dpsu", False):
            # A logger that sets its own level passes INFO records to the root's handlers
            # whatever the root's level (Beam sets its Prism job server's logger to INFO,
            # and Prism's own lines come through it): our handler drops them itself.
            handler.setLevel(logging.NOTSET if verbose else logging.ERROR)
    if verbose:
        root.setLevel(logging.DEBUG if os.environ.get("BEAM_DPSU_DEBUG") else logging.INFO)
        logging.getLogger("apache_beam").setLevel(logging.NOTSET)
    else:
        root.setLevel(logging.ERROR)
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
