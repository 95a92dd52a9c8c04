"""The ``beam-dpsu`` console command (installed by setup.py): ``beam-dpsu
select|top-k|hitting-set|compare|generate|audit|setup-engines [FLAGS]`` checks the
subcommand's flags (``arguments.check``, before Apache Beam is imported), then runs its
module's ``main``. What the commands share (errors, exit statuses, progress, logging) is in
``beam_dpsu.pipelines.console``.
"""
from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
from typing import List, Optional, Sequence

from beam_dpsu.pipelines.console import (_PROG, COMMANDS, MODULE_COMMANDS, configure_logging,
                                         run_main, wants_verbose, write_line)

__all__ = ["console", "run_command", "run_module", "main"]


def console() -> None:
    """The installed ``beam-dpsu`` command (setup.py): ``sys.exit(main())``; a Ctrl-C
    during start-up (while Beam is imported, before a command handles it) is one line
    and exit status 130, as later."""
    try:
        status = main()
    except KeyboardInterrupt:
        write_line("beam-dpsu: interrupted")
        status = 130
    sys.exit(status)


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: beam-dpsu COMMAND [FLAGS]   (beam-dpsu COMMAND --help for its flags)",
             "", "Differentially private set union on Apache Beam.", "", "commands:"]
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "common flags: --verbose (show Beam's own log lines and the input's exact "
              "counts), --quiet (no progress lines on stderr)"]
    return "\n".join(lines)


def _check(command: str, argv: Sequence[str]) -> None:
    """Raises UsageError when ``argv`` cannot run as ``beam-dpsu COMMAND`` (no data is
    read, nothing is written; ``--help`` prints the help and exits 0, as argparse does):
    the release commands' flags (``arguments.check``) and ``compare``'s (its module's
    ``parse_args``, which imports Beam only to run)."""
    if command == "compare":
        from beam_dpsu.pipelines import compare
        compare.parse_args(list(argv))
    else:
        from beam_dpsu.pipelines import arguments
        arguments.check(command, argv)


@contextlib.contextmanager
def _signals_held():
    """Holds Ctrl-C (SIGINT) and SIGTERM back while the command's libraries are imported,
    in the main thread: a Ctrl-C inside a C extension's import (numpy's, measured) became
    an ImportError that the extension also printed, and the run failed with exit status 1.
    Held, the signal arrives once the imports are done, inside ``run_main`` (whose handlers
    make a SIGTERM a Ctrl-C): one line, exit status 130. Nothing starts a process in the
    window (a child would inherit the held signals)."""
    if (threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "pthread_sigmask")):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def run_command(command: str, argv: Sequence[str], prog: Optional[str] = None) -> int:
    """Runs subcommand ``command`` with ``argv`` (its flags); returns the exit status.

    Args:
      prog: the name in its messages; default ``beam-dpsu COMMAND``; "" keeps the
        module's own name (``select_partitions``), as ``python -m pipelines.NAME``.
    """
    argv = list(argv)
    verbose = wants_verbose(argv)
    configure_logging(verbose)
    token = _PROG.set("beam-dpsu " + command if prog is None else (prog or None))
    try:
        # A mistake in a flag is reported before the command's pipeline (and with it
        # Apache Beam, which takes seconds) is imported.
        loaded = []

        def check_and_import() -> int:
            with _signals_held():
                _check(command, argv)
                loaded.append(importlib.import_module(COMMANDS[command][0]))
            return 0
        status = run_main(COMMANDS[command][0].rpartition(".")[2], check_and_import)
        if status:
            return status
        return loaded[0].main(argv)
    finally:
        _PROG.reset(token)


def run_module(name: str, argv: Sequence[str]) -> int:
    """``python -m pipelines.NAME ARGS`` from a checkout: the subcommand of that module,
    reporting under the module's name as before (``select_partitions: error: ...``)."""
    return run_command(MODULE_COMMANDS[name], argv, prog="")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``beam-dpsu`` console command: ``beam-dpsu COMMAND [FLAGS]``.

    Args:
      argv: the arguments after ``beam-dpsu`` (default ``sys.argv[1:]``).

    Returns the exit status: the subcommand's; 0 for ``--help``; 2 (with
    one line on stderr) for a missing or unknown command.
    """
    args: List[str] = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(_usage(), file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] == "--version":
        from beam_dpsu import __version__
        print(f"beam-dpsu {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"beam-dpsu: error: unknown command {command!r}; choose from: "
              f"{', '.join(COMMANDS)} (beam-dpsu --help)", file=sys.stderr)
        return 2
    return run_command(command, rest)


if __name__ == "__main__":  # python -m beam_dpsu.pipelines.cli COMMAND ...
    # The importable module's main, not this __main__ copy's: the subcommands import
    # beam_dpsu.pipelines.cli, and the command's name lives in that module's state.
    from beam_dpsu.pipelines import cli as _cli
    _cli.console()
