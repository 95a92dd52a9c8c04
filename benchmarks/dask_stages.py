"""Per-stage timing of a Beam pipeline on Beam's Dask runner (for bench_dask.py).

``install()`` (in the launching process, before the pipeline is built and run)
wraps the Dask runner's ParDo translation so that every dask task that runs a
Beam ``ParDo`` over a partition records, on the worker, the transform's full
label, the partition's wall-clock start and end and the number of elements in
and out. ``collect(client)`` fetches and clears those records on every worker.

Together with the scheduler's task stream (``distributed.get_task_stream``) this
splits the workers' busy time into ParDo time per Beam transform and the rest
(dask's ``groupby`` shuffle tasks, bag glue, (de)serialisation), and gives the
transfer time between workers. Measurement only: the wrapper calls the runner's
own ``apply_dofn_to_bundle`` unchanged, so what runs is what would run without it.

Caveats: the runner's lazy per-element maps over a ParDo's input
(``get_windowed_value``, after a ``GroupByKey`` the per-group ``defenestrate``
list) run before the timing starts and count as non-ParDo time; a side input's
evaluation is counted in the ParDo that reads it. Such an evaluation is a
nested dask computation: the task secedes from the worker's thread pool, waits
for the result and then waits to rejoin the pool, while the worker runs other
tasks; its wall time then includes other tasks' time. So stages are measured
by the CPU time of the thread that runs the ParDo (``time.thread_time``), which
excludes those waits; the wall time per ParDo is kept as ``wall_s``.
"""
from __future__ import annotations

import functools
import os
import re
import time
from typing import Dict, List

RECORDS: List[tuple] = []


def timed_apply(label, items, do_fn_invoker_args, do_fn_invoker_kwargs, tagged_receivers):
    from apache_beam.runners.dask import transform_evaluator as te
    original = getattr(te, "_beam_dpsu_original_apply", te.apply_dofn_to_bundle)
    items = list(items)  # the runner's lazy per-element maps run here, outside the timing
    t0, c0 = time.time(), time.thread_time()
    out = original(items, do_fn_invoker_args, do_fn_invoker_kwargs, tagged_receivers)
    RECORDS.append((label, t0, time.time(), time.thread_time() - c0, len(items), len(out)))
    return out


def install() -> None:
    """Patches the Dask runner's ParDo translation in this process (idempotent)."""
    from apache_beam.runners.dask import transform_evaluator as te
    if hasattr(te, "_beam_dpsu_original_apply"):
        return
    te._beam_dpsu_original_apply = te.apply_dofn_to_bundle
    original_pardo_apply = te.ParDo.apply

    def apply(self, input_bag, side_inputs=None):
        te.apply_dofn_to_bundle = functools.partial(timed_apply, self.applied.full_label)
        try:
            return original_pardo_apply(self, input_bag, side_inputs)
        finally:
            te.apply_dofn_to_bundle = te._beam_dpsu_original_apply

    te.ParDo.apply = apply


def _pop_records():
    from benchmarks import dask_stages
    out = list(dask_stages.RECORDS)
    dask_stages.RECORDS.clear()
    return out


def collect(client) -> Dict[str, List[tuple]]:
    """{worker address: [(label, start, end, thread cpu s, n_in, n_out), ...]}, cleared
    on the workers."""
    return client.run(_pop_records)


#: Stage of a Beam transform, by its full label (first match wins).
STAGES = [
    ("read+parse", r"^ReadUserItems/(?!MergePerUser)"),
    ("per-user merge", r"^ReadUserItems/MergePerUser/"),
    ("count users", r"^CountUsers"),
    ("run key", r"/DrawRunKey"),
    ("sample (bound users)", r"/Sample(Items|\d+)/"),
    ("histogram", r"/Histogram\d*/"),
    ("release (threshold)", r"/Release\d*/"),
    ("SIPS removal join", r"/Remove\d+/|/SipsRounds/Tag\d|/DropRound/"),
    ("ordered: prepare", r"/OrderedPolicy/(Prepare|SplitPrepared|GroupBuckets|SortBuckets|"
                         r"CollectBuckets)"),
    ("ordered: sequential", r"/OrderedPolicy/Sequential"),
    ("ordered: id join", r"/OrderedPolicy/"),
    ("write", r"^(ToLine|WriteItems|WriteDeadLetter|JoinLeaves)"),
]


def stage_of(label: str) -> str:
    for name, pattern in STAGES:
        if re.search(pattern, label):
            return name
    return "other: " + label.split("/")[0]


