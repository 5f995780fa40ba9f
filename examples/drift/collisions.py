"""How many ids ``keras.layers.Hashing(num_bins=R)`` puts in a bucket with another id.

``python collisions.py OUT_DIR --rows R`` reads the item ids of ``OUT_DIR/part-*.tfrecord`` (what
make_data.py writes) and prints, over the whole stream and within its last part, the fraction
of the distinct ids that share a bucket with another id (and of the examples whose id does).
``hashed_collisions(ids, rows)`` is the fraction alone.
"""

import argparse
import glob
import os

import keras
import numpy as np
import tensorflow as tf


def buckets(ids, rows):
    """The bucket of each id, as the Hashing layer gives it (FarmHash64 of the id's decimal
    string: ``tf.strings.to_hash_bucket_fast(tf.as_string(ids), rows)``)."""
    return keras.ops.convert_to_numpy(keras.layers.Hashing(num_bins=rows)(np.asarray(ids)))


def _shared(ids, rows):
    """(distinct ids, whether each shares its bucket with another id)."""
    distinct = np.unique(np.asarray(ids, np.int64))
    bucket = buckets(distinct, rows)
    return distinct, np.bincount(bucket, minlength=rows)[bucket] > 1


def hashed_collisions(ids: np.ndarray, rows: int) -> float:
    """The fraction of the distinct ``ids`` that share their Hashing(num_bins=rows) bucket."""
    return float(_shared(ids, rows)[1].mean())


def read_ids(path):
    records = tf.data.TFRecordDataset(path).batch(8192)
    spec = {"item": tf.io.FixedLenFeature([], tf.int64)}
    return np.concatenate([tf.io.parse_example(r, spec)["item"].numpy() for r in records])


def main(out, rows):
    parts = [read_ids(p) for p in sorted(glob.glob(os.path.join(out, "part-*.tfrecord")))]
    for what, ids in (("whole stream", np.concatenate(parts)), ("last part", parts[-1])):
        distinct, shared = _shared(ids, rows)
        in_examples = np.isin(ids, distinct[shared]).mean()
        print(
            f"{what}: {len(distinct):,} distinct ids in {rows:,} buckets; {shared.mean():.2%} of "
            f"them share a bucket ({in_examples:.2%} of the examples)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, required=True)
    args = parser.parse_args()
    main(args.out, args.rows)
