"""What is minimised and reported: the loss and metrics named in the config (``model.loss``,
``model.from_logits``, ``model.metrics``), on any model's outputs and the label tensor.

Losses: ``sparse_categorical_crossentropy`` (integer labels, one output per class),
``categorical_crossentropy`` (one-hot labels), ``binary_crossentropy`` (0/1 labels, one output),
``mse``, ``mae``, ``huber`` (regression), or a dotted callable ``(labels, outputs) -> loss``
(per example or already averaged). Metrics: ``accuracy`` (its meaning follows the loss),
``mse``, ``mae``. Everything is plain ``tf`` ops: the same code serves graph mode and eager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import tensorflow as tf

from recipes.errors import ObjectiveError, UserCodeError
from recipes.vocabulary import CLASSIFICATION_LOSSES, LOSSES, METRICS

__all__ = ["Objective", "ObjectiveError"]


def _flat(t: tf.Tensor) -> tf.Tensor:
    return tf.reshape(t, [-1])


@dataclass(frozen=True)
class Objective:
    loss: str = "sparse_categorical_crossentropy"
    from_logits: bool = True
    metrics: tuple[str, ...] = ("accuracy",)
    custom: Optional[Callable[..., Any]] = field(default=None, compare=False)

    @property
    def classification(self) -> bool:
        return self.loss in CLASSIFICATION_LOSSES

    def check(self, outputs: Any, labels: Any) -> None:
        """Refuse outputs that do not fit the loss (static shapes only)."""
        if not isinstance(outputs, tf.Tensor) and not hasattr(outputs, "shape"):
            raise ObjectiveError(
                f"model.loss={self.loss}: the model returns {type(outputs).__name__}, not one "
                "tensor; give it a single output"
            )
        width = outputs.shape[-1] if outputs.shape.rank else None
        if self.loss == "binary_crossentropy" and width not in (None, 1):
            raise ObjectiveError(
                f"model.loss=binary_crossentropy needs one output per example, the model has "
                f"{width}: end the model with Dense(1), or use "
                "model.loss=sparse_categorical_crossentropy for several classes"
            )
        if self.loss == "sparse_categorical_crossentropy" and width == 1:
            raise ObjectiveError(
                "model.loss=sparse_categorical_crossentropy needs one output per class, the "
                "model has 1: use model.loss=binary_crossentropy (two classes) or mse"
            )

    def per_example_loss(self, outputs: Any, labels: Any) -> tf.Tensor:
        if self.custom is not None:
            try:
                return self.custom(labels, outputs)
            except Exception as e:  # noqa: BLE001 - the user's own loss raised: keep its traceback
                raise UserCodeError("model.loss", self.loss, e) from e
        name = self.loss
        if name == "sparse_categorical_crossentropy":
            logits = outputs if self.from_logits else tf.math.log(outputs + 1e-7)
            return tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.cast(_flat(labels), tf.int64), logits=logits
            )
        if name == "categorical_crossentropy":
            logits = outputs if self.from_logits else tf.math.log(outputs + 1e-7)
            return tf.nn.softmax_cross_entropy_with_logits(
                labels=tf.cast(labels, logits.dtype), logits=logits
            )
        out = _flat(outputs)
        y = tf.cast(_flat(labels), out.dtype)
        if name == "binary_crossentropy":
            if self.from_logits:
                return tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=out)
            p = tf.clip_by_value(out, 1e-7, 1 - 1e-7)
            return -(y * tf.math.log(p) + (1 - y) * tf.math.log(1 - p))
        if name == "mse":
            return tf.square(out - y)
        if name == "mae":
            return tf.abs(out - y)
        if name == "huber":
            err = tf.abs(out - y)
            return tf.where(err <= 1.0, 0.5 * tf.square(err), err - 0.5)
        raise ObjectiveError(f"model.loss={name}: unknown; valid: {', '.join(LOSSES)}")

    def loss_of(self, outputs: Any, labels: Any) -> tf.Tensor:
        """The mean loss of one batch."""
        return tf.reduce_mean(self.per_example_loss(outputs, labels))

    def metric_values(self, outputs: Any, labels: Any) -> dict[str, tf.Tensor]:
        """Each metric's mean over the batch."""
        values: dict[str, tf.Tensor] = {}
        for metric in self.metrics:
            if metric == "accuracy":
                values[metric] = tf.reduce_mean(tf.cast(self._correct(outputs, labels), tf.float32))
            elif metric in METRICS:  # the regression metrics: mse, mae
                out = tf.cast(_flat(outputs), tf.float32)
                y = tf.cast(_flat(labels), tf.float32)
                err = out - y
                values[metric] = tf.reduce_mean(tf.square(err) if metric == "mse" else tf.abs(err))
            else:
                raise ObjectiveError(
                    f"model.metrics: unknown metric {metric!r}; valid: {', '.join(METRICS)}"
                )
        return values

    def _correct(self, outputs: Any, labels: Any) -> tf.Tensor:
        if self.loss == "binary_crossentropy":
            threshold = 0.0 if self.from_logits else 0.5
            predicted = tf.cast(_flat(outputs) > threshold, tf.int64)
            return tf.equal(predicted, tf.cast(_flat(labels), tf.int64))
        if self.loss == "categorical_crossentropy":
            return tf.equal(tf.argmax(outputs, axis=-1), tf.argmax(labels, axis=-1))
        if self.loss == "sparse_categorical_crossentropy":
            return tf.equal(tf.argmax(outputs, axis=-1), tf.cast(_flat(labels), tf.int64))
        raise ObjectiveError(
            f"model.metrics=accuracy needs a classification loss, not model.loss={self.loss}: "
            "use model.metrics=[mae] (or mse) for regression"
        )
