"""Fetches or builds the engines Beam needs to run a pipeline outside this process.

Usage::

    beam-dpsu setup-engines [prism] [flink] [spark] [--check]

* ``prism``: Beam's portable runner written in Go, built for the installed
  apache-beam's version with ``go install
  github.com/apache/beam/sdks/v2/go/cmd/prism@vVERSION`` (about 80 s and 1.5 GB of Go
  caches the first time).
* ``flink``, ``spark``: Beam's job server jars
  (``org.apache.beam:beam-runners-flink-2.2-job-server:VERSION``,
  ``...:beam-runners-spark-3-job-server:VERSION``), copied from Maven Central with
  ``mvn dependency:copy`` where it serves them.

Each goes to ``runners.engines_dir()`` (``~/.cache/beam_dpsu/engines``, or
``$BEAM_DPSU_ENGINES_DIR``), where ``--runner=PrismRunner`` (``FlinkRunner``,
``SparkRunner``) finds it with no other flag. Nothing is written to Beam's own
caches. With no engine named, all three are tried. Exit status 0 when every engine
asked for is there, 1 when one could not be fetched (one line each, with the tool's
own answer), 2 for a usage error (e.g. Go or Maven missing). ``--check`` fetches
nothing and says what is there.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import List, Optional

from beam_dpsu.pipelines import console
from beam_dpsu.pipelines.console import UsageError, run_main

__all__ = ["ENGINES", "PRISM_MODULE", "main", "set_up"]

#: The engines this command can set up, in the order it tries them.
ENGINES = ("prism", "flink", "spark")
#: The Go package of Prism's command.
PRISM_MODULE = "github.com/apache/beam/sdks/v2/go/cmd/prism"


def _target(engine: str) -> str:
    from beam_dpsu.transforms import runners
    return runners.prism_binary() if engine == "prism" else runners.job_server_jar(engine)


def _tool(name: str, engine: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise UsageError(f"setting up {engine} needs `{name}` on the PATH")
    return path


def _last_error_line(output: str) -> str:
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)  # Maven's colours
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "ERROR" in ln or "error" in ln]
    return (errors or lines or ["(no output)"])[0][:300]


def _build_prism(target: str) -> Optional[str]:
    import apache_beam
    go = _tool("go", "prism")
    with tempfile.TemporaryDirectory(dir=os.path.dirname(target)) as gobin:
        done = subprocess.run([go, "install", f"{PRISM_MODULE}@v{apache_beam.__version__}"],
                              env={**os.environ, "GOBIN": gobin}, capture_output=True, text=True)
        if done.returncode != 0:
            return _last_error_line(done.stderr + done.stdout)
        os.replace(os.path.join(gobin, "prism"), target)
    return None


def _copy_jar(engine: str, target: str) -> Optional[str]:
    from beam_dpsu.transforms import runners
    mvn = _tool("mvn", engine)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(target)) as out:
        done = subprocess.run([mvn, "-q", "-B", "dependency:copy",
                               f"-Dartifact={runners.job_server_artifact(engine)}",
                               f"-DoutputDirectory={out}"], capture_output=True, text=True)
        jars = [f for f in os.listdir(out) if f.endswith(".jar")]
        if done.returncode != 0 or len(jars) != 1:
            return _last_error_line(done.stdout + done.stderr)
        os.replace(os.path.join(out, jars[0]), target)
    return None


def set_up(engine: str, check: bool = False) -> Optional[str]:
    """Sets ``engine`` up unless it is there; None when it is, else the reason it is not."""
    target = _target(engine)
    if os.path.isfile(target):
        return None
    if check:
        return "not set up"
    os.makedirs(os.path.dirname(target), exist_ok=True)
    return _build_prism(target) if engine == "prism" else _copy_jar(engine, target)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog=console.command_prog("setup-engines"),
                                description=__doc__.split("\n")[0], allow_abbrev=False)
    console.add_output_flags(p)
    p.add_argument("engines", nargs="*", metavar="ENGINE",
                   help=f"which to set up: {', '.join(ENGINES)} (default: all three)")
    p.add_argument("--check", action="store_true",
                   help="fetch nothing; say which engines are set up (exit 1 if one is not)")
    args = p.parse_args(argv)

    def body() -> int:
        unknown = sorted(set(args.engines) - set(ENGINES))
        if unknown:
            raise UsageError(f"unknown engine {unknown[0]!r}: choose from {', '.join(ENGINES)}")
        failed = 0
        for engine in args.engines or ENGINES:
            why = set_up(engine, args.check)
            if why is None:
                print(f"{engine}: {_target(engine)}")
            else:
                failed += 1
                print(f"{engine}: not available: {why}", file=sys.stderr)
        return 1 if failed else 0

    return run_main(p.prog, body)
