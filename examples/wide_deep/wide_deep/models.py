"""Wide and deep (Cheng et al., 2016): a linear model over a sparse id plus an MLP over its
embedding and the dense features; one logit (click or not)."""

import keras


def build(vocab=50_000, embed=16, units=64):
    item = keras.Input((), dtype="int64", name="item")
    dense = keras.Input((8,), name="dense")
    # deep: the large table (vocab x embed floats: 3.2 MB by default), worth splitting over ps
    embedded = keras.layers.Embedding(vocab, embed, name="item_embedding")(item)
    deep = keras.layers.Concatenate()([embedded, dense])
    deep = keras.layers.Dense(units, activation="relu", name="deep_1")(deep)
    deep = keras.layers.Dense(units // 2, activation="relu", name="deep_2")(deep)
    # wide: one weight per id (a one-column embedding is a sparse linear term)
    wide = keras.layers.Embedding(vocab, 1, name="item_wide")(item)
    logit = keras.layers.Add()([keras.layers.Dense(1, name="deep_logit")(deep), wide])
    return keras.Model({"item": item, "dense": dense}, logit)
