"""Beam SDK worker processes started before the launcher asks for them.

Run by path (``python .../warm_worker.py``), never imported as part of the
package: the claim side must not import numpy or Beam, and the file's
directory (first on ``sys.path`` then) holds nothing else to import. The pool
side is ``beam_dpsu.warm_workers``; the design and its conditions are in
``docs/runners.md`` ("Worker processes started early").

``serve SOCKET``: listen on the Unix socket SOCKET (in a directory only this
user can enter), import Beam's SDK worker, then wait for ONE claim. The
claim sends its environment; if it equals this process's own (ignoring the
variables Beam sets per worker and the ones a shell adds: ``comparable``) and
the working directories match, reply ``S`` and run Beam's ``sdk_worker_main.main`` with
that environment, then send ``X`` and the exit status and exit at once (after
the exit handlers, as ``beam_dpsu/_quiet_workers`` does for Beam's own
workers). Otherwise reply ``R`` and exit. The process ends without running
anything when its standard input (a pipe from the launcher) closes before it
is claimed, and at once when its claim's connection drops.

``claim DIR``: what the launcher's worker command runs in place of ``python -m
apache_beam.runners.worker.sdk_worker_main``. Takes a free warm process in DIR
(an atomic rename of its socket, so two claims never take the same one),
hands it this process's environment and exits with its status. When no
warm process takes the claim before running anything (none left, refused,
gone), it becomes Beam's own worker (``exec``), exactly the command Beam
would have run.
"""
import json
import os
import socket
import struct
import sys
import threading

#: Environment variables that differ between a worker and its launcher by design:
#: Beam's per-worker settings, what a shell (Beam starts workers with ``sh -c``)
#: adds, and the quick-exit flag our sitecustomize removes at start-up (a warm
#: process always exits that way).
PER_WORKER_VARIABLES = frozenset({
    "CONTROL_API_SERVICE_DESCRIPTOR", "LOGGING_API_SERVICE_DESCRIPTOR", "PIPELINE_OPTIONS",
    "WORKER_ID", "PWD", "OLDPWD", "SHLVL", "_", "BEAM_DPSU_QUICK_EXIT"})

WORKER_MODULE = "apache_beam.runners.worker.sdk_worker_main"
SOCKET_SUFFIX = ".sock"
CLAIMED_SUFFIX = ".claimed"


def comparable(env) -> dict:
    """``env`` without the variables that differ per worker."""
    return {k: v for k, v in env.items() if k not in PER_WORKER_VARIABLES}


def _recv_exactly(conn, n: int) -> bytes:
    chunks = []
    while n:
        b = conn.recv(min(n, 1 << 16))
        if not b:
            raise EOFError("connection closed")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def _exit_now(status: int) -> None:
    """Runs the exit handlers, flushes logging and the standard streams, exits."""
    try:
        import atexit
        import logging
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    finally:
        os._exit(status)


def serve(sock_path: str) -> None:
    own_env = comparable(os.environ)
    own_cwd = os.getcwd()
    # The module search path of ``python -m``, which Beam's workers are started
    # with: the working directory first (not this script's directory), unless
    # the interpreter runs with safe_path (-P, PYTHONSAFEPATH): then neither.
    if not sys.flags.safe_path:
        sys.path[0] = own_cwd
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(1)
    claimed = threading.Event()

    def launcher_gone():  # standard input is a pipe from the launcher
        try:
            while sys.stdin.buffer.read(1 << 12):
                pass
        except (OSError, ValueError):
            pass
        if not claimed.is_set():
            os._exit(0)

    threading.Thread(target=launcher_gone, daemon=True).start()
    from apache_beam.runners.worker import sdk_worker_main  # the point of warming up
    conn, _ = listener.accept()
    claimed.set()
    listener.close()
    try:
        size = struct.unpack("!Q", _recv_exactly(conn, 8))[0]
        env, cwd = json.loads(_recv_exactly(conn, size).decode("utf-8"))
        if comparable(env) != own_env or cwd != own_cwd:
            conn.sendall(b"R")
            os._exit(0)
        os.environ.clear()
        os.environ.update(env)
        conn.sendall(b"S")
    except (OSError, EOFError, ValueError):
        os._exit(0)  # the claim went away before anything ran: it starts a worker itself

    finished = threading.Event()

    def claim_gone():  # the claim is the process Beam started and waits for
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        if not finished.is_set():  # (after the status is sent, the claim may go)
            os._exit(1)

    threading.Thread(target=claim_gone, daemon=True).start()
    status = 0
    try:
        sdk_worker_main.main(sys.argv)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 (reported as Beam's own worker would: a traceback)
        import traceback
        traceback.print_exc()
        status = 1
    finished.set()
    try:
        conn.sendall(b"X" + struct.pack("!i", status))
    except OSError:
        pass
    _exit_now(status)


def _try_claim(path: str):
    """The exit status of the warm worker at ``path`` after it ran, or None when it
    ran nothing (taken, refused, gone)."""
    mine = path[:-len(SOCKET_SUFFIX)] + CLAIMED_SUFFIX
    try:
        os.rename(path, mine)  # atomic: one claim per warm process
    except OSError:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(mine)
        data = json.dumps([dict(os.environ), os.getcwd()]).encode("utf-8")
        conn.sendall(struct.pack("!Q", len(data)) + data)
        if conn.recv(1) != b"S":
            return None
    except OSError:
        conn.close()
        return None
    try:
        reply = _recv_exactly(conn, 5)
    except (OSError, EOFError):
        return 1  # it died while running: as a crashed worker
    return struct.unpack("!i", reply[1:])[0]


def claim(pool_dir: str) -> int:
    try:
        names = sorted(n for n in os.listdir(pool_dir) if n.endswith(SOCKET_SUFFIX))
    except OSError:
        names = []
    for name in names:
        status = _try_claim(os.path.join(pool_dir, name))
        if status is not None:
            return status
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", WORKER_MODULE])
    return 1  # not reached


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "claim":
        sys.exit(claim(sys.argv[2]))
    else:
        sys.exit("usage: warm_worker.py serve SOCKET | claim DIR")
