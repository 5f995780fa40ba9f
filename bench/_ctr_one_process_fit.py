"""The one-process anchor of bench_table_rules.py: examples/ctr's model trained with Keras' own
``fit`` in this one process, as a user without a cluster would, on the same records, batch,
optimizer (SGD) and learning rate as the cluster runs, then scored on the same held-out file.

    python bench/_ctr_one_process_fit.py PROJECT VOCAB_SCALE STEPS BATCH LR

Prints one JSON line: ``{"accuracy": ..., "eval_loss": ..., "examples_per_sec": ...}``
(accuracy: the logit's sign against the label; eval_loss: the mean log loss).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

DENSE, FIELDS = 13, 26


def dataset(files: list[str], batch: int, repeat: bool) -> tf.data.Dataset:
    spec = {f"i{j + 1}": tf.io.FixedLenFeature([], tf.float32) for j in range(DENSE)}
    spec |= {f"c{k + 1}": tf.io.FixedLenFeature([], tf.int64) for k in range(FIELDS)}
    spec["clicked"] = tf.io.FixedLenFeature([], tf.int64)

    def parse(records: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        got = tf.io.parse_example(records, spec)
        label = tf.cast(got.pop("clicked"), tf.float32)
        return got, label

    data = tf.data.TFRecordDataset(files)
    if repeat:
        data = data.repeat()
    return data.batch(batch).map(parse).prefetch(2)


def main(project: str, scale: float, steps: int, batch: int, lr: float) -> None:
    sys.path.insert(0, project)
    from ctr.models import build

    train = sorted(glob.glob(os.path.join(project, "data", "train-*.tfrecord")))
    held_out = [os.path.join(project, "data", "eval.tfrecord")]
    model = build(vocab_scale=scale)
    model.compile(
        optimizer=keras.optimizers.SGD(lr),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.BinaryAccuracy(threshold=0.0)],
    )
    began = time.perf_counter()
    model.fit(dataset(train, batch, repeat=True), steps_per_epoch=steps, epochs=1, verbose=0)
    rate = steps * batch / (time.perf_counter() - began)
    loss, accuracy = model.evaluate(dataset(held_out, 1000, repeat=False), verbose=0)
    print(json.dumps({"accuracy": accuracy, "eval_loss": loss, "examples_per_sec": rate}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
