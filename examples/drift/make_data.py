"""Write a drifting stream of item ids as tf.Example records, in time order.

``python make_data.py OUT_DIR [--examples N] [--parts P] [--live L] [--seed S]`` writes
``part-00000.tfrecord`` ... (P parts of N/P examples, the stream's time order), ``eval.tfrecord``
(N/P/4 examples drawn apart from the last part's distribution) and ``stream.json`` (the counts).

The ids are not a fixed range. Think of a global sequence of ids 0, 1, 2, ...: at time t (0 to 1
over the stream) the live ids are the window of L consecutive sequence numbers from
``floor(t * T * L)`` (``--turnover T``, 65 by default), so every id is live for 1/T of the stream.
Each sequence number has a fixed popularity rank in 0 .. L-1, ``rank = perm[seq % L]`` (a fixed
permutation): any L consecutive numbers hold every rank once, so the live ids always have one id
per rank, drawn Zipf-like (exponent 1.1) by rank. An id keeps its rank while it is live; when the
window passes it, it stops appearing and the new id that enters holds that rank from then on.
Most of each window's tail is never drawn: at the defaults about 10 L distinct ids appear.

Each record: ``item`` (the raw id: a bijection of the sequence number onto [0, 2^63), large and
scattered, never usable as a row index), ``count0`` (log1p of a log-normal count, one float) and
``clicked`` (0/1), Bernoulli(sigmoid(bias[seq] + 0.5 z - 1)): ``bias`` a hidden normal(0, 1.5) per
sequence number, ``z`` the normal draw behind the count. A model with a row per id can learn its
bias; one whose ids share rows cannot.

``--vocab-out FILE --vocab-parts K [--vocab-size V]`` also writes the distinct ids of the first K
parts, most frequent first, at most V (default L), one a line: the fixed vocabulary of
drift.models.build_vocab.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

EXPONENT = 1.1  # Zipf exponent over the ranks
# the window moves TURNOVER * L sequence numbers over the stream: at the defaults about 10 L
# distinct ids appear (the Zipf tail of each window is mostly never drawn)
TURNOVER = 65
INTERCEPT = -1.0
COUNT_WEIGHT = 0.5
MASK = np.uint64((1 << 63) - 1)


def raw_ids(seq):
    """The item id of each sequence number: splitmix64's finaliser on 63 bits (odd multipliers
    mod 2^63 and xor-shifts, each a bijection), so distinct numbers never share an id."""
    x = (np.asarray(seq, np.uint64) + np.uint64(0x2545F4914F6CDD1D)) & MASK
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & MASK
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & MASK
    return (x ^ (x >> np.uint64(31))).astype(np.int64)


def draw(t, live, rng, turnover=TURNOVER):
    """(seq [n] int64, count0 [n] float32, clicked [n] int64) at times ``t`` in [0, 1]."""
    # the same rule for every split, size and seed; bias[seq] the same for every L too
    rank_of = np.random.RandomState(0).permutation(live)  # the rank of residue seq % L
    bias = np.random.RandomState(1).normal(0.0, 1.5, size=(turnover + 1) * live)
    p = np.arange(1, live + 1, dtype=np.float64) ** -EXPONENT
    rank = rng.choice(live, size=len(t), p=p / p.sum())
    offset = np.floor(t * turnover * live).astype(np.int64)
    residue = np.argsort(rank_of)[rank]  # the residue holding each rank
    seq = offset + (residue - offset) % live  # the one live number with that residue
    z = rng.normal(size=len(t))
    count0 = np.log1p(np.floor(np.exp(1.5 + z))).astype(np.float32)
    logit = bias[seq] + COUNT_WEIGHT * z + INTERCEPT
    clicked = (rng.uniform(size=len(t)) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return seq, count0, clicked


def write(path, items, count0, clicked):
    # one Example filled in place per record: far faster than building Features each time
    example = tf.train.Example()
    feature = example.features.feature
    fields = [
        feature["item"].int64_list.value,
        feature["count0"].float_list.value,
        feature["clicked"].int64_list.value,
    ]
    for value in fields:
        value.append(0)
    with tf.io.TFRecordWriter(path) as writer:
        for row in zip(items.tolist(), count0.tolist(), clicked.tolist(), strict=True):
            for value, x in zip(fields, row, strict=True):
                value[0] = x
            writer.write(example.SerializeToString(deterministic=True))  # keys sorted


def vocabulary(items, size):
    """The distinct ``items``, most frequent first (ties: first seen first), at most ``size``."""
    ids, first, counts = np.unique(items, return_index=True, return_counts=True)
    order = np.lexsort((first, -counts))
    return ids[order][:size]


def main(
    out,
    n=60_000,
    parts=6,
    live=2000,
    seed=1,
    turnover=TURNOVER,
    vocab_out=None,
    vocab_parts=1,
    vocab_size=None,
    eval_span=None,
):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng([seed, 0])
    seq, count0, clicked = draw(np.arange(n) / n, live, rng, turnover)
    items = raw_ids(seq)
    bounds = [k * n // parts for k in range(parts + 1)]
    _, first = np.unique(seq, return_index=True)
    new = np.bincount(np.searchsorted(bounds, first, side="right") - 1, minlength=parts)
    for k in range(parts):
        lo, hi = bounds[k], bounds[k + 1]
        write(
            os.path.join(out, f"part-{k:05d}.tfrecord"), items[lo:hi], count0[lo:hi], clicked[lo:hi]
        )

    n_eval = n // parts // 4
    span = eval_span or 1 / parts  # the held-out clicks: drawn as the stream's last span is
    t_eval = np.sort(np.random.default_rng([seed, 1]).uniform(1 - span, 1, n_eval))
    e_seq, e_count0, e_clicked = draw(t_eval, live, np.random.default_rng([seed, 2]), turnover)
    write(os.path.join(out, "eval.tfrecord"), raw_ids(e_seq), e_count0, e_clicked)
    unseen = ~np.isin(e_seq, seq)
    stats = {
        "examples": n,
        "parts": parts,
        "live": live,
        "seed": seed,
        "turnover": turnover,
        "examples_per_part": np.diff(bounds).tolist(),
        "distinct_ids_per_part": [
            len(np.unique(seq[bounds[k] : bounds[k + 1]])) for k in range(parts)
        ],
        "new_ids_per_part": new.tolist(),
        "distinct_ids": len(first),
        "live_over_stream": (turnover + 1) * live,  # sequence numbers live at some time
        "click_rate": round(float(clicked.mean()), 4),
        "eval": {
            "examples": n_eval,
            "distinct_ids": len(np.unique(e_seq)),
            "ids_unseen_in_training": len(np.unique(e_seq[unseen])),
            "examples_with_unseen_id": round(float(unseen.mean()), 4),
        },
    }
    if vocab_out:
        vocab = vocabulary(items[: bounds[vocab_parts]], vocab_size or live)
        with open(vocab_out, "w") as f:
            f.writelines(f"{i}\n" for i in vocab.tolist())
        stats["vocab"] = {
            "parts": vocab_parts,
            "ids": len(vocab),
            "eval_examples_covered": round(float(np.isin(raw_ids(e_seq), vocab).mean()), 4),
        }
    with open(os.path.join(out, "stream.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(
        f"{out}: {n:,} examples in {parts} part(s), {n_eval:,} held out; {len(first):,} distinct "
        f"ids (new per part: {', '.join(map(str, new))}); click rate {clicked.mean():.3f}"
    )
    if vocab_out:
        print(f"{vocab_out}: {stats['vocab']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--examples", type=int, default=60_000)
    parser.add_argument("--parts", type=int, default=6)
    parser.add_argument("--live", type=int, default=2000, help="ids live at any time")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--turnover", type=int, default=TURNOVER, help="the window moves T x L over the stream"
    )
    parser.add_argument("--vocab-out", help="write a fixed vocabulary here, one id a line")
    parser.add_argument("--vocab-parts", type=int, default=1, help="from the first K parts")
    parser.add_argument("--vocab-size", type=int, help="at most V ids (default: --live)")
    parser.add_argument(
        "--eval-span",
        type=float,
        help="the held-out clicks are drawn as the last F of the stream is (default: 1/parts)",
    )
    args = parser.parse_args()
    main(
        args.out,
        args.examples,
        args.parts,
        args.live,
        args.seed,
        args.turnover,
        args.vocab_out,
        args.vocab_parts,
        args.vocab_size,
        args.eval_span,
    )
