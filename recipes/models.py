"""Models built from ``tf.compat.v1.get_variable`` and ``tf.nn`` only.

``tf.compat.v1.layers`` raises under Keras 3, and the algorithms need to create the same
parameters several times (on the ps, as local copies on a worker, in the evaluator), so a model is
split in two: :meth:`Model.create_params` makes the variables (under the variable scope
``model``, honouring the caller's device and collections) and :meth:`Model.logits` builds a
forward pass from any dict of parameters. Checkpoints name the variables ``model/<name>``.

The TF2 strategies (``recipes/strategies``: MultiWorkerMirroredStrategy, ParameterServerStrategy)
run eagerly and create the same parameters as plain ``tf.Variable`` objects with
:meth:`Model.create_variables` (same names, shapes and initialisers); :meth:`Model.logits` is
pure ``tf.nn`` and serves both worlds.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Optional

import tensorflow as tf

from recipes.config import ModelConf, RunConfig
from recipes.errors import ConfigError
from recipes.targets import import_target
from recipes.vocabulary import BUILTIN_MODELS, LOSSES, SINGLE_OUTPUT_LOSSES

__all__ = ["Model", "Params", "build_model", "input_width", "loss_and_accuracy", "objective_of"]

Params = dict[str, tf.Variable]
v1 = tf.compat.v1


class Model:
    """logreg, mlp (hidden sizes) or cnn (3x3 convs + 2x2 max-pool, then one dense layer)."""

    def __init__(
        self,
        cfg: ModelConf,
        image_size: int,
        channels: int,
        num_classes: int,
        input_dim: Optional[int] = None,
    ) -> None:
        if cfg.name not in BUILTIN_MODELS:
            raise ConfigError(
                f"model.name={cfg.name}: unknown; valid: {', '.join(BUILTIN_MODELS)}, or your "
                "own Keras model with model._target_=my_pkg.models.build"
            )
        self.cfg = cfg
        self.image_size = image_size
        self.channels = channels
        self.num_classes = num_classes
        self.input_dim = input_dim or image_size * image_size * channels
        if cfg.name == "cnn" and self.input_dim != image_size * image_size * channels:
            raise ConfigError(
                f"model=cnn reads {image_size}x{image_size}x{channels} images (data.image_size, "
                f"data.channels), but the features hold {self.input_dim} values per example"
            )

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(name, shape)`` of every parameter, in creation order (``dense0/w``, ...)."""
        dim = self.input_dim
        shapes: list[tuple[str, tuple[int, ...]]] = []
        if self.cfg.name == "cnn":
            size, c_in = self.image_size, self.channels
            for i, c_out in enumerate(self.cfg.conv_channels):
                shapes += [(f"conv{i}/w", (3, 3, c_in, c_out)), (f"conv{i}/b", (c_out,))]
                c_in, size = c_out, (size + 1) // 2 if size > 1 else size
            widths = [size * size * c_in, self.cfg.dense]
        elif self.cfg.name == "mlp":
            widths = [dim, *self.cfg.hidden]
        else:
            widths = [dim]
        widths.append(self.num_classes)
        for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            shapes += [(f"dense{i}/w", (n_in, n_out)), (f"dense{i}/b", (n_out,))]
        return shapes

    def create_params(
        self,
        collections: Optional[list[str]] = None,
        trainable: bool = True,
        skip: Collection[str] = (),
    ) -> Params:
        """Create the variables under scope ``model`` in the current device/variable scope
        (all but the keys in ``skip``)."""
        params: Params = {}
        with v1.variable_scope("model"):
            for name, shape in self.param_shapes():
                if name in skip:
                    continue
                init = (
                    v1.zeros_initializer()
                    if name.endswith("/b")
                    else v1.glorot_uniform_initializer()
                )
                params[name] = v1.get_variable(
                    name,
                    shape=shape,
                    dtype=tf.float32,
                    initializer=init,
                    collections=collections,
                    trainable=trainable,
                    use_resource=True,
                )
        return params

    def create_variables(self, colocate: Any = None) -> Params:
        """TF2: the same parameters as eager ``tf.Variable`` objects (in the current
        ``tf.distribute`` scope, if any), Glorot-uniform weights and zero biases as
        :meth:`create_params`. Not usable in graph mode: build those with :meth:`create_params`.
        ``colocate``: unused (a built-in model has no dynamic table)."""
        params: Params = {}
        for name, shape in self.param_shapes():
            init = (
                v1.zeros_initializer() if name.endswith("/b") else v1.glorot_uniform_initializer()
            )
            params[name] = tf.Variable(
                init(shape, dtype=tf.float32), name=f"model/{name}", trainable=True
            )
        return params

    def state_variables(self) -> Params:
        """Non-trainable model state: the built-in models have none."""
        return {}

    def prepare(self) -> None:
        """TF2: nothing to build ahead (a Keras model builds itself here)."""

    def embedding_tables(self) -> list[dict[str, object]]:
        """The model's embedding tables (:meth:`recipes.keras_model.KerasModel.embedding_tables`):
        the built-in models have none."""
        return []

    def create_state_variables(self) -> Params:
        """TF2: the non-trainable state as variables: none."""
        return {}

    def forward(
        self, params: Params, features: tf.Tensor, training: bool, state: Optional[Params] = None
    ) -> tf.Tensor:
        """The model interface the recipes share with :class:`recipes.keras_model.KerasModel`.
        ``features``: one tensor (reshaped to ``[batch, input_dim]``) or a dict of numeric ones,
        flattened and concatenated in the dict's order."""
        del training, state
        if isinstance(features, dict):
            parts = [
                tf.reshape(tf.cast(t, tf.float32), [tf.shape(t)[0], -1]) for t in features.values()
            ]
            x = tf.concat(parts, axis=1)
        else:
            x = tf.cast(features, tf.float32)
        return self.logits(params, tf.reshape(x, [-1, self.input_dim]))

    def logits(self, params: Params, x: tf.Tensor) -> tf.Tensor:
        """Forward pass; ``x`` is ``[batch, size*size*channels]``."""
        h = x
        if self.cfg.name == "cnn":
            h = tf.reshape(h, [-1, self.image_size, self.image_size, self.channels])
            for i in range(len(self.cfg.conv_channels)):
                h = tf.nn.relu(
                    tf.nn.conv2d(h, params[f"conv{i}/w"], 1, "SAME") + params[f"conv{i}/b"]
                )
                h = tf.nn.max_pool2d(h, 2, 2, "SAME")
            h = tf.reshape(h, [-1, int(params["dense0/w"].shape[0])])
        n_dense = sum(1 for k in params if k.startswith("dense") and k.endswith("/w"))
        for i in range(n_dense):
            h = tf.matmul(h, params[f"dense{i}/w"]) + params[f"dense{i}/b"]
            if i < n_dense - 1:
                h = tf.nn.relu(h)
        return h


