"""Write Criteo-like click logs as tf.Example records.

``python make_data.py OUT_DIR [EXAMPLES] [--shards N] [--vocab-scale S]`` writes
``train-00000-of-0000N.tfrecord`` ... (EXAMPLES records in all, 20,000 by default) and
``eval.tfrecord`` (EXAMPLES/5 records, drawn apart).

Each example, as in the Criteo display-ads logs: ``i1`` ... ``i13`` (counts, log-normal, written
as log1p(count), one float each), ``c1`` ... ``c26`` (one id each, Zipf-distributed over
vocabularies of 10^2 to 10^7 rows, ctr/vocab.py, times S; the ranks are scattered over the
table as hashed ids are) and ``clicked`` (0/1, about 28 % of them) from a fixed rule: a
per-id bias on four of the fields (a hash of the id, so no table of 10^7 biases is needed) plus
a linear term over the dense features.
"""

import argparse
import os

import numpy as np
import tensorflow as tf

from ctr.vocab import vocabularies

DENSE = 13
SCATTER = 2_654_435_761  # a prime above every vocabulary: rank -> id is a permutation
BIASED = (1, 6, 13, 20)  # c2, c7, c14, c21 carry a per-id bias
INTERCEPT = -1.0  # puts the click rate near 28 % (20 % at --vocab-scale 0.001)


def id_bias(ids, field):
    """A fixed bias in [-1.5, 1.5) per (field, id): a cheap multiplicative hash."""
    return 3.0 * (((ids + 7919 * field) * SCATTER) % 1000 / 1000 - 0.5)


def examples(n, seed, scale=1.0):
    """(dense [n, 13] float32, ids [n, 26] int64, clicked [n] int64)."""
    rule = np.random.RandomState(0)  # the same rule for every split and size
    mu, sigma = rule.uniform(0, 4, DENSE), rule.uniform(0.8, 1.5, DENSE)
    w = rule.normal(scale=0.4, size=DENSE)
    rng = np.random.RandomState(seed)
    counts = np.floor(np.exp(rng.normal(mu, sigma, size=(n, DENSE))))
    dense = np.log1p(counts).astype(np.float32)
    vocab = vocabularies(scale)
    ids = np.empty((n, len(vocab)), np.int64)
    for k, rows in enumerate(vocab):
        exponent = 1.5 - 0.3 * k / (len(vocab) - 1)  # the large fields have the longer tails
        rank = np.minimum(rng.zipf(exponent, size=n) - 1, rows - 1)
        ids[:, k] = rank * SCATTER % rows
    logit = INTERCEPT + ((dense - mu) / sigma) @ w
    for k in BIASED:
        logit += id_bias(ids[:, k], k)
    clicked = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return dense, ids, clicked


def write(path, dense, ids, clicked):
    # one Example filled in place per record: far faster than building 40 Features each time
    example = tf.train.Example()
    feature = example.features.feature
    floats = [feature[f"i{j + 1}"].float_list.value for j in range(DENSE)]
    ints = [feature[f"c{k + 1}"].int64_list.value for k in range(ids.shape[1])]
    for value in floats + ints:
        value.append(0)
    label = feature["clicked"].int64_list.value
    label.append(0)
    dense, ids, clicked = dense.tolist(), ids.tolist(), clicked.tolist()
    with tf.io.TFRecordWriter(path) as writer:
        for d, c, y in zip(dense, ids, clicked, strict=True):
            for value, x in zip(floats, d, strict=True):
                value[0] = x
            for value, x in zip(ints, c, strict=True):
                value[0] = x
            label[0] = y
            writer.write(example.SerializeToString(deterministic=True))  # keys sorted


def main(out, n=20_000, shards=4, scale=1.0):
    os.makedirs(out, exist_ok=True)
    dense, ids, clicked = examples(n, 1, scale)
    for k in range(shards):
        write(
            os.path.join(out, f"train-{k:05d}-of-{shards:05d}.tfrecord"),
            dense[k::shards],
            ids[k::shards],
            clicked[k::shards],
        )
    write(os.path.join(out, "eval.tfrecord"), *examples(n // 5, 2, scale))
    print(
        f"{out}: {n:,} training examples in {shards} shard(s), {n // 5:,} held out; "
        f"click rate {clicked.mean():.3f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("examples", nargs="?", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--vocab-scale", type=float, default=1.0)
    args = parser.parse_args()
    main(args.out, args.examples, args.shards, args.vocab_scale)
