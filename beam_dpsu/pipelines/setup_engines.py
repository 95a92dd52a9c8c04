"""Fetches or builds the engines Beam needs to run a pipeline outside this process.

Usage::

    beam-dpsu setup-engines [prism] [flink] [spark] [--check]

* ``prism``: Beam's portable runner written in Go, built for the installed
  apache-beam's version with ``go install
  github.com/apache/beam/sdks/v2/go/cmd/prism@vVERSION`` (about 80 s and 1.5 GB of Go
  caches the first time).
* ``flink``, ``spark``: Beam's job server, which Beam's ``FlinkRunner`` (``SparkRunner``)
  starts with ``java -jar``. First choice: Beam's job server jar of the installed
  version (``org.apache.beam:beam-runners-flink-1.19-job-server:VERSION``,
  ``...:beam-runners-spark-3-job-server:VERSION``), where Maven Central serves it.
  Otherwise the runner's jars (``RUNNER_POMS``: Beam's Flink 1.19 or Spark 3 runner,
  the job service and the expansion service it starts, Spark itself) are resolved with
  ``mvn dependency:copy-dependencies`` into ``lib/``, and ``job-server.jar`` is a jar
  holding only a manifest: the job server's main class, ``lib/``'s jars as its
  ``Class-Path`` and the ``Add-Opens`` Java 17 needs (about 160 MB and 270 MB, 10 to
  30 s). ``flink`` also unpacks Flink's distribution (``lib/``, ``bin/``) from PyPI's
  ``apache-flink-libraries`` sdist, for a local session cluster (``beam-dpsu
  flink-cluster``).

Each goes to ``runners.engines_dir()`` (``~/.cache/beam_dpsu/engines``, or
``$BEAM_DPSU_ENGINES_DIR``), where ``--runner=PrismRunner`` (``FlinkRunner``,
``SparkRunner``) finds it with no other flag. Nothing is written to Beam's own
caches; each part is built in a temporary folder beside its place and renamed into
it, so an interrupted set-up leaves nothing half made, and a part that is there is
not fetched again. With no engine named, all three are tried. Progress lines go to
stderr (``--quiet``: none). Exit status 0 when every engine asked for is there, 1
when one could not be fetched (one line each, with the tool's own answer), 2 for a
usage error (e.g. Go, Maven or Java missing). ``--check`` fetches nothing and says
what is there.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from typing import Callable, List, Optional

from beam_dpsu.pipelines import console
from beam_dpsu.pipelines.console import UsageError, run_main

__all__ = ["ENGINES", "PRISM_MODULE", "RUNNER_POMS", "MAIN_CLASSES", "JAVA_17_OPENS",
           "JAVA_17_EXPORTS", "main", "set_up", "pathing_jar", "manifest"]

#: The engines this command can set up, in the order it tries them.
ENGINES = ("prism", "flink", "spark")
#: The Go package of Prism's command.
PRISM_MODULE = "github.com/apache/beam/sdks/v2/go/cmd/prism"

#: Each Java engine's job server when Beam's own jar of the installed version is not
#: served: (group:artifact:version, excluded group:artifact) pairs of a pom's
#: dependencies. The runners 2.70.0 are the newest Maven Central serves here; their job
#: service 2.70.0 is not served, 2.65.0 is (and runs them); the job service starts an
#: expansion service, which the runners do not bring. Spark's own jars are
#: ``provided`` by the runner, so they are named.
RUNNER_POMS = {
    "flink": [("org.apache.beam:beam-runners-flink-1.19:2.70.0",
               "org.apache.beam:beam-runners-java-job-service"),
              ("org.apache.beam:beam-runners-java-job-service:2.65.0", None),
              ("org.apache.beam:beam-sdks-java-expansion-service:2.70.0", None)],
    "spark": [("org.apache.beam:beam-runners-spark-3:2.70.0",
               "org.apache.beam:beam-runners-java-job-service"),
              ("org.apache.beam:beam-runners-java-job-service:2.65.0", None),
              ("org.apache.beam:beam-sdks-java-expansion-service:2.70.0", None),
              ("org.apache.spark:spark-core_2.12:3.5.0", None),
              ("org.apache.spark:spark-streaming_2.12:3.5.0", None)],
}
#: The job servers' main classes (in the runner jars).
MAIN_CLASSES = {"flink": "org.apache.beam.runners.flink.FlinkJobServerDriver",
                "spark": "org.apache.beam.runners.spark.SparkJobServerDriver"}
#: What Flink's and Spark's serializers reach into on Java 17 (the manifest's
#: ``Add-Opens``; ``java -jar`` reads it from the main jar only).
JAVA_17_OPENS = ("java.base/java.lang", "java.base/java.lang.invoke", "java.base/java.lang.reflect",
                 "java.base/java.io", "java.base/java.net", "java.base/java.nio",
                 "java.base/java.text", "java.base/java.time", "java.base/java.util",
                 "java.base/java.util.concurrent", "java.base/java.util.concurrent.atomic",
                 "java.base/java.util.concurrent.locks", "java.base/sun.nio.ch",
                 "java.base/sun.nio.cs", "java.base/sun.security.action",
                 "java.base/sun.util.calendar")
JAVA_17_EXPORTS = ("java.base/sun.net.util", "java.base/sun.nio.ch",
                   "java.rmi/sun.rmi.registry", "java.security.jgss/sun.security.krb5")


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
    causes = [ln for ln in errors if "Could not" in ln]  # Maven's reason, not its goal
    return (causes or errors or lines or ["(no output)"])[0][:300]


def _not_found(output: str) -> str:
    found = (re.search(r"Could not (find|resolve) artifact [^ ]+", output)
             or re.search(r"[^ ]+ was not found in [^ ]+", output))
    return found.group(0) if found else _last_error_line(output)[:120]


def _build_prism(target: str, say: Callable[[str], None]) -> Optional[str]:
    import apache_beam
    go = _tool("go", "prism")
    say(f"prism: building {PRISM_MODULE}@v{apache_beam.__version__} with Go "
        f"(about 80 s the first time)")
    with tempfile.TemporaryDirectory(dir=os.path.dirname(target)) as gobin:
        done = subprocess.run([go, "install", f"{PRISM_MODULE}@v{apache_beam.__version__}"],
                              env={**os.environ, "GOBIN": gobin}, capture_output=True, text=True)
        if done.returncode != 0:
            return _last_error_line(done.stderr + done.stdout)
        os.replace(os.path.join(gobin, "prism"), target)
    return None


def _manifest_line(name: str, value: str) -> bytes:
    """One manifest attribute: lines of at most 72 bytes, CRLF, each continuation
    line starting with one space (the jar specification)."""
    line = f"{name}: {value}".encode("utf-8")
    parts = [line[:72]] + [b" " + line[i:i + 71] for i in range(72, len(line), 71)]
    return b"".join(part + b"\r\n" for part in parts)


def manifest(main_class: str, class_path: List[str]) -> bytes:
    """A jar manifest starting ``main_class`` with ``class_path`` (URLs relative to the
    jar) and the Java 17 opens and exports."""
    return (_manifest_line("Manifest-Version", "1.0")
            + _manifest_line("Main-Class", main_class)
            + _manifest_line("Add-Opens", " ".join(JAVA_17_OPENS))
            + _manifest_line("Add-Exports", " ".join(JAVA_17_EXPORTS))
            + _manifest_line("Class-Path", " ".join(class_path)) + b"\r\n")


def pathing_jar(path: str, main_class: str, lib: str) -> int:
    """Writes at ``path`` a jar holding only a manifest that runs ``main_class`` with
    every jar of folder ``lib`` (named relative to ``path``'s folder) on its class
    path; returns how many jars that is."""
    jars = sorted(f for f in os.listdir(lib) if f.endswith(".jar"))
    relative = os.path.relpath(lib, os.path.dirname(os.path.abspath(path)))
    class_path = ["/".join(relative.split(os.sep) + [jar]) for jar in jars]
    with zipfile.ZipFile(path, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", manifest(main_class, class_path))
    return len(jars)


def _pom(engine: str) -> str:
    deps = []
    for coordinates, excluded in RUNNER_POMS[engine]:
        group, artifact, version = coordinates.split(":")
        exclusion = ""
        if excluded:
            ex_group, ex_artifact = excluded.split(":")
            exclusion = (f"<exclusions><exclusion><groupId>{ex_group}</groupId>"
                         f"<artifactId>{ex_artifact}</artifactId></exclusion></exclusions>")
        deps.append(f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}"
                    f"</artifactId><version>{version}</version>{exclusion}</dependency>")
    return ("<project xmlns=\"http://maven.apache.org/POM/4.0.0\">\n"
            "  <modelVersion>4.0.0</modelVersion>\n"
            f"  <groupId>beam-dpsu.engines</groupId><artifactId>{engine}-job-server</artifactId>"
            "<version>1</version>\n  <dependencies>\n" + "\n".join(deps)
            + "\n  </dependencies>\n</project>\n")


def _mvn(args: List[str], cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("mvn", "flink or spark"), "-q", "-B"] + args, cwd=cwd,
                          capture_output=True, text=True)


def _job_server(engine: str, target: str, say: Callable[[str], None]) -> Optional[str]:
    """Beam's job server jar of the installed version, or the runner's classpath and a
    pathing jar, into ``target``'s folder (built beside it, renamed into place)."""
    from beam_dpsu.transforms import runners
    _tool("mvn", engine)
    folder = os.path.dirname(target)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(folder),
                                     prefix=f".{engine}-set-up-") as work:
        build = os.path.join(work, "job-server")
        os.mkdir(build)
        artifact = runners.job_server_artifact(engine)
        say(f"{engine}: asking Maven for {artifact}")
        done = _mvn(["dependency:copy", f"-Dartifact={artifact}",
                     f"-DoutputDirectory={work}"])
        jars = [f for f in os.listdir(work) if f.endswith(".jar")]
        if done.returncode == 0 and len(jars) == 1:
            os.replace(os.path.join(work, jars[0]), os.path.join(build, "job-server.jar"))
            source = artifact
        else:
            say(f"{engine}: not served ({_not_found(done.stdout + done.stderr)}); "
                f"resolving {RUNNER_POMS[engine][0][0]} and what it needs instead")
            with open(os.path.join(work, "pom.xml"), "w", encoding="utf-8") as fh:
                fh.write(_pom(engine))
            lib = os.path.join(build, "lib")
            done = _mvn(["dependency:copy-dependencies", f"-DoutputDirectory={lib}",
                         "-DincludeScope=runtime"], cwd=work)
            if done.returncode != 0:
                return _last_error_line(done.stdout + done.stderr)
            count = pathing_jar(os.path.join(build, "job-server.jar"), MAIN_CLASSES[engine], lib)
            size = sum(os.path.getsize(os.path.join(lib, f)) for f in os.listdir(lib))
            say(f"{engine}: {count} jars, {size / 2**20:.0f} MB")
            source = " + ".join(c for c, _ in RUNNER_POMS[engine])
        with open(os.path.join(build, "SOURCE"), "w", encoding="utf-8") as fh:
            fh.write(source + "\n")
        if os.path.isdir(folder):  # a partial folder of an older set-up
            shutil.rmtree(folder)
        os.replace(build, folder)
    return None


