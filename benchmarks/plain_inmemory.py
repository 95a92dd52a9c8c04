"""The in-memory floor: a histogram mechanism in plain Python + numpy, no Beam.

What the command line computes, done the most direct way in one process: read
every input file (decompress, count identical lines with ``collections.Counter``,
parse the distinct lines into ``{user: {item: count}}``:
``transforms.textio.read_per_user``),
sample each user to Δ0, sum the weighted histogram in one dict and apply the
mechanism's keyed release rule to every item. It uses the library's own
per-user and per-item functions (``dp.mechanisms.base.run_local``), so it releases exactly
the set the pipeline releases under the same key; what it does not pay is
Beam: no elements, coders, shuffles, bundles or side inputs.

    python benchmarks/plain_inmemory.py --input PATH [--mechanism weighted-gaussian]
        [--epsilon 3] [--delta 1e-5] [--max-items-per-user 100] [--test-seed N]

With ``--columnar`` the same release is computed by the columnar functions
(``dp.mechanisms.on_blocks.release_from_files``: blocks of arrays, the code the command line
runs on Beam) in this one process: the floor of the columnar path.

Prints one ``RESULT {json}`` line: wall and CPU seconds (total and per phase),
the number released and the peak RSS of the process. ``benchmarks/bench_scale.py``
runs it (configuration ``plain:MECHANISM``) alternated with the command line.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import resource
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from beam_dpsu.dp.mechanisms.base import run_local  # noqa: E402
from beam_dpsu.dp.randomness.noise import RunKey  # noqa: E402
from beam_dpsu.dp.mechanisms.registry import MechanismParams, make_mechanism  # noqa: E402
from beam_dpsu.transforms.textio import read_per_user  # noqa: E402


def run(input_pattern: str, mechanism, run_key: RunKey) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    per_user = read_per_user(input_pattern)
    t1, c1 = time.perf_counter(), time.process_time()
    released = run_local(per_user, mechanism, run_key)
    t2, c2 = time.perf_counter(), time.process_time()
    return {"users": len(per_user), "released": len(released),
            "wall_seconds": t2 - t0, "cpu_seconds": c2 - c0,
            "read_wall": t1 - t0, "read_cpu": c1 - c0,
            "mechanism_wall": t2 - t1, "mechanism_cpu": c2 - c1}


def run_columnar(input_pattern: str, mechanism, run_key: RunKey) -> dict:
    import glob
    from beam_dpsu.dp.mechanisms.on_blocks import release_from_files
    t0, c0 = time.perf_counter(), time.process_time()
    released, users, _ = release_from_files(sorted(glob.glob(input_pattern)), mechanism,
                                            RunKey.resolve(run_key))
    return {"users": users, "released": len(released),
            "wall_seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True)
    ap.add_argument("--mechanism", default="weighted-gaussian")
    ap.add_argument("--epsilon", type=float, default=3.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--max-items-per-user", dest="max_items", type=int, default=100)
    ap.add_argument("--test-seed", type=int, help="a known key (benchmarks only); default fresh")
    ap.add_argument("--columnar", action="store_true",
                    help="run the columnar functions (dp.data.columnar) instead of the dict path")
    args = ap.parse_args(argv)
    params = MechanismParams(epsilon=args.epsilon, delta=args.delta, max_items=args.max_items)
    mechanism = make_mechanism(args.mechanism, params)
    run_key = RunKey.from_test_seed(args.test_seed) if args.test_seed is not None else None
    result = (run_columnar if args.columnar else run)(args.input, mechanism, run_key)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
