"""Throughput of the built-in algorithms on 1 ps + 2 workers vs one plain process.

Usage: ``.venv/bin/python bench/bench_training.py [--repeats 3] [--out docs/bench_training.md]
[--baseline DIR] [--only LABEL,...] [--steps N] [--single-secs S]`` (``--only hogwild
--repeats 1 --steps 30 --single-secs 0.2`` is a quick run to the end)

``--baseline DIR`` runs every configuration alternately from another checkout (e.g. ``git worktree
add /tmp/before <commit>``) and from this one, so both figures come from the same minutes of a
shared, noisy machine; the report then has a before/after column.

Every configuration trains the same model (MLP 784-128-10 on synthetic 28x28 data) with the same
batch; the cluster figure is the chief's ``result.json`` ``examples_per_sec`` (all replicas'
examples per second of training, start-up excluded); the single-process figure is a plain
``Session.run`` loop. The ceiling is two such processes at once with one thread each (what two
workers could do with no communication at all). It also records launch-to-first-step of every
task. Writes a Markdown report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import recipe_cluster  # noqa: E402
from recipe_cluster import RecipeCluster, run_config  # noqa: E402

MODEL = {"name": "mlp", "hidden": [128]}
DATA = {"name": "synthetic", "image_size": 28, "synthetic_examples": 6000}

SINGLE = r"""
import os, sys, time, json
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, sys.argv[1])
import numpy as np, tensorflow as tf
tf.compat.v1.disable_eager_execution()
from recipes.config import DataConf, ModelConf
from recipes.datasets import load, batches
from recipes.models import Model, loss_and_accuracy
batch, secs, threads = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
ds = load(DataConf(name="synthetic", image_size=28, synthetic_examples=6000, batch_size=batch))
m = Model(ModelConf(name="mlp", hidden=(128,)), 28, 1, 10)
x = tf.compat.v1.placeholder(tf.float32, [None, 784]); y = tf.compat.v1.placeholder(tf.int64, [None])
p = m.create_params(); loss, _ = loss_and_accuracy(m.logits(p, x), y)
step = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss)
it = batches(ds.x_train, ds.y_train, batch, 0)
rates = []
conf = tf.compat.v1.ConfigProto(
    intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
with tf.compat.v1.Session(config=conf) as s:
    s.run(tf.compat.v1.global_variables_initializer())
    for _ in range(50): bx, by = next(it); s.run(step, {x: bx, y: by})
    for _ in range(3):
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < secs:
            bx, by = next(it); s.run(step, {x: bx, y: by}); n += 1
        rates.append(n * batch / (time.monotonic() - t0))
print(json.dumps(rates))
"""


def single_process(batch: int, secs: float = 2.0, threads: int = 0, copies: int = 1) -> float:
    """Median examples/s of one plain process (threads 0 = TF's default, one per core); with
    ``copies`` > 1, that many independent processes at once and the sum of their medians."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SINGLE, str(REPO), str(batch), str(secs), str(threads)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(copies)
    ]
    total = 0.0
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        if proc.returncode:
            raise RuntimeError(f"single process failed ({proc.returncode})")
        total += statistics.median(json.loads(out.strip().splitlines()[-1]))
    return total


def cluster_run(
    algo: dict[str, Any], batch: int, max_steps: int, evaluator: bool = False, repo: Path = REPO
) -> tuple[float, dict[str, float]]:
    recipe_cluster.REPO = repo  # the checkout whose recipes/ the tasks run
    with tempfile.TemporaryDirectory(prefix="bench_") as tmp:
        cfg = run_config(
            Path(tmp) / "out",
            algo,
            max_steps=max_steps,
            model=MODEL,
            data={**DATA, "batch_size": batch},
            trainer={"checkpoint_steps": max_steps, "summary_steps": 100, "log_steps": 500},
        )
        with RecipeCluster(Path(tmp), cfg, evaluator=evaluator) as c:
            c.start_all()
            codes = c.wait_all(timeout=300)
            if any(codes.values()):
                raise RuntimeError(f"run failed: {codes}\n{c.dump()}")
            launch = {}
            for name, t in c.tasks.items():
                pattern = {"ps": "serving", "evaluator": r"eval step="}.get(
                    name.split("/")[0], r"first step"
                )
                when = t.first_line_time(pattern)
                launch[name] = (when - t.started) if when else float("nan")
            return float(c.result()["examples_per_sec"]), launch


CONFIGS = [  # (label, algo, batch, max_steps)
    ("hogwild", {"name": "hogwild", "lr": 0.05}, 100, 1500),
    ("hogwild, batch 400", {"name": "hogwild", "lr": 0.05}, 400, 500),
    ("downpour T=10", {"name": "downpour", "lr": 0.05, "window": 10}, 100, 2000),
    ("downpour T=10, batch 400", {"name": "downpour", "lr": 0.05, "window": 10}, 400, 1000),
    ("downpour T=40", {"name": "downpour", "lr": 0.05, "window": 40}, 100, 4000),
    ("agn T=4", {"name": "agn", "lr": 0.05, "window": 4}, 100, 2000),
    ("easgd T=4", {"name": "easgd", "lr": 0.05, "window": 4}, 100, 2000),
    ("sync (R=2)", {"name": "sync", "lr": 0.1, "stop_grace_secs": 2}, 100, 500),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "docs" / "bench_training.md"))
    ap.add_argument("--baseline", help="another checkout to run alternately (before/after)")
    ap.add_argument("--only", help="comma-separated configuration labels to run")
    ap.add_argument(
        "--steps",
        type=int,
        help="global steps of every cluster run (default: each configuration's own, 500-4,000)",
    )
    ap.add_argument(
        "--single-secs",
        type=float,
        default=2.0,
        help="seconds of each of the single process's 3 timed stretches",
    )
    args = ap.parse_args()
    baseline = Path(args.baseline).resolve() if args.baseline else None
    only = set(args.only.split(",")) if args.only else None
    configs = [c for c in CONFIGS if only is None or c[0] in only]
    singles: dict[int, dict[str, float]] = {}
    rows = []
    launch: dict[str, float] = {}
    t_start = time.monotonic()
    for label, algo, batch, own_steps in configs:
        steps = args.steps or own_steps
        if batch not in singles:
            secs = args.single_secs
            singles[batch] = {
                "default": single_process(batch, secs),
                "1 thread": single_process(batch, secs, threads=1),
                "2 x 1 thread": single_process(batch, secs, threads=1, copies=2),
            }
            print(f"single process, batch {batch}: {singles[batch]}", flush=True)
        rates: list[float] = []
        before: list[float] = []
        for r in range(args.repeats):
            first_run = label == "hogwild" and r == 0
            if baseline is not None:  # alternate: before, after, before, after, ...
                before.append(cluster_run(algo, batch, steps, repo=baseline)[0])
            rate, first = cluster_run(algo, batch, steps, evaluator=first_run)
            rates.append(rate)
            if first_run:
                launch = first
            print(f"  {label} run {r}: after {rate:.0f} before {before[-1:]}", flush=True)
        med = statistics.median(rates)
        rows.append((label, batch, rates, before, singles[batch]))
        print(f"{label}: {med:.0f} examples/s = {med / singles[batch]['default']:.2f}x", flush=True)
    elapsed = time.monotonic() - t_start
    write_report(Path(args.out), rows, launch, args.repeats, elapsed, baseline, args.single_secs)