def _flink_distribution(say: Callable[[str], None]) -> Optional[str]:
    """Flink's ``lib/`` and ``bin/bash-java-utils.jar`` from PyPI's
    ``apache-flink-libraries`` sdist, into ``runners.flink_home()``."""
    from beam_dpsu.transforms import runners
    home = runners.flink_home()
    if os.path.isfile(os.path.join(home, "lib", f"flink-dist-{runners.FLINK_DISTRIBUTION}.jar")):
        return None
    package = f"apache-flink-libraries=={runners.FLINK_DISTRIBUTION}"
    say(f"flink: downloading Flink's distribution from PyPI ({package}, 230 MB)")
    with tempfile.TemporaryDirectory(dir=os.path.dirname(home), prefix=".flink-set-up-") as work:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                               "--no-binary", ":all:", "--dest", work, package],
                              capture_output=True, text=True)
        archives = [f for f in os.listdir(work) if f.endswith(".tar.gz")]
        if done.returncode != 0 or len(archives) != 1:
            return _last_error_line(done.stderr + done.stdout)
        build = os.path.join(work, "flink")
        wanted = re.compile(r"^[^/]+/deps/(lib/(flink-dist|log4j)[^/]*\.jar|"
                            r"bin/bash-java-utils\.jar)$")
        with tarfile.open(os.path.join(work, archives[0])) as tar:
            for member in tar.getmembers():
                match = wanted.match(member.name)
                if match and member.isfile():
                    out = os.path.join(build, match.group(1))
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    with tar.extractfile(member) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        if not os.path.isfile(os.path.join(build, "bin", "bash-java-utils.jar")):
            return f"{archives[0]} holds no deps/bin/bash-java-utils.jar"
        if os.path.isdir(home):
            shutil.rmtree(home)
        os.replace(build, home)
    return None


