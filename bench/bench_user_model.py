"""Accuracy of the user's model through every algorithm vs the same model trained by Keras ``fit``.

    .venv/bin/python bench/bench_user_model.py [--examples 64000] [--out docs/bench_user_model.md]

examples/tabular (a Keras model with named inputs and an embedding, 4 TFRecord shards, a separate
eval file) is copied to a temporary folder and its data written by its own script. Then:
- one process: the same model compiled with SGD and trained by ``model.fit`` on the same shards
  for the same number of examples (``--examples``), scored on ``eval.tfrecord``;
- every algorithm through ``tfplan apply`` on the embedded local cluster (1 ps + 2 workers;
  ``allreduce`` without the ps, ``pss`` with its chief), each with its shipped defaults
  (optimizer, learning rate, window), ``max_steps`` chosen so that every replica together sees
  ``--examples`` examples; the held-out accuracy is the chief's ``result.json``.
The report is a table: accuracy, its difference to the one-process figure (target: within 2
points), and the run's training time. ``--examples 6400 --only downpour`` is a quick run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from apply_helpers import (  # noqa: E402
    free_port_base,
    kill_groups,
    minibatches_per_step,
    recorded_groups,
    topology,
)

from tfplan.config.algorithms import ALGORITHMS  # noqa: E402

BATCH = 32
TARGET_POINTS = 2.0

FIT = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, os.getcwd())
import tensorflow as tf, keras
from tabular.models import build
examples, batch, lr = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
spec = {"num": tf.io.FixedLenFeature([4], tf.float32), "cat": tf.io.FixedLenFeature([], tf.int64),
        "label": tf.io.FixedLenFeature([], tf.int64)}
def read(pattern, shuffle):
    files = sorted(tf.io.gfile.glob(pattern))
    ds = tf.data.TFRecordDataset(files)
    if shuffle:
        ds = ds.shuffle(4000, seed=0).repeat()
    def parse(s):
        p = tf.io.parse_example(s, spec)
        return {"num": p["num"], "cat": p["cat"]}, p["label"]
    return ds.batch(batch, drop_remainder=shuffle).map(parse)
model = build(units=32)
model.compile(optimizer=keras.optimizers.SGD(lr),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
steps = examples // batch
model.fit(read("data/train-*.tfrecord", True), steps_per_epoch=steps, epochs=1, verbose=0)
loss, acc = model.evaluate(read("data/eval.tfrecord", False), verbose=0)
print(json.dumps({"accuracy": acc, "eval_loss": loss}))
"""


def tfplan(cwd: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TFPLAN_CONF": str(REPO / "conf")}
    return subprocess.run(
        [sys.executable, "-m", "tfplan", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def default_lr(algo: str) -> float:
    import yaml

    return float(yaml.safe_load((REPO / "conf" / "algo" / f"{algo}.yaml").read_text())["lr"])


def run_algo(project: Path, algo: str, examples: int) -> dict[str, float]:
    steps = math.ceil(examples / BATCH / minibatches_per_step(algo))
    ws = project / "runs" / algo
    ws.mkdir(parents=True)
    args = [
        "apply",
        "--auto-approve",
        f"experiment.id={algo}",
        f"cluster.port_base={free_port_base()}",
        f"cluster.workdir={ws}/work",
        f"cluster.output_dir={ws}/out",
        f"algo={algo}",
        *topology(algo),
        "model._target_=tabular.models.build",
        "model.units=32",
        "data=tfrecord",
        "data.train=data/train-*.tfrecord",
        "data.eval=data/eval.tfrecord",
        f"data.batch_size={BATCH}",
        f"trainer.max_steps={steps}",
        f"trainer.checkpoint_steps={steps}",
        "trainer.log_steps=1000",
    ]
    try:
        proc = tfplan(project, *args)
        if proc.returncode != 0:
            raise RuntimeError(f"{algo}: {proc.stdout[-2000:]}\n{proc.stderr[-1000:]}")
        result = json.loads((ws / "out" / "result.json").read_text())
    finally:
        kill_groups(recorded_groups(project))
    return {
        "accuracy": float(result["accuracy"]),
        "eval_loss": float(result["eval_loss"]),
        "wall": float(result["wall_time_secs"]),
        "steps": float(result["global_step"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=64_000)
    parser.add_argument("--only", default="", help="algorithms, comma-separated (default: all)")
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_user_model.md"))
    args = parser.parse_args()
    algos = [a for a in ALGORITHMS if not args.only or a in args.only.split(",")]
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-user-model-") as tmp:
        project = Path(tmp) / "tabular"
        shutil.copytree(REPO / "examples" / "tabular", project)
        env = {"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"}
        subprocess.run(
            [sys.executable, "make_data.py", "data"], cwd=project, env=env, check=True, timeout=600
        )
        lr = default_lr("hogwild")
        t0 = time.monotonic()
        fit = subprocess.run(
            [sys.executable, "-c", FIT, str(args.examples), str(BATCH), str(lr)],
            cwd=project,
            capture_output=True,
            text=True,
            check=True,
            timeout=900,
        )
        fit_wall = time.monotonic() - t0
        single = json.loads(fit.stdout.strip().splitlines()[-1])
        print(f"keras fit: accuracy {single['accuracy']:.4f}", flush=True)
        rows = {}
        for algo in algos:
            rows[algo] = run_algo(project, algo, args.examples)
            print(f"{algo}: accuracy {rows[algo]['accuracy']:.4f}", flush=True)
    load_end = os.getloadavg()
    base = single["accuracy"]
    lines = [
        "# Benchmark: your model through every algorithm",
        "",
        f"`.venv/bin/python bench/bench_user_model.py --examples {args.examples}` on "
        f"{platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. "
        "examples/tabular (a Keras model with named inputs and an embedding; 4 TFRecord shards of "
        "4,000 examples; 1,000 held out in eval.tfrecord), batch "
        f"{BATCH}, {args.examples:,} training examples seen in all by every run. One process: "
        f"`model.fit` with SGD at lr {lr:g} (hogwild's default). Each algorithm: `tfplan apply` "
        "on the embedded local cluster with the algorithm's shipped defaults. Load average "
        f"{load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end.",
        "",
        "| run | held-out accuracy | vs one process (points) | within 2 points | training s |",
        "|---|---|---|---|---|",
        f"| one process, Keras fit | {base:.4f} | | | {fit_wall:.1f} (whole process) |",
    ]
    for algo, row in rows.items():
        delta = 100 * (row["accuracy"] - base)
        ok = "yes" if delta >= -TARGET_POINTS else "NO"
        lines.append(
            f"| {algo} | {row['accuracy']:.4f} | {delta:+.1f} | {ok} | {row['wall']:.1f} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
