"""What every command line of the project shares: one-line errors and exit statuses.

``run_main(prog, body)`` runs ``body()`` and turns what it raises into one
line on stderr and an exit status: ``UsageError`` (a user mistake) → 2,
``prog: error: ...``; an exception with an ``exit_status`` attribute (e.g.
``pipelines.common.NoWellFormedInput``) → that status, ``prog: error: ...``;
KeyboardInterrupt → 130; anything else → 1, ``prog: failed: Type: last
line`` (the traceback is logged at DEBUG level). Used by the pipelines
(``pipelines.common.main_wrapper``) and the auditor (``beam_dpsu.audit``).
"""
from __future__ import annotations

import logging
import sys
from typing import Callable


class UsageError(Exception):
    """A user mistake: reported as one line, exit status 2."""

    exit_status = 2


def last_line(e: BaseException) -> str:
    """``Type: last line of the message`` (a one-line summary of a failure)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"


def run_main(prog: str, body: Callable[[], int]) -> int:
    """``body()``'s exit status, or the status of what it raised (see the module)."""
    try:
        return body()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line per failure
        status = getattr(e, "exit_status", None)
        if isinstance(status, int):
            print(f"{prog}: error: {e}", file=sys.stderr)
            return status
        logging.debug("%s failed", prog, exc_info=True)
        print(f"{prog}: failed: {last_line(e)}", file=sys.stderr)
        return 1