def loss_and_accuracy(logits: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Mean softmax cross-entropy and accuracy of one batch."""
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )
    correct = tf.equal(tf.argmax(logits, axis=1), labels)
    return loss, tf.reduce_mean(tf.cast(correct, tf.float32))


def input_width(spec: Any) -> int:
    """How many numbers one example's features hold (a built-in model's input width).

    Raises:
        ConfigError: a string feature, or a shape that is not fully known.
    """
    width = 0
    for name, (shape, dtype) in spec.features.items():
        if dtype == "string" or any(d is None or d < 0 for d in shape):
            raise ConfigError(
                f"data feature {name!r} ({dtype}, shape {list(shape)}) cannot feed a built-in "
                "model, which reads fixed-size numbers: drop it from data.features or bring "
                "your own Keras model (model._target_=...)"
            )
        n = 1
        for d in shape:
            n *= int(d)
        width += n
    return width


def build_model(
    cfg: RunConfig,
    sample: Optional[Callable[[], Any]] = None,
    spec: Optional[Any] = None,
    partitions: int = 1,
) -> Any:
    """The model the run config names: the user's Keras model (``model._target_``) or a
    built-in one. Both offer ``create_params``, ``create_variables``, ``forward`` and
    ``state_variables``.

    Raises:
        recipes.errors.TargetError: the user's callable cannot be found.
        recipes.errors.ModelError: it cannot be called with the model.* keys.
        recipes.errors.UserCodeError: the user's code raised.
        recipes.errors.ConfigError: an unknown built-in model.
    """
    if cfg.model.target:
        from recipes.keras_model import KerasModel

        factory = import_target(cfg.model.target, "model._target_")
        return KerasModel(
            factory,
            cfg.model.kwargs,
            sample=sample,
            partitions=partitions,
            partition_bytes=cfg.model.partition_bytes,
            target=cfg.model.target,
            features=None if spec is None or spec.single else tuple(spec.features),
            dynamic=cfg.model.dynamic,
            capacity=cfg.model.capacity,
            min_count=cfg.model.min_count,
            ttl_steps=cfg.model.ttl_steps,
        )
    width = input_width(spec) if spec is not None else None
    # one output for binary classification and regression, one per class otherwise
    one = cfg.model.loss in SINGLE_OUTPUT_LOSSES
    outputs = 1 if one else cfg.data.num_classes
    return Model(cfg.model, cfg.data.image_size, cfg.data.channels, outputs, width)


def objective_of(cfg: RunConfig) -> Any:
    """The loss and metrics of the run config (``model.loss``, ``model.metrics``)."""
    from recipes.objective import Objective

    m = cfg.model
    custom = None if m.loss in LOSSES else import_target(m.loss, "model.loss")
    return Objective(m.loss, m.from_logits, tuple(m.metrics), custom)