def summarise(records: Dict[str, List[tuple]], tasks: List[dict]) -> dict:
    """Per stage: summed ParDo thread-CPU seconds; per label also wall seconds and
    elements; plus the task stream's totals (task wall, transfer)."""
    by_label: Dict[str, list] = {}
    pardo_total = pardo_wall = 0.0
    for _, recs in records.items():
        for label, t0, t1, cpu, n_in, n_out in recs:
            e = by_label.setdefault(label, [0.0, 0.0, 0, 0, 0])
            e[0] += cpu
            e[1] += t1 - t0
            e[2] += n_in
            e[3] += n_out
            e[4] += 1
            pardo_total += cpu
            pardo_wall += t1 - t0
    stages: Dict[str, float] = {}
    for label, (sec, *_rest) in by_label.items():
        s = stage_of(label)
        stages[s] = stages.get(s, 0.0) + sec
    compute = transfer = 0.0
    per_prefix: Dict[str, float] = {}
    starts, stops = [], []
    nbytes: Dict[str, int] = {}
    for t in tasks:
        key = t["key"][0] if isinstance(t["key"], tuple) else t["key"]
        prefix = re.sub(r"-[0-9a-f]{32}$", "", str(key))
        if isinstance(t.get("nbytes"), dict):
            nbytes[prefix] = nbytes.get(prefix, 0) + sum(t["nbytes"].values())
        elif isinstance(t.get("nbytes"), int):
            nbytes[prefix] = nbytes.get(prefix, 0) + t["nbytes"]
        for ss in t.get("startstops", ()):
            d = ss["stop"] - ss["start"]
            if ss["action"] == "compute":
                compute += d
                per_prefix[prefix] = per_prefix.get(prefix, 0.0) + d
                starts.append(ss["start"])
                stops.append(ss["stop"])
            elif ss["action"] == "transfer":
                transfer += d
    return {
        "pardo_cpu_s_by_stage": {k: round(v, 2) for k, v in sorted(stages.items(),
                                                                   key=lambda kv: -kv[1])},
        "pardo_by_label": {k: {"cpu_s": round(v[0], 2), "wall_s": round(v[1], 2), "in": v[2],
                               "out": v[3], "tasks": v[4]}
                           for k, v in sorted(by_label.items(), key=lambda kv: -kv[1][0])},
        "tasks": len(tasks),
        "task_wall_s": round(compute, 2),
        "pardo_cpu_s": round(pardo_total, 2),
        "pardo_wall_s": round(pardo_wall, 2),
        "transfer_s": round(transfer, 2),
        "compute_span_s": round(max(stops) - min(starts), 2) if starts else 0.0,
        "task_compute_by_prefix": {k: round(v, 2) for k, v in sorted(
            per_prefix.items(), key=lambda kv: -kv[1])[:12]},
        "result_mb_by_prefix": {k: round(v / 2**20, 1) for k, v in sorted(
            nbytes.items(), key=lambda kv: -kv[1])[:12]},
    }


def profile_summary(profile: dict, top: int = 15) -> dict:
    """The workers' statistical profile (``client.profile``: stacks sampled every
    10 ms in the task threads) as the share of samples per function: ``self`` (the
    function itself was running) and ``inclusive`` (on the stack), top entries.
    (``client.profile(server=True)``, the event loop, returned no samples here.)"""
    selfc: Dict[str, int] = {}
    incl: Dict[str, int] = {}
    total = profile.get("count", 0) or 0

    def walk(node, on_stack):
        d = node.get("description") or {}
        name = f"{os.path.basename(str(d.get('filename', '')))}:{d.get('name', '')}"
        children = node.get("children", {}) or {}
        count = node.get("count", 0)
        child_sum = sum(c.get("count", 0) for c in children.values())
        selfc[name] = selfc.get(name, 0) + max(0, count - child_sum)
        if name not in on_stack:
            incl[name] = incl.get(name, 0) + count
        for c in children.values():
            walk(c, on_stack | {name})

    for c in (profile.get("children") or {}).values():
        walk(c, frozenset())
    share = (lambda n: round(100.0 * n / total, 1)) if total else (lambda n: 0.0)
    return {"samples": total,
            "self_pct": {k: share(v) for k, v in sorted(selfc.items(),
                                                       key=lambda kv: -kv[1])[:top]},
            "inclusive_pct": {k: share(v) for k, v in sorted(incl.items(),
                                                            key=lambda kv: -kv[1])[:top]}}
