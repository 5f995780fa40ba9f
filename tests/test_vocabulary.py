"""The names the recipes understand are listed once (recipes/vocabulary.py), the recipes
implement every one of them, and no other module of tfplan/ or recipes/ keeps a list of its own
(the planner's validation imports the same lists)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from recipes import vocabulary as vocab
from recipes.config import DataConf, ModelConf
from recipes.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
LISTS = {
    "losses": vocab.LOSSES,
    "metrics": vocab.METRICS,
    "optimizers": vocab.OPTIMIZERS,
    "models": vocab.MODELS,
    "data sources": vocab.DATA_SOURCES,
}


@pytest.mark.parametrize("loss", vocab.LOSSES)
def test_every_loss_is_implemented(loss: str) -> None:
    from recipes.objective import Objective

    classes = 1 if loss in vocab.SINGLE_OUTPUT_LOSSES else 3
    outputs = tf.constant(np.random.RandomState(0).rand(4, classes), tf.float32)
    if loss == "categorical_crossentropy":
        labels = tf.one_hot([0, 1, 2, 0], 3)
    elif loss == "sparse_categorical_crossentropy":
        labels = tf.constant([0, 1, 2, 0], tf.int64)
    else:
        labels = tf.constant([0.0, 1.0, 1.0, 0.0])
    # accuracy for the classification losses, the regression metrics for the others
    classify = loss in vocab.CLASSIFICATION_LOSSES
    metrics = tuple(m for m in vocab.METRICS if (m == "accuracy") == classify)
    objective = Objective(loss, metrics=metrics)
    assert np.isfinite(float(objective.loss_of(outputs, labels)))
    values = objective.metric_values(outputs, labels)
    assert (
        metrics
        and set(values) == set(metrics)
        and all(np.isfinite(float(v)) for v in values.values())
    )


def test_an_unknown_loss_is_a_config_error() -> None:
    from recipes.objective import Objective

    with pytest.raises(ConfigError, match="model.loss=hinge"):
        Objective("hinge").loss_of(tf.zeros([2, 1]), tf.zeros([2]))


@pytest.mark.parametrize("name", vocab.OPTIMIZERS)
def test_every_optimizer_has_a_tf1_and_a_tf2_update_rule(name: str) -> None:
    from recipes.algorithms.base import make_optimizer
    from recipes.strategies.optimizer import Optimizer

    assert make_optimizer(name, 0.1) is not None
    assert Optimizer(name, 0.1).name == name
    assert set(Optimizer.SLOTS) == set(vocab.OPTIMIZERS)
    assert set(vocab.PS_OPTIMIZERS) <= set(vocab.OPTIMIZERS)


@pytest.mark.parametrize("name", vocab.BUILTIN_MODELS)
def test_every_builtin_model_is_implemented(name: str) -> None:
    from recipes.models import Model

    model = Model(ModelConf(name=name, hidden=(4,), conv_channels=(2,), dense=4), 8, 1, 10)
    assert model.param_shapes()


@pytest.mark.parametrize("name", vocab.DATA_SOURCES)
def test_every_data_source_is_implemented(name: str) -> None:
    from recipes.inputs import source_kind

    target = "my_pkg.data.make" if name == vocab.FACTORY_SOURCE else None
    kind = source_kind(DataConf(name=name, target=target))
    expected = {vocab.FACTORY_SOURCE: "factory", **{s: s for s in vocab.FILE_SOURCES}}
    assert kind == expected.get(name, "memory")


def _string_collections(path: Path) -> list[tuple[int, set[str]]]:
    """(line, strings) of every tuple, list and set literal of two or more strings."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strings = {
                e.value
                for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            }
            if len(strings) >= 2:
                found.append((node.lineno, strings))
    return found


def test_no_module_keeps_its_own_list_of_these_names() -> None:
    """A literal that holds two or more names of one list is a copy that would drift."""
    copies = []
    for package in ("recipes", "tfplan"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "recipes" / "vocabulary.py":
                continue
            for line, strings in _string_collections(path):
                for what, names in LISTS.items():
                    if len(strings & set(names)) >= 2:
                        copies.append(f"{path.relative_to(ROOT)}:{line} lists {what}")
    assert not copies, "use recipes/vocabulary.py instead: " + "; ".join(copies)


def test_the_checker_sees_a_copy(tmp_path: Path) -> None:
    copy = tmp_path / "copy.py"
    copy.write_text('LOSSES = ("mse", "mae")\nOTHER = ["a", "b"]\n')
    assert _string_collections(copy) == [(1, {"mse", "mae"}), (2, {"a", "b"})]
