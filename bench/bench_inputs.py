"""Benchmark the training input and model paths of one replica, side by side, in one process each.

    .venv/bin/python bench/bench_inputs.py [--rounds 5] [--secs 3] [--out docs/bench_inputs.md]

One training loop (SGD on an MLP 784-128-10, batch 100, one thread, synthetic 28x28 data: the
setting of bench_training.py's one-process ceiling) in four variants, each in its own process,
alternating round by round:
- ``feed``: the built-in model fed batch by batch through ``feed_dict`` (the recipes' input path
  before tf.data: ``recipes.datasets.batches``);
- ``tf.data``: the built-in model reading ``recipes.inputs.train_dataset`` through an iterator
  (the recipes' input path now, in-memory rows through ``numpy_function``);
- ``tf.data + keras``: the same data into the same MLP written as a Keras model
  (``recipes.keras_model.KerasModel``, the path of a user's model);
- ``tfrecord``: the same examples read from 4 TFRecord shards (``data=tfrecord``) into the
  built-in model: the streaming path.
Reports examples/s (median of the rounds) and each variant's ratio to ``feed``; writes
docs/bench_inputs.md. ``--rounds 1 --secs 0.5`` is the quickest run to the end.
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

REPO = Path(__file__).resolve().parent.parent

LOOP = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, sys.argv[1])
import numpy as np, tensorflow as tf
v1 = tf.compat.v1
v1.disable_eager_execution()
from recipes.config import DataConf, ModelConf, RunConfig, AlgoConf, TrainerConf, data_conf
from recipes.datasets import load, batches
variant, secs, shards = sys.argv[2], float(sys.argv[3]), sys.argv[4]
BATCH = 100
mem = DataConf(name="synthetic", image_size=28, synthetic_examples=6000, batch_size=BATCH,
               shuffle_buffer=6000)
model_conf = ModelConf(name="mlp", hidden=(128,))
if variant == "tfrecord":
    data = data_conf({"name": "tfrecord", "train": [shards + "/*.tfrecord"], "batch_size": BATCH,
                      "label": "label", "shuffle_buffer": 6000})
else:
    data = mem
if variant == "tf.data + keras":
    sys.path.insert(0, shards)
    model_conf = ModelConf(name="keras", target="mlp_model.build", kwargs={})
cfg = RunConfig("/tmp/unused", AlgoConf(), model_conf, data, TrainerConf())
from recipes.workload import Workload
work = Workload.of(cfg)
if variant == "feed":
    ds = load(mem)
    x = v1.placeholder(tf.float32, [None, 784]); y = v1.placeholder(tf.int64, [None])
    it = batches(ds.x_train, ds.y_train, BATCH, 0)
    feed = lambda: dict(zip((x, y), next(it)))
else:
    iterator = v1.data.make_initializable_iterator(work.train_dataset(0, 1, 0))
    x, y = iterator.get_next()
    feed = lambda: None
params = work.model.create_params()
loss = work.loss(params, x, y)
step = v1.train.GradientDescentOptimizer(0.05).minimize(loss)
conf = v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
with v1.Session(config=conf) as s:
    s.run(v1.global_variables_initializer())
    if variant != "feed":
        from recipes.inputs import graph_feeds
        s.run(iterator.initializer, graph_feeds() or None)
    for _ in range(50):
        s.run(step, feed())
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < secs:
        s.run(step, feed()); n += 1
    print(json.dumps(n * BATCH / (time.monotonic() - t0)))
"""

MLP_MODEL = """
import keras

def build():
    return keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
"""

WRITE_SHARDS = r"""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, sys.argv[1])
import tensorflow as tf
from recipes.config import DataConf
from recipes.datasets import load
ds = load(DataConf(name="synthetic", image_size=28, synthetic_examples=6000))
out = sys.argv[2]
for k in range(4):
    with tf.io.TFRecordWriter(os.path.join(out, f"part-{k}.tfrecord")) as w:
        for i in range(k, len(ds.x_train), 4):
            f = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=ds.x_train[i])),
                 "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[ds.y_train[i]]))}
            w.write(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
"""

VARIANTS = ("feed", "tf.data", "tf.data + keras", "tfrecord")


def run_variant(variant: str, secs: float, shards: Path) -> float:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, "-c", LOOP, str(REPO), variant, str(secs), str(shards)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{variant}: {out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--secs", type=float, default=3.0)
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_inputs.md"))
    args = parser.parse_args()
    load_start = os.getloadavg()
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-inputs-") as tmp:
        shards = Path(tmp)
        (shards / "mlp_model.py").write_text(MLP_MODEL)
        subprocess.run(
            [sys.executable, "-c", WRITE_SHARDS, str(REPO), str(shards)], check=True, timeout=600
        )
        for r in range(args.rounds):
            order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                rates[variant].append(run_variant(variant, args.secs, shards))
                print(f"round {r + 1} {variant}: {rates[variant][-1]:.0f} examples/s", flush=True)
    medians = {v: statistics.median(rates[v]) for v in VARIANTS}
    base = medians["feed"]
    load_end = os.getloadavg()
    lines = [
        "# Benchmark: the replica's input and model paths",
        "",
        f"`.venv/bin/python bench/bench_inputs.py --rounds {args.rounds} --secs {args.secs:g}` "
        f"on {platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. One "
        "process per measurement, SGD on an MLP 784-128-10, batch 100, one thread, synthetic "
        "28x28 data; the variants alternate round by round (forward, then reversed). Load "
        f"average at the start {load_start[0]:.1f}, at the end {load_end[0]:.1f}.",
        "",
        "| variant | examples/s (median) | vs feed_dict |",
        "|---|---|---|",
    ]
    for v in VARIANTS:
        lines.append(f"| {v} | {medians[v]:,.0f} | {medians[v] / base:.2f}x |")
    lines += [
        "",
        "Raw (examples/s): "
        + "; ".join(f"{v} " + ", ".join(f"{x:.0f}" for x in rates[v]) for v in VARIANTS),
        "",
        "- `feed`: the built-in model, batches fed through `feed_dict` (the recipes' input path "
        "before tf.data).",
        "- `tf.data`: the built-in model reading `recipes.inputs.train_dataset` through an "
        "iterator (the recipes' path now).",
        "- `tf.data + keras`: the same MLP as a Keras model through `KerasModel` (a user's "
        "model's path).",
        "- `tfrecord`: the same examples from 4 TFRecord shards, streamed and parsed per batch.",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
