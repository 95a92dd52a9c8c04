"""The command line of two source trees, alternated: wall time of each process, medians.

Usage (any directory; the trees are put on PYTHONPATH, not installed):
    git archive 15ff1e8 | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    python benchmarks/bench_trees.py --old /tmp/old --old-module beam_dpsu.cli \\
        --new . --input commits-rails.pairs.tsv.gz --rounds 9

Each round runs both trees' ``select`` once, in fresh processes (start-up, Beam's import
and teardown included, as a user pays them), the order swapped every round; prints each
pair (wall time, peak RSS of the process) and, at the end, the medians and NEW/OLD (the
ratio of the medians). Both runs use
the same flags (``--flags``, default: weighted Gaussian, ε = 3, δ = 1e-5, Δ0 = 100).
"""
import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

DEFAULT_FLAGS = ("--mechanism weighted-gaussian --epsilon 3 --delta 1e-5 "
                 "--max-items-per-user 100 --quiet --overwrite")


def timed_run(tree: str, module: str, argv, cwd: str):
    """``(wall seconds, peak RSS in MiB)`` of one run of ``module`` from ``tree``."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", module, *argv], cwd=cwd, env=env,
                                 stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip()[-400:]
            raise SystemExit(f"{tree}: exit {child.returncode}: {tail}")
    return elapsed, usage.ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="source tree of the baseline")
    ap.add_argument("--old-module", default="beam_dpsu.pipelines.cli")
    ap.add_argument("--new", default=".", help="source tree measured (default: .)")
    ap.add_argument("--new-module", default="beam_dpsu.pipelines.cli")
    ap.add_argument("--input", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--flags", default=DEFAULT_FLAGS)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench_trees-")
    flags = ["select", "--input", os.path.abspath(a.input), *shlex.split(a.flags)]
    runs = {"old": (a.old, a.old_module), "new": (a.new, a.new_module)}
    times = {"old": [], "new": []}
    peaks = {"old": [], "new": []}
    for r in range(a.rounds):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        for name in order:
            tree, module = runs[name]
            argv = flags + ["--output", os.path.join(work, name)]
            wall, peak = timed_run(tree, module, argv, work)
            times[name].append(wall)
            peaks[name].append(peak)
        print(f"round {r}: " + "  ".join(f"{n} {times[n][-1]:.3f} s {peaks[n][-1]:.0f} MiB"
                                         for n in order), flush=True)
    old, new = statistics.median(times["old"]), statistics.median(times["new"])
    print(f"median OLD {old:.3f} s ({max(peaks['old']):.0f} MiB peak), NEW {new:.3f} s "
          f"({max(peaks['new']):.0f} MiB peak), NEW/OLD {new / old:.3f} "
          f"(load {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
