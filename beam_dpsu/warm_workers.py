"""Worker processes for the multi-process DirectRunner, started before they are needed.

With ``--direct_running_mode=multi_processing``, Beam's FnApiRunner starts its
``direct_num_workers`` worker processes (``python -m
apache_beam.runners.worker.sdk_worker_main``) when the first stage is about to
run, after the whole graph has been built and translated. Each of them then
imports Beam (about 0.8 s of CPU on the machine of ``benchmarks/RESULTS.md``)
before it can take any work, while the launcher waits: on 8 input files of
100,000 synthetic users, about 1 s of a 10–11 s two-worker run.

``WarmWorkers(n)`` starts n processes at once that do that import and then
wait; ``FnApiDirectRunner`` (``beam_dpsu.runners``) starts them when it is
given a multi-process run (the command lines start them before they build
the graph, ``beam_dpsu.pipelines.common.run_pipeline``) and has Beam start a
small *claim* command instead of its worker. The claim hands its
environment to a warm process, which runs Beam's worker entry point
(``sdk_worker_main.main``) exactly as the started worker would, and exits
with its status. Correctness rests on five conditions, each tested in
``tests/test_warm_workers.py``:

1. A warm worker runs with the environment, working directory and
   interpreter Beam would have given its worker: the claim sends its whole
   environment and working directory, and the warm process refuses (the claim
   then starts Beam's own worker) unless they equal its own except for the
   per-worker variables (``PER_WORKER_VARIABLES``); it was started with
   ``sys.executable``, as Beam starts its workers, with the module search path
   of ``python -m`` and Beam's worker's ``sys.argv``. What still differs: its
   ``__main__`` module is the warm script, its standard input is the pool's
   pipe (Beam's worker inherits the launcher's), and a warm worker killed by a
   signal is reported to Beam as exit status 1.
2. Each warm process serves at most one claim: a claim takes a process by an
   atomic rename of its socket.
3. A claim that finds no warm process able to run (none left, refused,
   failed) becomes Beam's own worker (``exec`` of Beam's command), so a run
   never depends on the pool for correctness.
4. No process outlives the run: an unclaimed process exits when its standard
   input (a pipe from the launcher) closes (``close()``, or the launcher's
   death, even by SIGKILL), and ignores SIGINT until then (a Ctrl-C ends the
   launcher); a claimed one exits when its claim (the process Beam waits for)
   ends or its control channel closes, as Beam's own worker does.
5. A warm worker runs at the launcher's priority. Only its import runs lower
   (a thread 3 nice steps down, Linux; ``import_at_low_priority`` in the
   script), so that on a machine with fewer cores than processes the
   launcher's own import and graph building, which the first stage waits for,
   go first; that thread ends before the claim is served. numpy is imported
   first at normal priority (its BLAS threads start at import and would keep
   the lower priority); only background threads that Beam's imports start
   (e.g. pyarrow's allocator's) run 3 steps lower.

The warm processes talk to their claims over Unix sockets that the launcher
binds in a directory created with ``tempfile.mkdtemp`` (mode 0700, only this
user can connect) and hands to each process (so a claim finds every socket
from the start); ``close()`` removes the directory (a launcher killed by a
signal leaves it, empty of processes). A pool that cannot be set up (no
temporary directory, no more processes) has no process, and Beam starts its
workers as usual. Only POSIX systems with Unix sockets use the pool
(``available()``); elsewhere Beam starts its workers itself. No privacy
effect: the same worker code runs the same bundles; only when the workers'
imports happen changes.
"""
from __future__ import annotations

import atexit
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import List, Mapping, Optional, Sequence

from beam_dpsu import _quiet_workers  # (standard library only, as this module)

#: The script a warm process and a claim run (by path: see its docstring).
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_warm", "warm_worker.py")

#: The command Beam's FnApiRunner gives its workers in ``multi_processing`` mode
#: (``fn_runner.FnApiRunner.run_pipeline``, Beam 2.60–2.77).
BEAM_WORKER_COMMAND = "%s -m %s" % (sys.executable, _quiet_workers.WORKER_MODULE)

