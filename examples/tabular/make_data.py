"""Write the training shards and the evaluation file as tf.Example records.

python make_data.py OUT_DIR [SHARDS]
"""

import os
import sys

import numpy as np
import tensorflow as tf

from tabular.data import examples


def write(path, features, label):
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(len(label)):
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "num": tf.train.Feature(
                            float_list=tf.train.FloatList(value=features["num"][i])
                        ),
                        "cat": tf.train.Feature(
                            int64_list=tf.train.Int64List(value=[features["cat"][i]])
                        ),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label[i]])),
                    }
                )
            )
            writer.write(example.SerializeToString())


def main(out, shards=4):
    os.makedirs(out, exist_ok=True)
    features, label = examples(4000, 1)
    for k in range(shards):
        part = {name: values[k::shards] for name, values in features.items()}
        write(os.path.join(out, f"train-{k:05d}-of-{shards:05d}.tfrecord"), part, label[k::shards])
    write(os.path.join(out, "eval.tfrecord"), *examples(1000, 2))
    write_csv(os.path.join(out, "table.csv"))


def write_csv(path, n=3000, seed=3):
    """A regression table: y = 2 x1 - x2 + 0.5 x3 + noise, with a header."""
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(n, 3))
    y = x @ np.array([2.0, -1.0, 0.5]) + rng.normal(scale=0.1, size=n)
    with open(path, "w") as f:
        f.write("x1,x2,x3,y\n")
        for row, target in zip(x, y, strict=True):
            f.write(",".join(f"{v:.5f}" for v in row) + f",{target:.5f}\n")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
