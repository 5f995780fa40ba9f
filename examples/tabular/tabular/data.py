"""The same examples as make_data.py writes, generated in memory: a tf.data factory."""

import numpy as np
import tensorflow as tf

CLASSES, VOCAB = 3, 10


def examples(n, seed):
    """``n`` examples: the label is the best-scoring class of a fixed linear rule."""
    rule = np.random.RandomState(0)
    w_num, w_cat = rule.normal(size=(4, CLASSES)), rule.normal(size=(VOCAB, CLASSES)) * 2
    rng = np.random.RandomState(seed)
    num = rng.normal(size=(n, 4)).astype(np.float32)
    cat = rng.randint(0, VOCAB, size=n).astype(np.int64)
    label = np.argmax(num @ w_num + w_cat[cat], axis=1).astype(np.int64)
    return {"num": num, "cat": cat}, label


def make(split, shard_index, num_shards, batch_size, seed, size=4000):
    features, label = examples(size if split == "train" else 1000, 1 if split == "train" else 2)
    ds = tf.data.Dataset.from_tensor_slices((features, label))
    if split == "train":
        ds = ds.shard(num_shards, shard_index).shuffle(1000, seed=seed).repeat()
    return ds.batch(batch_size, drop_remainder=split == "train")
