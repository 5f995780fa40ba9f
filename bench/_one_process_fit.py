"""The one-process anchor of bench_embeddings.py: examples/wide_deep's model trained with Keras'
own ``fit`` in this one process, as a user without a cluster would, on the same records, batch
and learning rate as the cluster runs.

    python bench/_one_process_fit.py PROJECT ROWS STEPS BATCH LR

Prints one JSON line: ``{"examples_per_sec": ...}`` over ``STEPS`` steps after a warm-up epoch
of 20 (the graph traced, the optimizer's variables made).
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

WARMUP = 20


def main(project: str, rows: int, steps: int, batch: int, lr: float) -> None:
    sys.path.insert(0, project)
    from wide_deep.models import build

    spec = {
        "item": tf.io.FixedLenFeature([], tf.int64),
        "dense": tf.io.FixedLenFeature([8], tf.float32),
        "clicked": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        got = tf.io.parse_single_example(record, spec)
        return {"item": got["item"], "dense": got["dense"]}, tf.cast(got["clicked"], tf.float32)

    files = sorted(glob.glob(os.path.join(project, "data", "train-*.tfrecord")))
    data = tf.data.TFRecordDataset(files).map(parse).repeat().batch(batch).prefetch(2)
    model = build(vocab=rows)
    model.compile(
        optimizer=keras.optimizers.SGD(lr),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    model.fit(data, steps_per_epoch=WARMUP, epochs=1, verbose=0)
    began = time.perf_counter()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
    print(json.dumps({"examples_per_sec": steps * batch / (time.perf_counter() - began)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
