"""Starts and stops a local Flink session cluster for Beam's FlinkRunner.

Usage::

    beam-dpsu flink-cluster start DIR [--taskmanagers N] [--slots S]
        [--process-size 3500m] [--task-off-heap 768m] [--restart-attempts A]
        [--conf KEY=VALUE ...]
    beam-dpsu flink-cluster add-taskmanager DIR     # one more (e.g. replacing a lost one)
    beam-dpsu flink-cluster worker-pool DIR         # the worker pool again, on its port
    beam-dpsu flink-cluster stop DIR

``start`` runs, each as a process of its own, from the Flink distribution that
``beam-dpsu setup-engines flink`` unpacked (``runners.flink_home()``): a JobManager
(``StandaloneSessionClusterEntrypoint``), N TaskManagers (``TaskManagerRunner``, with
the memory options Flink's own ``BashJavaUtils`` computes from the configuration) and
an EXTERNAL pool of Beam's Python SDK workers (``beam_dpsu.pipelines.worker_pool``:
Beam's pool API, its workers on this Python, so that they import this environment's
Beam and ``beam_dpsu``; the workers it has started and not stopped are in
DIR/workers.json, which ``worker-pool`` reads to start them again after the pool was
lost, so that a task waiting for one goes on). Flink listens on localhost only, on
free ports; the configuration, logs and ``cluster.json`` (ports and process ids) are in
DIR. It prints the runner flags of a release on it::

    --runner=FlinkRunner --flink_master=localhost:PORT --environment_type=EXTERNAL
    --environment_config=localhost:POOL_PORT

Memory: a TaskManager of ``--process-size`` (default 3500m) with
``taskmanager.memory.task.off-heap.size`` ``--task-off-heap`` (default 768m: Beam's
gRPC buffers are direct memory; at 1M users the default 0 fails with
``OutOfMemoryError: Direct buffer memory``). ``--restart-attempts`` (default 3) sets
Flink's fixed-delay restart strategy (2 s apart): a job whose TaskManager or SDK
workers are lost is restarted that many times (docs/runners.md, "Faults").
``--conf KEY=VALUE`` (repeatable) adds a row to the cluster's ``flink-conf.yaml`` or
overrides a default (not the rows the command derives from its flags and ports:
``check_conf``); ``env.java.opts.all``, ``env.java.opts.jobmanager`` and
``env.java.opts.taskmanager`` are added to the JVMs' command lines, as Flink's start
scripts add them (e.g. ``-XX:TieredStopAtLevel=1``, the JIT's C1 compiler alone: for
short jobs it about halved the CPU time of Beam's job servers, measured here).
``worker-pool`` starts the pool again on its port (after it was lost); the TaskManagers
share it (one pool on each machine of a real cluster: docs/runners.md).
``stop`` ends every process ``cluster.json`` names (SIGTERM, then SIGKILL). Exit
status 0, 1 when a process did not come up (its log's last lines say why), 2 for a
usage error (Java or the distribution missing).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Dict, List, Optional

from beam_dpsu.pipelines import console
from beam_dpsu.pipelines.console import UsageError, run_main

__all__ = ["start", "add_taskmanager", "start_worker_pool", "stop", "flags", "read_state",
           "check_conf", "main", "ClusterError"]

_ENTRYPOINT = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
_TASKMANAGER = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
_BASH_UTILS = "org.apache.flink.runtime.util.bash.BashJavaUtils"
_STATE = "cluster.json"

_LOG4J = """rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
appender.file.name = file
appender.file.type = File
appender.file.fileName = ${sys:log.file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{HH:mm:ss,SSS} %-5p %c{1} - %m%n
"""


class ClusterError(RuntimeError):
    """A process of the cluster did not come up (exit status 1)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _java() -> str:
    import shutil
    java = shutil.which("java")
    if java is None:
        raise UsageError("a Flink cluster needs Java 17 on the PATH")
    return java


def _home() -> str:
    from beam_dpsu.transforms import runners
    home = runners.flink_home()
    if not os.path.isdir(os.path.join(home, "lib")):
        raise UsageError(f"Flink {runners.FLINK_DISTRIBUTION} is not set up: run "
                         f"`beam-dpsu setup-engines flink`")
    return home


def _opens() -> List[str]:
    from beam_dpsu.pipelines.setup_engines import JAVA_17_EXPORTS, JAVA_17_OPENS
    return ([f"--add-opens={m}=ALL-UNNAMED" for m in JAVA_17_OPENS]
            + [f"--add-exports={m}=ALL-UNNAMED" for m in JAVA_17_EXPORTS])


def read_state(folder: str) -> Dict:
    path = os.path.join(folder, _STATE)
    if not os.path.isfile(path):
        raise UsageError(f"no cluster in {folder} (no {_STATE})")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _write_state(folder: str, state: Dict) -> None:
    tmp = os.path.join(folder, _STATE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(state, fh, indent=1)
    os.replace(tmp, os.path.join(folder, _STATE))


def flags(state: Dict) -> List[str]:
    """The runner flags of a release on the cluster ``state`` describes."""
    return ["--runner=FlinkRunner", f"--flink_master=localhost:{state['rest_port']}",
            "--environment_type=EXTERNAL", f"--environment_config=localhost:{state['pool_port']}"]


def _config(state: Dict, args) -> str:
    rows = {
        "jobmanager.rpc.address": "localhost", "jobmanager.bind-host": "localhost",
        "jobmanager.rpc.port": state["rpc_port"], "jobmanager.memory.process.size": "1024m",
        "rest.address": "localhost", "rest.bind-address": "localhost",
        "rest.port": state["rest_port"], "blob.server.port": state["blob_port"],
        "taskmanager.host": "localhost", "taskmanager.bind-host": "localhost",
        "taskmanager.numberOfTaskSlots": args.slots,
        "taskmanager.memory.process.size": args.process_size,
        "taskmanager.memory.task.off-heap.size": args.task_off_heap,
        "parallelism.default": args.taskmanagers * args.slots,
        "restart-strategy.type": "fixed-delay" if args.restart_attempts else "none",
        "restart-strategy.fixed-delay.attempts": args.restart_attempts,
        "restart-strategy.fixed-delay.delay": "2 s",
        # an Error no thread catches (an OutOfMemoryError in a gRPC thread) ends the
        # process, so Flink restarts or fails the job instead of running it forever
        "cluster.uncaught-exception-handling": "FAIL",
        # a lost TaskManager is noticed in seconds, not Flink's default 50 s
        "heartbeat.interval": 2000, "heartbeat.timeout": 8000,
        "io.tmp.dirs": os.path.join(state["dir"], "tmp"),
        "web.tmpdir": os.path.join(state["dir"], "tmp"),
    }
    rows.update(state.get("conf", {}))
    return "".join(f"{k}: {v}\n" for k, v in rows.items())


def _spawn(state: Dict, name: str, argv: List[str], env: Optional[Dict] = None) -> int:
    log = os.path.join(state["dir"], "log", f"{name}.out")
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                cwd=state["dir"])
    return proc.pid


#: Flink's configuration keys of extra JVM options, for every process and per role.
JAVA_OPTS_KEYS = {"jobmanager": ("env.java.opts.all", "env.java.opts.jobmanager"),
                  "taskmanager": ("env.java.opts.all", "env.java.opts.taskmanager")}


#: Rows ``start`` sets from its own flags or state (ports, addresses, folders, slots,
#: memory, restarts): a ``--conf`` of one of them would leave ``cluster.json`` and the
#: printed flags wrong. Their flag where there is one.
_DERIVED_KEYS = {
    "taskmanager.numberOfTaskSlots": "--slots", "parallelism.default": "--slots",
    "taskmanager.memory.process.size": "--process-size",
    "taskmanager.memory.task.off-heap.size": "--task-off-heap",
    "restart-strategy.type": "--restart-attempts",
    "restart-strategy.fixed-delay.attempts": "--restart-attempts",
    "jobmanager.rpc.address": None, "jobmanager.bind-host": None, "jobmanager.rpc.port": None,
    "rest.address": None, "rest.bind-address": None, "rest.port": None,
    "blob.server.port": None, "taskmanager.host": None, "taskmanager.bind-host": None,
    "io.tmp.dirs": None, "web.tmpdir": None,
}


def check_conf(conf: Dict[str, str]) -> Dict[str, str]:
    """``conf`` (rows of ``flink-conf.yaml`` for ``start``) checked: no empty key or value
    (Flink skips a row without a value, so a default would silently come back), none of
    ``_DERIVED_KEYS``, and JVM options only under ``JAVA_OPTS_KEYS``' keys; surrounding
    quotes of a JVM options value are dropped, as Flink's scripts do. Raises UsageError."""
    checked = {}
    for key, value in conf.items():
        key, value = str(key).strip(), str(value).strip()
        if not key or not value:
            raise UsageError(f"--conf {key}={value}: expected KEY=VALUE, both non-empty")
        if key in _DERIVED_KEYS:
            flag = _DERIVED_KEYS[key]
            raise UsageError(f"--conf {key}: flink-cluster sets it itself"
                             + (f" (use {flag})" if flag else ""))
        if key.startswith("env.java.") and key not in JAVA_OPTS_KEYS["taskmanager"] + \
                JAVA_OPTS_KEYS["jobmanager"]:
            raise UsageError(f"--conf {key}: give JVM options as env.java.opts.all, "
                             f"env.java.opts.jobmanager or env.java.opts.taskmanager")
        if key.startswith("env.java.opts.") and value[:1] == value[-1:] and value[:1] in "'\"":
            value = value[1:-1].strip()
        checked[key] = value
    return checked


def _java_opts(state: Dict, role: str) -> List[str]:
    conf = state.get("conf", {})  # (a cluster.json written before --conf has none)
    return [opt for key in JAVA_OPTS_KEYS[role] for opt in conf.get(key, "").split()]


def _java_process(state: Dict, name: str, main_class: str, jvm: List[str],
                  program: List[str]) -> int:
    home, conf = state["flink_home"], os.path.join(state["dir"], "conf")
    log_file = os.path.join(state["dir"], "log", f"{name}.log")
    role = "jobmanager" if main_class == _ENTRYPOINT else "taskmanager"
    return _spawn(state, name, [_java()] + _opens() + jvm + _java_opts(state, role) + [
        f"-Dlog.file={log_file}",
        f"-Dlog4j.configurationFile=file:{os.path.join(conf, 'log4j.properties')}",
        "-cp", os.path.join(home, "lib", "*"), main_class, "--configDir", conf] + program)


def _resource_params(state: Dict, what: str) -> List[List[str]]:
    home = state["flink_home"]
    done = subprocess.run([_java(), "-cp", os.pathsep.join(
        [os.path.join(home, "bin", "bash-java-utils.jar"), os.path.join(home, "lib", "*")]),
        _BASH_UTILS, what, "--configDir", os.path.join(state["dir"], "conf")],
        capture_output=True, text=True)
    results = [ln.split(":", 1)[1].split() for ln in done.stdout.splitlines()
               if ln.startswith("BASH_JAVA_UTILS_EXEC_RESULT:")]
    if done.returncode != 0 or not results:
        raise ClusterError(f"Flink's {what} failed: " + console.last_line(RuntimeError(
            done.stdout + done.stderr)))
    return results


def _rest(state: Dict, path: str, timeout: float = 2.0) -> Dict:
    url = f"http://localhost:{state['rest_port']}{path}"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def _wait(what: str, check, pids: List[int], state: Dict, timeout: float = 90.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for pid in pids:
            if not _alive(pid):
                raise ClusterError(f"{what}: process {pid} exited; see {state['dir']}/log/")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise ClusterError(f"{what}: not ready after {timeout:.0f} s; see {state['dir']}/log/")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a child of this process that exited but was not reaped yet
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _taskmanager_ids(state: Dict) -> set:
    return {tm["id"] for tm in _rest(state, "/taskmanagers")["taskmanagers"]}


def _running_taskmanagers(state: Dict) -> int:
    return len(_taskmanager_ids(state))


def add_taskmanager(folder: str, wait: bool = True) -> int:
    """Starts one more TaskManager of the cluster in ``folder``; returns its pid."""
    state = read_state(folder)
    jvm, dynamic = _resource_params(state, "GET_TM_RESOURCE_PARAMS")[:2]
    before = _taskmanager_ids(state) if wait else set()
    n = len(state["taskmanagers"]) + 1
    pid = _java_process(state, f"taskmanager-{n}", _TASKMANAGER, jvm, dynamic)
    state["taskmanagers"].append(pid)
    _write_state(folder, state)
    if wait:
        _wait(f"TaskManager {n}", lambda: bool(_taskmanager_ids(state) - before), [pid], state)
    return pid


def start_worker_pool(folder: str) -> int:
    """Starts the cluster's pool of Python SDK workers (again) on its port; returns its pid."""
    state = read_state(folder)
    env = {**os.environ,
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    pid = _spawn(state, "worker-pool", [sys.executable, "-m", "beam_dpsu.pipelines.worker_pool",
                                        f"--service_port={state['pool_port']}",
                                        "--journal", os.path.join(folder, "workers.json")],
                 env=env)
    state["pool"] = pid

    def listening():
        with socket.create_connection(("localhost", state["pool_port"]), timeout=1):
            return True
    _wait("the worker pool", listening, [pid], state)
    _write_state(folder, state)
    return pid


def start(folder: str, taskmanagers: int = 1, slots: int = 2, process_size: str = "3500m",
          task_off_heap: str = "768m", restart_attempts: int = 3,
          say=lambda message: None, conf: Optional[Dict[str, str]] = None) -> Dict:
    """Starts a session cluster in ``folder`` (created); returns its state (ports, pids).
    ``conf``: rows of ``flink-conf.yaml`` added to (or replacing) the defaults above."""
    conf = check_conf(conf or {})
    folder = os.path.abspath(folder)
    if os.path.isfile(os.path.join(folder, _STATE)):
        raise UsageError(f"{folder} holds a cluster already: stop it first")
    for sub in ("conf", "log", "tmp"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    args = argparse.Namespace(taskmanagers=taskmanagers, slots=slots, process_size=process_size,
                              task_off_heap=task_off_heap, restart_attempts=restart_attempts)
    state = {"dir": folder, "flink_home": _home(), "rpc_port": _free_port(),
             "rest_port": _free_port(), "blob_port": _free_port(), "pool_port": _free_port(),
             "jobmanager": None, "taskmanagers": [], "pool": None,
             "conf": conf}
    with open(os.path.join(folder, "conf", "flink-conf.yaml"), "w", encoding="utf-8") as fh:
        fh.write(_config(state, args))
    with open(os.path.join(folder, "conf", "log4j.properties"), "w", encoding="utf-8") as fh:
        fh.write(_LOG4J)
    _write_state(folder, state)
    try:
        jvm = _resource_params(state, "GET_JM_RESOURCE_PARAMS")[0]
        state["jobmanager"] = _java_process(state, "jobmanager", _ENTRYPOINT, jvm, [])
        _write_state(folder, state)
        say(f"JobManager {state['jobmanager']}: http://localhost:{state['rest_port']}")
        _wait("the JobManager", lambda: "taskmanagers" in _rest(state, "/taskmanagers"),
              [state["jobmanager"]], state)
        for _ in range(taskmanagers):
            pid = add_taskmanager(folder, wait=False)
            say(f"TaskManager {pid}")
        state = read_state(folder)
        _wait(f"{taskmanagers} TaskManagers",
              lambda: _running_taskmanagers(state) >= taskmanagers,
              [state["jobmanager"]] + state["taskmanagers"], state)
        pid = start_worker_pool(folder)
        say(f"worker pool {pid}: localhost:{state['pool_port']}")
    except BaseException:
        stop(folder)
        raise
    return read_state(folder)


def _of_this_cluster(pid: int, state: Dict) -> bool:
    """Whether process ``pid`` is still one this cluster started (its command line names
    the cluster's configuration folder, or the pool's port), not another that got the pid
    of one that died. True where /proc cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            command = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return (os.path.join(state["dir"], "conf") in command
            or f"--service_port={state['pool_port']}" in command)


def stop(folder: str, timeout: float = 20.0) -> List[int]:
    """Ends every process of the cluster in ``folder``; returns their pids."""
    state = read_state(folder)
    pids = [p for p in [state.get("pool")] + state["taskmanagers"] + [state.get("jobmanager")]
            if p and _of_this_cluster(p, state)]
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)  # each was started as its own session
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.time() + timeout
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.3)
    for pid in pids:
        if _alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    os.remove(os.path.join(folder, _STATE))
    return pids


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog=console.command_prog("flink-cluster"),
                                description=__doc__.split("\n")[0], allow_abbrev=False)
    console.add_output_flags(p)
    p.add_argument("action", choices=["start", "stop", "add-taskmanager", "worker-pool"])
    p.add_argument("dir", help="the cluster's folder (configuration, logs, cluster.json)")
    p.add_argument("--taskmanagers", type=int, default=1, help="start: how many (default 1)")
    p.add_argument("--slots", type=int, default=2, help="start: slots per TaskManager (2)")
    p.add_argument("--process-size", default="3500m",
                   help="start: taskmanager.memory.process.size (default 3500m)")
    p.add_argument("--task-off-heap", default="768m",
                   help="start: taskmanager.memory.task.off-heap.size (default 768m)")
    p.add_argument("--restart-attempts", type=int, default=3,
                   help="start: Flink's fixed-delay restart attempts (default 3; 0: none)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="start: a row of flink-conf.yaml, added or replacing a default; "
                        "env.java.opts.all/.jobmanager/.taskmanager reach the JVMs (repeatable)")
    args = p.parse_args(argv)

    def body() -> int:
        say = console.Progress(p.prog, args.quiet)
        if args.action == "start":
            if args.taskmanagers < 1 or args.slots < 1:
                raise UsageError("--taskmanagers and --slots must be at least 1")
            bad = [c for c in args.conf if "=" not in c]
            if bad:
                raise UsageError(f"--conf {bad[0]!r}: expected KEY=VALUE")
            conf = check_conf(dict(c.split("=", 1) for c in args.conf))
            try:
                state = start(args.dir, args.taskmanagers, args.slots, args.process_size,
                              args.task_off_heap, args.restart_attempts, say, conf)
            except ClusterError as e:
                console.write_line(f"{p.prog}: failed: {e}")
                return 1
            console.write_line(
                f"WARNING: the Python worker pool listens on port {state['pool_port']} of "
                f"every interface (as Beam's worker_pool_main: no bind address) and runs "
                f"what a job sends it: keep that port closed to other machines")
            print(" ".join(flags(state)))
        elif args.action == "stop":
            say(f"stopped {len(stop(args.dir))} processes")
        elif args.action == "add-taskmanager":
            say(f"TaskManager {add_taskmanager(args.dir)}")
        else:
            say(f"worker pool {start_worker_pool(args.dir)}")
        return 0

    return run_main(p.prog, body)
