"""DCN-v2 (Wang et al., 2021), the parallel form: an embedding per id field, then cross layers
``x_{l+1} = x0 * (W x_l + b) + x_l`` beside an MLP over the same input; one logit (click or
not). Plain Keras 3: the cross layers are Dense, Multiply and Add layers."""

import keras

from ctr.vocab import vocabularies

DENSE = 13  # i1 ... i13


def build(embed=16, cross_layers=2, units=(256, 128), vocab_scale=1.0):
    vocab = vocabularies(vocab_scale)
    ids = {f"c{k + 1}": keras.Input((), dtype="int64", name=f"c{k + 1}") for k in range(len(vocab))}
    counts = {f"i{j + 1}": keras.Input((), name=f"i{j + 1}") for j in range(DENSE)}
    # one table per field (vocab x embed floats: 640 MB for 10^7 x 16), plain Embedding layers:
    # tfplan reads only the batch's rows of each, from the ps it lives on
    embedded = [
        keras.layers.Embedding(rows, embed, name=f"{name}_embedding")(ids[name])
        for name, rows in zip(ids, vocab, strict=True)
    ]
    # the 13 scalar features side by side: [batch, 13]
    columns = [keras.layers.Reshape((1,), name=f"{name}_column")(x) for name, x in counts.items()]
    dense = keras.layers.Concatenate(name="dense_features")(columns)
    x0 = keras.layers.Concatenate(name="features")([*embedded, dense])
    width = x0.shape[-1]

    x = x0
    for layer in range(cross_layers):
        projected = keras.layers.Dense(width, name=f"cross_{layer + 1}")(x)
        crossed = keras.layers.Multiply(name=f"cross_{layer + 1}_x0")([x0, projected])
        x = keras.layers.Add(name=f"cross_{layer + 1}_residual")([crossed, x])

    deep = x0
    for layer, size in enumerate(units):
        deep = keras.layers.Dense(size, activation="relu", name=f"deep_{layer + 1}")(deep)

    both = keras.layers.Concatenate(name="cross_and_deep")([x, deep])
    logit = keras.layers.Dense(1, name="logit")(both)
    return keras.Model({**ids, **counts}, logit, name="dcn_v2")
