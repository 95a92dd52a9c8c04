"""Beam's EXTERNAL pool of Python SDK workers, keeping its promises across a restart.

Usage (``beam-dpsu flink-cluster`` starts it; on your own cluster, one per machine)::

    python -m beam_dpsu.pipelines.worker_pool --service_port=N [--journal PATH]

It serves Beam's worker pool API (``BeamFnExternalWorkerPool``: ``StartWorker``,
``StopWorker``) as ``python -m apache_beam.runners.worker.worker_pool_main`` does, with
each worker a process of its own (``SdkHarness`` on this Python), and two differences:

* **Restarts.** Beam's Flink runner asks the pool for a worker, and once the pool has
  answered it waits for that worker to connect back, with no time limit
  (``ExternalEnvironmentFactory``: "Still waiting for startup of environment ..." every
  2 minutes). A pool killed with its workers between its answer and the worker's
  connection (the worker's Python is still starting: a second or more) leaves the
  Flink task waiting forever, and the job with it. So the pool writes down every
  worker it has started and not been asked to stop, in the journal (a JSON file,
  replaced whole), before it answers; a pool started again with the same journal
  starts those workers again, under their names and for their TaskManagers, and the
  task goes on. A worker that was already connected when the pool died broke its
  TaskManager's stream: Flink fails that task and restarts the job (its restart
  strategy), which asks the new pool for new workers; the old worker started again
  then connects to nothing that waits for it and exits with its TaskManager's job.
* **TaskManagers sharing a pool.** Beam's TaskManager-side runner names its workers by
  a counter of its own JVM ("1-1", "2-1", ...), so two TaskManagers of one job ask one
  pool for workers of the same names, and Beam's pool keys its workers by name only:
  a ``StopWorker`` from one TaskManager stopped the other's worker (measured: a job
  hung, or failed and restarted). This pool keys a worker by the connection that
  asked for it (each request for a worker opens a connection of its own, which the
  TaskManager also uses to stop it) and, failing that (a connection made again),
  stops a worker by name only where one worker has that name.

The pool listens on every interface (as Beam's does) and runs what a job sends it:
keep its port closed to other machines.
"""
from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

__all__ = ["SupervisedWorkerPool", "started_workers", "serve", "main"]

_LOG = logging.getLogger(__name__)


def _command(request) -> List[str]:
    # what Beam's worker_pool_main runs for a worker, on this Python (no PATH look-up)
    return [sys.executable, "-c",
            "from apache_beam.runners.worker.sdk_worker import SdkHarness; "
            f"SdkHarness({request.control_endpoint.url!r}, worker_id={request.worker_id!r}, "
            "state_cache_size=0, data_buffer_time_limit_ms=-1).run()"]


def started_workers(journal: str) -> List[str]:
    """The journal's workers (started, not stopped), one opaque string each; [] for no
    journal yet."""
    try:
        with open(journal, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return []


class SupervisedWorkerPool:
    """The pool's service (see the module); ``journal`` None: no restarts."""

    def __init__(self, journal: Optional[str] = None):
        from apache_beam.portability.api import beam_fn_api_pb2
        self._pb = beam_fn_api_pb2
        self._journal = journal
        self._lock = threading.Lock()
        # key -> {"request": StartWorkerRequest, "peer": str or None, "proc": Popen}
        self._workers: Dict[str, Dict] = {}
        self._serial = 0
        for request in self._read():
            _LOG.warning("starting worker %s again for %s (started by the pool before this "
                         "one, never stopped)", request.worker_id, request.control_endpoint.url)
            self._start(request, peer=None)
        self._write()

    def _read(self) -> list:
        return [self._pb.StartWorkerRequest.FromString(base64.b64decode(r))
                for r in started_workers(self._journal)] if self._journal else []

    def _write(self) -> None:
        if not self._journal:
            return
        rows = [base64.b64encode(w["request"].SerializeToString()).decode("ascii")
                for w in self._workers.values() if w["proc"].poll() is None]
        tmp = self._journal + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(rows, fh)
        os.replace(tmp, self._journal)  # whole or not at all, and in the OS before we answer

    def _start(self, request, peer: Optional[str]) -> None:
        self._serial += 1
        proc = subprocess.Popen(_command(request), stdin=subprocess.DEVNULL, close_fds=True)
        self._workers[f"{self._serial}"] = {"request": request, "peer": peer, "proc": proc}

    def _reap(self) -> None:
        for key in [k for k, w in self._workers.items() if w["proc"].poll() is not None]:
            del self._workers[key]

    def StartWorker(self, request, context):
        try:
            with self._lock:
                self._reap()
                self._start(request, context.peer())
                self._write()
            _LOG.info("started worker %s for %s", request.worker_id, request.control_endpoint.url)
            return self._pb.StartWorkerResponse()
        except Exception as e:  # Beam's pool answers a failure the same way
            return self._pb.StartWorkerResponse(error=f"{type(e).__name__}: {e}")

    def StopWorker(self, request, context):
        with self._lock:
            named = {k: w for k, w in self._workers.items()
                     if w["request"].worker_id == request.worker_id}
            mine = [k for k, w in named.items() if w["peer"] == context.peer()]
            keys = mine or (list(named) if len(named) == 1 else [])
            stopping = [self._workers.pop(k)["proc"] for k in keys]
            if named and not keys:
                _LOG.warning("StopWorker %s: %d workers have that name and none was started "
                             "on this connection; none stopped (each exits with its job)",
                             request.worker_id, len(named))
            self._reap()
            self._write()
        from apache_beam.runners.worker.worker_pool_main import kill_process_gracefully
        for proc in stopping:
            _LOG.info("stopping worker %s", request.worker_id)
            kill_process_gracefully(proc)  # SIGTERM, then SIGKILL after 10 s
        return self._pb.StopWorkerResponse()

    def stop_all(self) -> None:
        with self._lock:
            for w in self._workers.values():
                if w["proc"].poll() is None:
                    w["proc"].terminate()


def serve(port: int, journal: Optional[str] = None):
    """Starts the pool's gRPC server on ``port`` (every interface); returns (server, pool)."""
    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc
    from apache_beam.utils import thread_pool_executor
    pool = SupervisedWorkerPool(journal)
    server = grpc.server(thread_pool_executor.shared_unbounded_instance(),
                         options=[("grpc.http2.max_pings_without_data", 0),
                                  ("grpc.http2.max_ping_strikes", 0)])
    server.add_insecure_port(f"[::]:{port}")
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, server)
    server.start()
    return server, pool


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--service_port", type=int, required=True)
    p.add_argument("--journal", default=None,
                   help="file of the workers started and not stopped (restarts start them again)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    server, pool = serve(args.service_port, args.journal)
    _LOG.info("worker pool listening on port %d", args.service_port)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pool.stop_all()
        server.stop(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
