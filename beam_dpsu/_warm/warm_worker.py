"""Beam SDK worker processes started before the launcher asks for them.

Run by path (``python .../warm_worker.py``), never imported as part of the
package: the claim side must not import numpy or Beam, and the file's
directory (first on ``sys.path`` then) holds nothing else to import. The pool
side is ``beam_dpsu.warm_workers``; the design and its conditions are in
``docs/runners.md`` ("Worker processes started early").

``serve FD``: FD is a Unix socket the launcher bound (in a directory only
this user can enter) and listens on. Import Beam's SDK worker, then wait for
ONE claim. The claim sends its environment and working directory; if they
equal this process's own (ignoring the variables Beam sets per worker and the
ones a shell adds: ``comparable``), reply ``S`` and run Beam's
``sdk_worker_main.main`` with that environment and Beam's ``sys.argv``, run
the exit handlers, send ``X`` and the exit status and exit at once (as
``beam_dpsu/_quiet_workers`` does for Beam's own workers). Otherwise reply
``R`` and exit. Until claimed it ignores SIGINT (a Ctrl-C ends the launcher,
which ends it) and exits without running anything when its standard input (a
pipe from the launcher) closes or anything fails; once claimed, it exits at
once when its claim's connection drops.

``claim DIR``: what the launcher's worker command runs (``python -S``: no
site hooks, so the environment it hands on is exactly Beam's) in place of
``python -m apache_beam.runners.worker.sdk_worker_main``. Takes a free warm
process in DIR (an atomic rename of its socket, so two claims never take the
same one), hands it this process's environment and exits with its status.
When no warm process takes the claim before running anything (none left,
refused, gone), it becomes Beam's own worker (``exec`` with the same
environment), exactly the command Beam would have run.
"""
import json
import os
import signal
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


def _run_exit_handlers() -> None:
    """The exit handlers of every imported module (grpc's, Beam's), then logging's
    shutdown and a flush of the standard streams: what an interpreter's exit runs
    before its teardown, which ``os._exit`` then skips (as the command lines'
    quick exit of Beam's workers, ``beam_dpsu/_quiet_workers``)."""
    try:
        import atexit
        import logging
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except BaseException:  # noqa: BLE001 (the status is sent whatever the handlers did)
        pass


#: How much lower than the launcher's the priority of the import is (a nice
#: increment), where a thread can have its own (Linux). 3 steps halve its weight:
#: with two workers on two cores the launcher keeps nearly a whole core, and on a
#: machine busy with other work the import still gets half a normal share.
IMPORT_NICENESS = 3

#: Imported first at normal priority: they start threads when imported (numpy's
#: BLAS pool), which keep the nice value of the thread that imports them.
IMPORTED_AT_NORMAL_PRIORITY = ("numpy",)


def import_at_low_priority(module: str) -> None:
    """Imports ``module`` in a thread of lower priority (``IMPORT_NICENESS``) and waits
    for it; its errors are raised here.

    The launcher imports Beam and builds the job graph while its warm
    processes import Beam: with fewer cores than processes, the launcher goes
    first and the imports take the time it leaves. Linux gives each thread its
    own nice value, and a thread inherits its creator's: only the importing
    thread is lowered, and it ends before a claim is served, so the worker's
    own threads run at the launcher's priority (an unprivileged process could
    not raise a priority again). Threads started by the import itself keep
    the lower one; ``IMPORTED_AT_NORMAL_PRIORITY`` (numpy, whose BLAS threads
    do a worker's matrix work) are imported first in the caller's thread, so
    what is left is background threads (e.g. an allocator's). Elsewhere the
    import runs at normal priority.
    """
    for name in IMPORTED_AT_NORMAL_PRIORITY:
        try:
            __import__(name)
        except ImportError:
            pass
    failures = []

    def run():
        if sys.platform.startswith("linux"):
            try:
                os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0)
                                                       + IMPORT_NICENESS))  # this thread
            except OSError:
                pass
        try:
            __import__(module)
        except BaseException as e:  # noqa: BLE001 (raised in the caller's thread)
            failures.append(e)

    importer = threading.Thread(target=run, name="warm-import")
    importer.start()
    importer.join()
    if failures:
        raise failures[0]


def _wait_for_claim(listen_fd: int):
    """Everything before a claim: ``(connection, environment)`` of the claim this
    process will run, or None (after answering ``R`` when refused). Beam's worker
    module is imported meanwhile."""
    own_env = comparable(os.environ)
    own_cwd = os.getcwd()
    # The module search path of ``python -m``, which Beam's workers are started
    # with: the working directory first (not this script's directory), unless
    # the interpreter runs with safe_path (-P, PYTHONSAFEPATH, Python 3.11+): then neither.
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = own_cwd
    listener = socket.socket(fileno=listen_fd)  # bound and listening: see WarmWorkers
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
    import_at_low_priority(WORKER_MODULE)  # the point of warming up
    conn, _ = listener.accept()
    claimed.set()
    listener.close()
    size = struct.unpack("!Q", _recv_exactly(conn, 8))[0]
    env, cwd = json.loads(_recv_exactly(conn, size).decode("utf-8"))
    if comparable(env) != own_env or cwd != own_cwd:
        conn.sendall(b"R")
        return None
    return conn, env


def serve(listen_fd: int) -> None:
    # Until claimed, a Ctrl-C in the terminal (SIGINT reaches the whole process
    # group) is the launcher's business: it ends the run, which closes our stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        claim = _wait_for_claim(listen_fd)
        if claim is None:
            os._exit(0)
        conn, env = claim
        os.environ.clear()
        os.environ.update(env)
        # As the quiet workers' sitecustomize does at a worker's start (see there).
        os.environ.pop("BEAM_DPSU_QUICK_EXIT", None)
        conn.sendall(b"S")
    except BaseException:  # noqa: BLE001 (nothing ran: the claim starts Beam's worker itself)
        os._exit(0)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in Beam's worker
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
    from apache_beam.runners.worker import sdk_worker_main
    sys.argv = [sdk_worker_main.__file__]  # what ``python -m`` gives Beam's worker
    status = 0
    try:
        sdk_worker_main.main(sys.argv)
    except SystemExit as e:  # the status Python gives sys.exit(e.code), its message printed
        status = e.code & 0xFF if isinstance(e.code, int) else int(e.code is not None)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 (reported as Beam's own worker would: a traceback)
        import traceback
        traceback.print_exc()
        status = 1
    _run_exit_handlers()
    finished.set()
    try:
        conn.sendall(b"X" + struct.pack("!i", status))
    except OSError:
        pass
    os._exit(status)


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
        serve(int(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "claim":
        sys.exit(claim(sys.argv[2]))
    else:
        sys.exit("usage: warm_worker.py serve FD | claim DIR")
