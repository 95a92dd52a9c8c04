"""Runs ``beam-dpsu compare`` on every shared dataset and on synthetic data.

Writes ``benchmarks/results/<dataset>/results.PRIVATE.md`` (+ JSON and plots) and an
index ``benchmarks/results/README.md`` with the commands that made them.

    python benchmarks/compare_all.py [--data ../shared/data] [--trials 5] [--only NAME ...]

The datasets are not part of the project; ``--data`` points at them. The
mechanism settings are those of the papers' tables (ε = 3, δ = e^-10).
"""
from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from beam_dpsu.dp.evaluation import synthetic  # noqa: E402
from beam_dpsu.pipelines import compare  # noqa: E402

MECHANISMS = ("gw-kt,weighted-gaussian:max_items=300,gw,policy-laplace:max_items=10,"
              "weighted-laplace:max_items=10,policy-gaussian:max_items=300:alpha=5,"
              "policy-gaussian:max_items=100,weighted-gaussian:max_items=100,"
              "count-gaussian:max_items=50,count-laplace:max_items=10,"
              "truncated-geometric:max_items=10,sips:max_items=100")
# ε sweeps (the papers' figure 3); the other datasets run at ε = 3 only.
SWEEPS = {"commits-rails": "1,2,3,4"}
DATASETS = ["commits-rails", "commits-ansible", "reddit-titles", "paths-ansible",
            "movielens-small"]
# Public counts for gw-kt: distinct users per item of a related dataset.
PUBLIC = {"commits-rails": "commits-ansible", "commits-ansible": "commits-rails",
          "paths-ansible": "commits-ansible", "reddit-titles": "commits-rails",
          "movielens-small": None, "synthetic": None}


def write_public_counts(source: str, path: str) -> None:
    per_user = compare.load_per_user(source)
    counts = compare.users_per_item(per_user)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{item}\t{n}\n" for item, n in counts.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--only", nargs="*")
    p.add_argument("--synthetic-users", type=int, default=100_000)
    args = p.parse_args(argv)
    out_root = ROOT / "benchmarks" / "results"
    out_root.mkdir(parents=True, exist_ok=True)
    index = ["# Comparison results", "",
             f"Made by `python benchmarks/compare_all.py --trials {args.trials} "
             f"--synthetic-users {args.synthetic_users}`; each folder "
             "holds `results.PRIVATE.md`, `results.PRIVATE.json` and the plots. ε = 3, δ = e^-10 (δ = "
             f"{math.exp(-10):.6g}), the settings of the papers' tables.", ""]
    with tempfile.TemporaryDirectory() as tmp:
        names = DATASETS + ["synthetic"]
        for name in names:
            if args.only and name not in args.only:
                continue
            if name == "synthetic":
                path = os.path.join(tmp, "synthetic.tsv.gz")
                synthetic.write_tsv(path, args.synthetic_users, seed=0)
            else:
                path = os.path.join(args.data, name + ".pairs.tsv.gz")
                if not os.path.exists(path):
                    print(f"skip {name}: {path} missing", file=sys.stderr)
                    continue
            mechs = MECHANISMS
            extra = []
            if PUBLIC.get(name):
                public = os.path.join(tmp, f"public-{name}.tsv")
                write_public_counts(os.path.join(args.data, PUBLIC[name] + ".pairs.tsv.gz"),
                                    public)
                extra = ["--public-counts", public]
            else:
                mechs = ",".join(m for m in MECHANISMS.split(",") if not m.startswith("gw-kt"))
            argv_ = ["--input", path, "--output", str(out_root / name), "--mechanisms", mechs,
                     "--epsilons", SWEEPS.get(name, "3"), "--delta", repr(math.exp(-10)),
                     "--trials", str(args.trials), "--overwrite"] + extra
            compare.run(argv_)
            shown = ["--input", f"<data>/{name}.pairs.tsv.gz" if name != "synthetic"
                     else f"<synthetic {args.synthetic_users} users, seed 0>",
                     "--output", f"benchmarks/results/{name}"] + argv_[4:]
            if extra:
                shown[-1] = f"<users per item of {PUBLIC[name]}>"
            index.append(f"- [{name}]({name}/results.PRIVATE.md): `beam-dpsu compare "
                         f"{' '.join(shown)}`")
    (out_root / "README.md").write_text("\n".join(index) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