#: Unix socket paths longer than this are refused by some systems (108 bytes on Linux).
_MAX_SOCKET_PATH = 100

#: ``--runner`` values that mean Beam's DirectRunner (also the default: no ``--runner``),
#: lower case: Beam reads them in any case, with or without "Runner" and a module path.
#: (Here, not in ``runners``, so that ``argv_pool_size`` needs no Beam import.)
DIRECT_RUNNER_NAMES = ("direct", "directrunner", "switchingdirect", "switchingdirectrunner")


def available() -> bool:
    """Whether this system can use warm workers (POSIX with Unix sockets, and the
    script installed as a file)."""
    return os.name == "posix" and hasattr(socket, "AF_UNIX") and os.path.isfile(SCRIPT)


def _socket_directory(name_length: int) -> Optional[str]:
    """A new directory only this user can enter (``tempfile.mkdtemp``), in the
    temporary directory or else in ``/tmp``, whose socket paths of ``name_length``
    characters stay under ``_MAX_SOCKET_PATH``; None when neither can hold one."""
    for base in (None, "/tmp"):
        if base is not None and not os.path.isdir(base):
            continue
        parent = tempfile.gettempdir() if base is None else base
        # mkdtemp adds 8 random characters to the prefix
        if len(os.path.join(parent, "bdpsu-w-" + "x" * 8, "x" * name_length).encode()) \
                <= _MAX_SOCKET_PATH:
            return tempfile.mkdtemp(prefix="bdpsu-w-", dir=base)
    return None


class WarmWorkers:
    """``n`` warm worker processes for ONE multi-process run (see the module docstring).

    Args:
      n: how many processes to start (the run's ``direct_num_workers``). A run
        that starts more workers than this starts the rest itself; unused
        processes exit at ``close()``.
      env: their environment, which must be the one Beam will give its workers
        (the launcher's ``os.environ`` when the run starts its workers), else a
        warm process refuses its claim and the worker starts cold. Default: this
        process's environment now.

    Use as a context manager, or call ``close()`` after the run. ``command``
    is the worker command to give Beam (``WarmFnApiRunner`` does).
    """

    def __init__(self, n: int, env: Optional[Mapping[str, str]] = None):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        env = dict(os.environ if env is None else env)
        self.dir: Optional[str] = None
        self.processes: List[subprocess.Popen] = []
        try:
            self.dir = _socket_directory(len(f"{n - 1}.sock"))
            for i in range(n if self.dir else 0):
                # Bound here, so that a claim finds every socket from the start.
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
                    listener.bind(os.path.join(self.dir, f"{i}.sock"))
                    listener.listen(1)
                    fd = listener.fileno()
                    self.processes.append(subprocess.Popen(
                        [sys.executable, SCRIPT, "serve", str(fd)], stdin=subprocess.PIPE,
                        env=env, pass_fds=(fd,)))
        except OSError:  # no pool (a full temporary disk, no more processes): Beam's start
            self.close()
            self.processes = []
        except BaseException:
            self.close()
            raise

    @property
    def command(self) -> str:
        """The worker command that claims a warm process (or runs Beam's worker);
        Beam's own command when this pool has no process."""
        if not self.processes:
            return BEAM_WORKER_COMMAND
        return " ".join(shlex.quote(a) for a in (sys.executable, "-S", SCRIPT, "claim",
                                                  self.dir))

    def close(self, timeout: float = 10.0) -> None:
        """Ends the unclaimed processes, waits for every process (killing one that
        has not ended after ``timeout`` seconds) and removes the socket directory."""
        for p in self.processes:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.processes:
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "WarmWorkers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pool_size(options) -> Optional[int]:
    """How many warm workers a DirectRunner run with ``options`` (a
    ``PipelineOptions``) would use: its ``direct_num_workers`` (0: one per core)
    in ``multi_processing`` mode; None when it starts no worker process, or when
    ``available()`` is false."""
    from apache_beam.options.pipeline_options import DirectOptions
    direct = options.view_as(DirectOptions)
    if direct.direct_running_mode != "multi_processing" or not available():
        return None
    n = direct.direct_num_workers
    if n == 0:
        import multiprocessing
        n = multiprocessing.cpu_count()
    return max(1, n or 1)


