"""Wall time, CPU time and peak memory of the command line at scale, alternated.

Generates N synthetic users (Synthetic_80M recipe, ``beam-dpsu generate``) once
(or reuses ``--keep PATH``), then runs, alternating round by round, each
requested configuration in its own child process (so each peak RSS is that
run's alone) on the DirectRunner:

* ``cli:<mechanism>``: ``beam-dpsu select`` on the input, one worker;
* ``cli2:<mechanism>``: the same with ``--direct_num_workers=2
  --direct_running_mode=multi_processing``;
* ``plain:<mechanism>``: ``benchmarks/plain_inmemory.py``, the same mechanism
  in plain in-memory Python + numpy (the dict path's floor);
* ``columnar:<mechanism>``: ``plain_inmemory.py --columnar``, the columnar
  functions the command line runs, in one process without Beam (its floor);
* ``top-k:<method>``: ``beam-dpsu top-k --k 100 --method METHOD`` (``limited-domain``
  or ``discover-peel``), one worker;
* ``hitting-set:k``: ``beam-dpsu hitting-set --k 100``, one worker;
* ``zcat``: ``zcat FILES | wc -l`` (``cat`` for files not ending in .gz):
  decompression alone, the physical floor of any reader;

and prints one line per run, then per configuration the median wall time
(min–max), the median CPU time (the child's and its workers'), the median
peak RSS and the ratio of medians to the named ``--baseline`` and to every
floor measured (``zcat``, ``plain:…``, ``columnar:…``).

    python benchmarks/bench_scale.py --keep /tmp/syn100k.tsv.gz --repeats 3 \\
        --configs zcat plain:weighted-gaussian columnar:weighted-gaussian \\
        cli:weighted-gaussian
    python benchmarks/bench_scale.py --input '/tmp/syn8/part-*' --repeats 3 \\
        --configs cli:weighted-gaussian cli2:weighted-gaussian

``--input`` reuses existing files (a glob); ``benchmarks/split_input.py`` splits a
file into N files by user. Peak memory is the child's maximum resident set
(``ru_maxrss``; with two workers, the largest of the child and its workers).
The mechanisms use ε = 3, δ = 1e-5 (sips: ρ = 0.1) and Δ0 = 100 unless given.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

FLAGS = {
    "sips": ["--rho", "0.1", "--delta", "1e-5"],
}
DEFAULT_FLAGS = ["--epsilon", "3", "--delta", "1e-5"]
#: the ranked commands (``KIND:NAME``), each with these flags (and Δ0 where it has one)
RANKED = ("top-k", "hitting-set")
RANKED_FLAGS = ["--k", "100", "--epsilon", "3", "--delta", "1e-5"]
TWO_WORKERS = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]

#: The command line as a user runs it (``beam-dpsu select``, i.e.
#: ``beam_dpsu.pipelines.cli.run_command``), reading the public summary it
#: writes next to the release.
CHILD = r"""
import json, resource, sys, time
start = time.time()
from beam_dpsu.pipelines import cli
argv = sys.argv[1:] + ["--quiet"]
command, argv = argv[0], argv[1:]
status = cli.run_command(command, argv, prog="")
if status:
    sys.exit(status)
prefix = argv[argv.index("--output") + 1]
with open(prefix + ".json") as f:
    summary = json.load(f)
with open(prefix + ".PRIVATE-run-details.json") as f:
    summary["PRIVATE_run_details"] = json.load(f)