def _rates(rates: list[float]) -> str:
    return ", ".join(f"{r:,.0f}" for r in rates)


def write_report(
    path: Path,
    rows: list[Any],
    launch: dict[str, float],
    repeats: int,
    elapsed: float,
    baseline: Path | None,
    single_secs: float = 2.0,
) -> None:
    lines = [
        "# Training throughput: 1 ps + 2 workers vs one process",
        "",
        f"Generated by `.venv/bin/python bench/bench_training.py` ({time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"{elapsed:.0f} s). MLP 784-128-10, synthetic 28x28 data, plain SGD. Cluster figures "
        f"are medians of {repeats} runs of the chief's `examples_per_sec` (every replica's "
        "examples, start-up excluded); the single process is a plain `Session.run` loop with "
        f"the same model and batch (median of 3 x {single_secs:g} s, TF's default threads). The "
        "ceiling is two such processes at once with one thread each (two workers that never "
        "communicate). All "
        "processes share the same cores.",
        "",
    ]
    if baseline is not None:
        lines += [
            f"*before* ran the recipes of `{baseline}` alternately with this checkout's "
            "(*after*): before, after, before, after, ...",
            "",
            "| configuration | batch | one process | ceiling (2 x 1 thread) | before | after "
            "| before ratio | after ratio | after / before | runs before | runs after |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for label, batch, rates, before, single in rows:
            one, med, med_b = single["default"], statistics.median(rates), statistics.median(before)
            lines.append(
                f"| {label} | {batch} | {one:,.0f} | {single['2 x 1 thread']:,.0f} "
                f"({single['2 x 1 thread'] / one:.2f}x) | {med_b:,.0f} | {med:,.0f} | "
                f"{med_b / one:.2f}x | **{med / one:.2f}x** | {med / med_b:.2f} | "
                f"{_rates(before)} | {_rates(rates)} |"
            )
    else:
        lines += [
            "| configuration | batch | cluster examples/s | one process | ratio "
            "| ceiling (2 x 1 thread) | runs |",
            "|---|---|---|---|---|---|---|",
        ]
        for label, batch, rates, _, single in rows:
            one, med = single["default"], statistics.median(rates)
            lines.append(
                f"| {label} | {batch} | {med:,.0f} | {one:,.0f} | **{med / one:.2f}x** | "
                f"{single['2 x 1 thread']:,.0f} ({single['2 x 1 thread'] / one:.2f}x) | "
                f"{_rates(rates)} |"
            )
    singles = {batch: single for _, batch, _, _, single in rows}
    lines += ["", "| batch | one process, default threads | one process, 1 thread | 2 x 1 thread |"]
    lines += ["|---|---|---|---|"]
    for batch, single in sorted(singles.items()):
        lines.append(
            f"| {batch} | {single['default']:,.0f} | {single['1 thread']:,.0f} | "
            f"{single['2 x 1 thread']:,.0f} |"
        )
    if launch:
        lines += [
            "",
            "## Launch to first step (hogwild run, all tasks started at once)",
            "",
            "| task | seconds from launch | event |",
            "|---|---|---|",
        ]
        for name, secs in launch.items():
            event = {"ps": "server up", "evaluator": "first evaluation"}.get(
                name.split("/")[0], "first training step"
            )
            lines.append(f"| {name} | {secs:.1f} | {event} |")
    lines += [
        "",
        "## Reading the figures",
        "",
        READING,
        "",
        "See docs/runtime.md for how the runtime works.",
        "",
    ]
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


READING = (
    "- *one process* uses TF's default thread pools (one thread per core); the 1-thread and "
    "2 x 1-thread columns show what a process gets when it does not compete with its own "
    "threads. Three tasks (ps + 2 workers) share the cores one process has alone; the runtime "
    "sizes each task's pools to cores / co-located tasks (`recipes.runtime.op_threads`).\n"
    "- Windowed algorithms run their T-1 local steps past the hooks (no ps round trip); hogwild "
    "and sync still ship all parameters over gRPC every minibatch.\n"
    "- Timings on a shared machine are noisy: compare before/after only within one "
    "`--baseline` run."
)


if __name__ == "__main__":
    main()