def _flag_values(argv: Sequence[str], name: str) -> List[str]:
    """The values given to ``--name`` in ``argv`` (``--name=V`` or ``--name V``), in order."""
    out = []
    for i, a in enumerate(argv):
        if a.startswith(name + "="):
            out.append(a[len(name) + 1:])
        elif a == name and i + 1 < len(argv):
            out.append(argv[i + 1])
    return out


def argv_pool_size(argv: Sequence[str]) -> Optional[int]:
    """``pool_size`` of the pipeline options a command line's arguments hold, read
    without importing Beam (the last value of a repeated flag wins, as in Beam's
    parser): the DirectRunner (``--runner`` absent or one of
    ``DIRECT_RUNNER_NAMES``) with ``--direct_running_mode=multi_processing``;
    None otherwise or when a value cannot be read. Only decides whether to start
    warm workers early (``start_early``): a wrong guess costs time, never a result."""
    if not available():
        return None
    runner = _flag_values(argv, "--runner")
    if runner and runner[-1].rsplit(".", 1)[-1].lower() not in DIRECT_RUNNER_NAMES:
        return None
    mode = _flag_values(argv, "--direct_running_mode")
    if not mode or mode[-1] != "multi_processing":
        return None
    workers = _flag_values(argv, "--direct_num_workers")
    try:
        n = int(workers[-1]) if workers else 1
    except ValueError:
        return None
    if n < 0:
        return None
    return n or os.cpu_count() or 1


#: the pool ``start_early`` started and no run has taken yet.
_EARLY: List[WarmWorkers] = []


def start_early(argv: Sequence[str], quiet: bool) -> None:
    """Starts the warm workers a command line's run will need (``argv_pool_size``)
    now, before Beam is imported in this process, so that the workers' imports
    overlap the launcher's own import and graph building. ``quiet``: the
    command's quiet workers (``beam_dpsu.pipelines.common.quiet_worker_processes``,
    whose environment they get). ``take_early`` hands them to the run; the
    process's exit (or the next ``start_early``) ends them if none takes them."""
    discard_early()
    n = argv_pool_size(argv)
    if n is not None:
        _EARLY.append(WarmWorkers(n, _quiet_workers.worker_environment(os.environ, quiet)))


def take_early(n: int) -> Optional[WarmWorkers]:
    """The pool ``start_early`` started, if it has ``n`` processes (else it is closed),
    for the caller to close; None when there is none."""
    if not _EARLY:
        return None
    pool = _EARLY.pop()
    if len(pool.processes) == n:
        return pool
    pool.close()
    return None


def discard_early() -> None:
    """Closes the pool ``start_early`` started, if no run took it."""
    while _EARLY:
        _EARLY.pop().close()


atexit.register(discard_early)


def fn_api_runner(pool: WarmWorkers, **kwargs):
    """A Beam ``FnApiRunner`` whose workers of Beam's default multi-process
    environment claim ``pool``'s processes (``kwargs`` go to the FnApiRunner)."""
    from apache_beam.portability import python_urns
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    class WarmFnApiRunner(fn_runner.FnApiRunner):
        def run_via_runner_api(self, pipeline_proto, options):
            default = BEAM_WORKER_COMMAND.encode("utf-8")
            for env in pipeline_proto.components.environments.values():
                if pool.processes and env.urn == python_urns.SUBPROCESS_SDK \
                        and env.payload == default:
                    env.payload = pool.command.encode("utf-8")
            return super().run_via_runner_api(pipeline_proto, options)

    return WarmFnApiRunner(**kwargs)