summary["child_wall_seconds"] = time.time() - start
summary["peak_rss_mib"] = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                              resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
print("RESULT " + json.dumps(summary))
"""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_child(cmd):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    c0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT))
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]), wall, cpu
    raise RuntimeError(f"child failed: {proc.stderr[-3000:]}")


def run_zcat(data):
    import glob
    paths = sorted(glob.glob(data))
    tool = "zcat" if all(p.endswith(".gz") for p in paths) else "cat"
    c0, t0 = _children_cpu(), time.perf_counter()
    out = subprocess.run(f"{tool} {' '.join(paths)} | wc -l", shell=True, check=True,
                         capture_output=True, text=True).stdout
    return {"lines": int(out.split()[0]), "peak_rss_mib": 0}, time.perf_counter() - t0, \
        _children_cpu() - c0


def run_config(config, data, tmp, max_items):
    if config == "zcat":
        return run_zcat(data)
    kind, name = config.split(":", 1)
    flags = FLAGS.get(name, DEFAULT_FLAGS) + ["--max-items-per-user", str(max_items)]
    if kind in ("plain", "columnar"):
        s, wall, cpu = run_child([sys.executable, str(ROOT / "benchmarks" / "plain_inmemory.py"),
                                  "--input", data, "--mechanism", name] + flags
                                 + (["--columnar"] if kind == "columnar" else []))
        return {"released": s["released"], "users": s["users"], "inner_s": s["wall_seconds"],
                "peak_rss_mib": s["peak_rss_mib"]}, wall, cpu
    out = os.path.join(tmp, f"{name}-{time.time_ns()}")
    if kind in RANKED:
        flags = RANKED_FLAGS + ["--max-items-per-user", str(max_items)] * (
            name != "limited-domain") + (["--method", name] if kind == "top-k" else [])
        cmd = [sys.executable, "-c", CHILD, kind, "--input", data, "--output", out] + flags
    else:
        cmd = [sys.executable, "-c", CHILD, "select", "--input", data, "--output", out,
               "--mechanism", name] + flags + (TWO_WORKERS if kind == "cli2" else [])
    s, wall, cpu = run_child(cmd)
    details = s["PRIVATE_run_details"]  # exact counts and timings: owner-only
    return {"released": s["num_released"], "users": details["num_users"],
            "inner_s": details["wall_seconds"], "peak_rss_mib": s["peak_rss_mib"]}, wall, cpu


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic DATA (not of a "
                   "release: every pipeline run draws a fresh key)")
    p.add_argument("--input", help="existing input file or glob (skips generation)")
    p.add_argument("--keep", help="reuse/keep the generated data at this path")
    p.add_argument("--configs", nargs="+",
                   default=["plain:weighted-gaussian", "cli:weighted-gaussian"],
                   help="KIND:MECHANISM with KIND in cli, cli2, plain, columnar; "
                        "top-k:METHOD; hitting-set:k; or zcat")
    p.add_argument("--baseline", help="the configuration ratios are taken against "
                   "(default: the first)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-items-per-user", type=int, default=100)
    args = p.parse_args(argv)
    for c in args.configs:
        if c != "zcat" and (c.split(":", 1)[0] not in ("cli", "cli2", "plain", "columnar")
                            + RANKED or ":" not in c):
            p.error(f"bad configuration {c!r}")
    baseline = args.baseline or args.configs[0]
    runs = {c: [] for c in args.configs}
    with tempfile.TemporaryDirectory() as tmp:
        data = args.input or args.keep or os.path.join(tmp, "synthetic.tsv.gz")
        if not args.input and not os.path.exists(data):
            start = time.time()
            from beam_dpsu.dp.evaluation import synthetic
            lines = synthetic.write_tsv(data, args.users, args.seed)
            print(json.dumps({"generated": data, "users": args.users, "lines": lines,
                              "seconds": round(time.time() - start, 1)}), flush=True)
        for r in range(args.repeats):
            for c in args.configs:
                row, wall, cpu = run_config(c, data, tmp, args.max_items_per_user)
                runs[c].append((wall, cpu, row))
                print(json.dumps({"round": r, "config": c, "wall_s": round(wall, 2),
                                  "cpu_s": round(cpu, 2), **row}), flush=True)
    med = {c: statistics.median(w for w, _, _ in runs[c]) for c in args.configs}
    floors = [c for c in args.configs if c == "zcat" or c.split(":", 1)[0] in
              ("plain", "columnar")]
    ratios = [baseline] + [f for f in floors if f != baseline]
    print("\n| configuration | median wall s (min–max) | median CPU s | peak RSS MiB | "
          "released | " + " | ".join(f"ratio to {r}" for r in ratios) + " |\n|"
          + "---|" * (5 + len(ratios)))
    for c in args.configs:
        walls = [w for w, _, _ in runs[c]]
        cpu = statistics.median(x for _, x, _ in runs[c])
        rss = statistics.median(row["peak_rss_mib"] for _, _, row in runs[c])
        rel = ", ".join(str(row.get("released", "-")) for _, _, row in runs[c])
        print(f"| {c} | {med[c]:.2f} ({min(walls):.2f}–{max(walls):.2f}) | {cpu:.2f} | "
              f"{rss:.0f} | {rel} | "
              + " | ".join(f"{med[c] / med[r]:.2f}" for r in ratios) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
