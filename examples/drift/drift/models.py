"""Three ways to give a drifting id stream its embeddings: the same click model (an embedding of
``item`` beside ``count0``, an MLP, one logit) with the ids mapped to rows

- by tfplan itself (:func:`build`: the raw int64 ids go straight into the Embedding, whose
  ``input_dim`` is the table's capacity; tfplan's dynamic tables map ids to rows),
- by a hash (:func:`build_hashed`: ``Hashing(num_bins=rows)``, ids share rows at random),
- by a fixed vocabulary (:func:`build_vocab`: ``IntegerLookup``, every other id on one row).

Plain Keras 3; the inputs are named after the records' features, so tfplan feeds them by name
(``clicked`` is the label, ``model.loss=binary_crossentropy``: the output is a logit).
"""

import keras


def _inputs():
    return {
        "item": keras.Input((), dtype="int64", name="item"),
        "count0": keras.Input((), name="count0"),
    }


def _click_model(inputs, rows_of_item, rows, embed, units, name):
    """The embedding of ``rows_of_item`` (row indices below ``rows``) beside ``count0``, an MLP
    of ``units``, and one logit over the MLP's output and the embedding itself (wide and deep:
    the embedding's straight path to the logit is what learns each id's own click rate)."""
    embedded = keras.layers.Embedding(rows, embed, name="item_embedding")(rows_of_item)
    count0 = keras.layers.Reshape((1,), name="count0_column")(inputs["count0"])
    x = keras.layers.Concatenate(name="features")([embedded, count0])
    for layer, size in enumerate(units):
        x = keras.layers.Dense(size, activation="relu", name=f"deep_{layer + 1}")(x)
    wide_and_deep = keras.layers.Concatenate(name="wide_and_deep")([embedded, x])
    logit = keras.layers.Dense(1, name="logit")(wide_and_deep)
    return keras.Model(inputs, logit, name=name)


def build(rows=2000, embed=8, units=(32,)):
    """The raw ids straight into ``Embedding(rows, embed)``: a dynamic table of ``rows`` rows,
    tfplan mapping each id to its row. Fed raw ids without that mapping, it is out of range."""
    inputs = _inputs()
    return _click_model(inputs, inputs["item"], rows, embed, units, "drift_dynamic")


def build_hashed(rows=2000, embed=8, units=(32,)):
    """``Hashing(num_bins=rows)`` in front of the table: any id has a row, ids share them."""
    inputs = _inputs()
    bucket = keras.layers.Hashing(num_bins=rows, name="item_hash")(inputs["item"])
    return _click_model(inputs, bucket, rows, embed, units, "drift_hashed")


def build_vocab(vocab=(), embed=8, units=(32,), vocab_file=None):
    """``IntegerLookup`` of a fixed vocabulary (``vocab``, or ``vocab_file``: one id a line, as
    ``make_data.py --vocab-out`` writes) in front of a table of len(vocab) + 1 rows; row 0 is
    every id outside it."""
    if vocab_file:
        with open(vocab_file) as f:
            vocab = [int(line) for line in f if line.strip()]
    vocab = [int(i) for i in vocab]
    if not vocab:
        raise ValueError("build_vocab: give vocab (a list of ids) or vocab_file")
    inputs = _inputs()
    lookup = keras.layers.IntegerLookup(vocabulary=vocab, num_oov_indices=1, name="item_lookup")
    return _click_model(inputs, lookup(inputs["item"]), len(vocab) + 1, embed, units, "drift_vocab")
