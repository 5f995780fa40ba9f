"""The model: numeric features and an embedded category, one hidden layer, class logits."""

import keras


def build(units=32, classes=3, vocab=10, embed=4):
    num = keras.Input((4,), name="num")
    cat = keras.Input((), dtype="int64", name="cat")
    embedded = keras.layers.Embedding(vocab, embed, name="cat_embedding")(cat)
    h = keras.layers.Concatenate()([num, embedded])
    h = keras.layers.Dense(units, activation="relu", name="hidden")(h)
    # a second table over the category: a bias per category and class, added to the logits
    # (the "wide" part of a wide-and-deep model)
    wide = keras.layers.Embedding(vocab, classes, name="cat_bias")(cat)
    logits = keras.layers.Add(name="scores")([keras.layers.Dense(classes, name="logits")(h), wide])
    return keras.Model({"num": num, "cat": cat}, logits)


def regressor(units=16, features=("x1", "x2", "x3")):
    """A regression model over scalar columns (a CSV's), one output."""
    inputs = {name: keras.Input((), name=name) for name in features}
    columns = [keras.layers.Reshape((1,))(inputs[name]) for name in features]
    h = keras.layers.Dense(units, activation="relu", name="hidden")(
        keras.layers.Concatenate()(columns)
    )
    return keras.Model(inputs, keras.layers.Dense(1, name="prediction")(h))
