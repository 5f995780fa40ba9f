"""Throughput of the built-in algorithms on 1 ps + 2 workers vs one plain process.

Usage: ``.venv/bin/python bench/bench_training.py [--repeats 2] [--out docs/bench_training.md]``

Every configuration trains the same model (MLP 784-128-10 on synthetic 28x28 data) with the same
batch; the cluster figure is the chief's ``result.json`` ``examples_per_sec`` (all replicas'
examples per second of training, start-up excluded); the single-process figure is a plain
``Session.run`` loop. It also records launch-to-first-step of every task. Writes a Markdown
report.
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
from recipes.data import load, batches
from recipes.models import Model, loss_and_accuracy
batch, secs = int(sys.argv[2]), float(sys.argv[3])
ds = load(DataConf(name="synthetic", image_size=28, synthetic_examples=6000, batch_size=batch))
m = Model(ModelConf(name="mlp", hidden=(128,)), 28, 1, 10)
x = tf.compat.v1.placeholder(tf.float32, [None, 784]); y = tf.compat.v1.placeholder(tf.int64, [None])
p = m.create_params(); loss, _ = loss_and_accuracy(m.logits(p, x), y)
step = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss)
it = batches(ds.x_train, ds.y_train, batch, 0)
rates = []
with tf.compat.v1.Session() as s:
    s.run(tf.compat.v1.global_variables_initializer())
    for _ in range(50): bx, by = next(it); s.run(step, {x: bx, y: by})
    for _ in range(3):
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < secs:
            bx, by = next(it); s.run(step, {x: bx, y: by}); n += 1
        rates.append(n * batch / (time.monotonic() - t0))
print(json.dumps(rates))
"""


def single_process(batch: int, secs: float = 2.0) -> float:
    out = subprocess.run(
        [sys.executable, "-c", SINGLE, str(REPO), str(batch), str(secs)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return statistics.median(json.loads(out.stdout.strip().splitlines()[-1]))


def cluster_run(
    algo: dict[str, Any], batch: int, max_steps: int, evaluator: bool = False
) -> tuple[float, dict[str, float]]:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "docs" / "bench_training.md"))
    args = ap.parse_args()
    configs = [  # (label, algo, batch, max_steps)
        ("hogwild", {"name": "hogwild", "lr": 0.05}, 100, 1500),
        ("hogwild, batch 400", {"name": "hogwild", "lr": 0.05}, 400, 500),
        ("downpour T=10", {"name": "downpour", "lr": 0.05, "window": 10}, 100, 3000),
        ("downpour T=10, batch 400", {"name": "downpour", "lr": 0.05, "window": 10}, 400, 1000),
        ("sync (R=2)", {"name": "sync", "lr": 0.1, "stop_grace_secs": 2}, 100, 500),
    ]
    singles: dict[int, float] = {}
    rows = []
    launch: dict[str, float] = {}
    t_start = time.monotonic()
    for label, algo, batch, steps in configs:
        if batch not in singles:
            singles[batch] = single_process(batch)
            print(f"single process, batch {batch}: {singles[batch]:.0f} examples/s", flush=True)
        rates = []
        for r in range(args.repeats):
            rate, first = cluster_run(algo, batch, steps, evaluator=(label == "hogwild" and r == 0))
            rates.append(rate)
            if label == "hogwild" and r == 0:
                launch = first
        med = statistics.median(rates)
        rows.append((label, batch, med, singles[batch], rates))
        print(f"{label}: {med:.0f} examples/s = {med / singles[batch]:.2f}x", flush=True)
    write_report(Path(args.out), rows, launch, args.repeats, time.monotonic() - t_start)


def write_report(
    path: Path, rows: list[Any], launch: dict[str, float], repeats: int, elapsed: float
) -> None:
    lines = [
        "# Training throughput: 1 ps + 2 workers vs one process",
        "",
        f"Generated by `.venv/bin/python bench/bench_training.py` ({time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"{elapsed:.0f} s). MLP 784-128-10, synthetic 28x28 data, plain SGD. Cluster figures "
        f"are medians of {repeats} runs of the chief's `examples_per_sec` (every replica's "
        "examples, start-up excluded); the single process is a plain `Session.run` loop with "
        "the same model and batch (median of 3 x 2 s). All processes share the same cores.",
        "",
        "| configuration | batch | cluster examples/s | one process examples/s | ratio | runs |",
        "|---|---|---|---|---|---|",
    ]
    for label, batch, med, single, rates in rows:
        lines.append(
            f"| {label} | {batch} | {med:,.0f} | {single:,.0f} | {med / single:.2f}x | "
            + ", ".join(f"{r:,.0f}" for r in rates)
            + " |"
        )
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
        "- The target of 0.8x of one process is **not reached** on this 2-core machine. "
        "Three processes (ps + 2 workers) share the 2 cores that one process uses alone, "
        "so the ceiling is about 1x even with no communication.",
        "- DOWNPOUR's window removes the parameter traffic of T-1 of every T steps, but "
        "each local step is still one `MonitoredSession.run`, whose hooks read "
        "`global_step` from the ps (StopAtStep, StepCounter, the progress line): one ps "
        "round trip per minibatch remains. Caching the step on the worker during a window "
        "is the next lever.",
        "- Launch-to-first-step is dominated by importing TensorFlow in 4 processes at "
        "once on 2 cores.",
        "",
        "See docs/runtime.md for how the runtime works.",
        "",
    ]
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