def set_up(engine: str, check: bool = False,
           say: Callable[[str], None] = lambda message: None) -> Optional[str]:
    """Sets ``engine`` up unless it is there; None when it is, else the reason it is not."""
    from beam_dpsu.transforms import runners
    target = _target(engine)
    there = os.path.isfile(target) and (
        engine != "flink" or os.path.isdir(os.path.join(runners.flink_home(), "lib")))
    if there:
        return None
    if check:
        return "not set up"
    if engine == "prism":
        os.makedirs(os.path.dirname(target), exist_ok=True)
        return _build_prism(target, say)
    if shutil.which("java") is None:
        raise UsageError(f"setting up {engine} needs `java` (17) on the PATH")
    os.makedirs(runners.engines_dir(), exist_ok=True)
    why = None if os.path.isfile(target) else _job_server(engine, target, say)
    if why is None and engine == "flink":
        why = _flink_distribution(say)
    return why


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
        say = console.Progress(p.prog, args.quiet)
        failed = 0
        for engine in args.engines or ENGINES:
            why = set_up(engine, args.check, say)
            if why is None:
                print(f"{engine}: {_target(engine)}")
            else:
                failed += 1
                print(f"{engine}: not available: {why}", file=sys.stderr)
        return 1 if failed else 0

    return run_main(p.prog, body)
