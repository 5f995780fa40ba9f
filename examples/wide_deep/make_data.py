"""Write click logs as tf.Example records: ``python make_data.py OUT_DIR [EXAMPLES]``.

Each example: ``item`` (an id below 50,000, Zipf-distributed as real catalogues are), ``dense`` (8
floats) and ``clicked`` (0/1), from a fixed rule: a per-item bias plus a linear term.
"""

import os
import sys

import numpy as np
import tensorflow as tf

VOCAB = 50_000


def examples(n, seed):
    rule = np.random.RandomState(0)
    item_bias, w = rule.normal(scale=1.5, size=VOCAB), rule.normal(size=8)
    rng = np.random.RandomState(seed)
    item = np.minimum(rng.zipf(1.3, size=n) - 1, VOCAB - 1).astype(np.int64)
    dense = rng.normal(size=(n, 8)).astype(np.float32)
    logit = item_bias[item] + dense @ w
    clicked = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return item, dense, clicked


def write(path, item, dense, clicked):
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(len(item)):
            feature = {
                "item": tf.train.Feature(int64_list=tf.train.Int64List(value=[item[i]])),
                "dense": tf.train.Feature(float_list=tf.train.FloatList(value=dense[i])),
                "clicked": tf.train.Feature(int64_list=tf.train.Int64List(value=[clicked[i]])),
            }
            writer.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )


def main(out, n=20_000, shards=4):
    os.makedirs(out, exist_ok=True)
    item, dense, clicked = examples(n, 1)
    for k in range(shards):
        write(
            os.path.join(out, f"train-{k:05d}-of-{shards:05d}.tfrecord"),
            item[k::shards],
            dense[k::shards],
            clicked[k::shards],
        )
    write(os.path.join(out, "eval.tfrecord"), *examples(n // 5, 2))


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
