"""Start-up hook for quiet Beam worker processes (see sitecustomize.py).

``worker_environment`` is the environment a command line gives the worker
processes Beam starts on this machine (``beam_dpsu.pipelines.common.
quiet_worker_processes`` sets it around a run; ``beam_dpsu.warm_workers``
starts its early workers with it). It imports nothing beyond the standard library.
"""
import os
from typing import Dict, Mapping

#: the directory of this package's sitecustomize, put first on the workers' PYTHONPATH.
DIRECTORY = os.path.dirname(os.path.abspath(__file__))

#: The module Beam's worker processes run (``python -m ...``): the only
#: processes that exit without tearing their interpreter down.
WORKER_MODULE = "apache_beam.runners.worker.sdk_worker_main"

#: the variables ``worker_environment`` sets or removes.
VARIABLES = ("PYTHONPATH", "BEAM_DPSU_QUIET_WORKER", "BEAM_DPSU_QUICK_EXIT")


def worker_environment(base: Mapping[str, str], quiet: bool) -> Dict[str, str]:
    """``base`` (e.g. ``os.environ``) with this directory first on ``PYTHONPATH``
    (once), the quick exit of Beam's worker module, and (``quiet``) errors only
    on the workers' stderr; see sitecustomize.py."""
    env = dict(base)
    path = env.get("PYTHONPATH")
    rest = [p for p in path.split(os.pathsep) if p != DIRECTORY] if path else []
    env["PYTHONPATH"] = os.pathsep.join([DIRECTORY] + rest)
    env["BEAM_DPSU_QUICK_EXIT"] = WORKER_MODULE
    if quiet:
        env["BEAM_DPSU_QUIET_WORKER"] = "1"
    else:
        env.pop("BEAM_DPSU_QUIET_WORKER", None)
    return env
