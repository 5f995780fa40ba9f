"""The TF2 strategies' update rule (``algo=allreduce``, ``algo=pss``): ``algo.optimizer`` applied
to eager variables, distributed ones included, with tf.compat.v1's formulas (the TF1 algorithms'
rules are in ``recipes/algorithms/``, one file each; they use tf.compat.v1's optimizers
themselves)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable

import tensorflow as tf

from recipes.errors import ConfigError
from recipes.models import Params
from recipes.vocabulary import OPTIMIZERS

__all__ = ["Optimizer"]


class Optimizer:
    """``algo.optimizer`` with tf.compat.v1's update rules (as the TF1 recipes use them), for
    eager variables, distributed ones included: ``sgd``; ``momentum`` (0.9: a <- 0.9 a + g,
    w <- w - lr a); ``adagrad`` (accumulator from 0.1: a <- a + g^2, w <- w - lr g / sqrt(a));
    ``adam`` (0.9, 0.999, 1e-8, bias correction with t = global step + 1).

    A sparse gradient (an embedding table's ``IndexedSlices``) changes only its distinct rows
    (duplicate ids summed) and those rows' slots, as the TF1 algorithms' optimizers do: the same
    formulas on the rows, the other rows and slots left as they are (momentum does not carry an
    untouched row, Adam is lazy: recipes/algorithms/lazy_adam.py). Dense, every row would be
    rewritten at every step.

    Why not a Keras optimizer: Keras 3 optimizers track their own ``keras.Variable`` state and
    step counter; these few lines keep the slots in our checkpoints under plain names.
    """

    SLOTS = {"sgd": (), "momentum": ("momentum",), "adagrad": ("accumulator",), "adam": ("m", "v")}

    def __init__(self, name: str, lr: float) -> None:
        name = name.lower()
        if name not in self.SLOTS:
            raise ConfigError(f"algo.optimizer={name}: unknown; valid: {', '.join(OPTIMIZERS)}")
        self.name = name
        self.lr = float(lr)

    def slot_fills(self) -> dict[str, float]:
        """Each slot kind's initial value (Adagrad's accumulator starts at 0.1, the rest at 0)."""
        return {slot: 0.1 if slot == "accumulator" else 0.0 for slot in self.SLOTS[self.name]}

    def create_slots(
        self, params: Params, colocate: Callable[[Any], AbstractContextManager[Any]] | None = None
    ) -> Params:
        """One slot per parameter and slot kind, keyed ``<slot>/<param>``, next to its variable."""
        slots: Params = {}
        for pname, var in params.items():
            for slot in self.SLOTS[self.name]:
                with colocate(var) if colocate else nullcontext():
                    init = self.slot_fills()[slot]
                    slots[f"{slot}/{pname}"] = tf.Variable(
                        tf.fill(var.shape, init), trainable=False, name=f"{slot}/{pname}"
                    )
        return slots

    def apply(self, params: Params, grads: dict[str, Any], slots: Params, step: Any) -> None:
        """Apply one update to every parameter (inside a ``tf.function``)."""
        lr = tf.constant(self.lr, tf.float32)
        if self.name == "adam":
            t = tf.cast(step, tf.float32) + 1.0
            lr = lr * tf.sqrt(1.0 - tf.pow(0.999, t)) / (1.0 - tf.pow(0.9, t))
        for name, var in params.items():
            g = grads[name]
            if isinstance(g, tf.IndexedSlices):
                self._apply_rows(name, var, g, slots, lr)
            elif self.name == "sgd":
                var.assign_sub(lr * g)
            elif self.name == "momentum":
                a = slots[f"momentum/{name}"].assign(0.9 * slots[f"momentum/{name}"] + g)
                var.assign_sub(lr * a)
            elif self.name == "adagrad":
                a = slots[f"accumulator/{name}"].assign_add(g * g)
                var.assign_sub(lr * g / tf.sqrt(a))
            else:
                m = slots[f"m/{name}"].assign(0.9 * slots[f"m/{name}"] + 0.1 * g)
                v = slots[f"v/{name}"].assign(0.999 * slots[f"v/{name}"] + 0.001 * g * g)
                var.assign_sub(lr * m / (tf.sqrt(v) + 1e-8))

    def _apply_rows(self, name: str, var: Any, g: tf.IndexedSlices, slots: Params, lr: Any) -> None:
        """The update of :meth:`apply` on the rows of a sparse gradient only. The rows travel to
        the ps as int32 where the table's rows fit (every table below 2^31 rows): 4 bytes a row
        instead of 8, since the lookup already sent the same ids (docs/bench_table_traffic.md)."""
        wide = var.shape[0] is None or var.shape[0] >= 2**31
        rows, at = tf.unique(tf.cast(g.indices, tf.int64 if wide else tf.int32))
        g_rows = tf.math.unsorted_segment_sum(g.values, at, tf.shape(rows)[0])

        def update(slot: str, value: Any) -> Any:
            slots[f"{slot}/{name}"].scatter_update(tf.IndexedSlices(value, rows))
            return value

        def gather(slot: str) -> Any:
            return tf.gather(slots[f"{slot}/{name}"], rows)

        if self.name == "sgd":
            step = lr * g_rows
        elif self.name == "momentum":
            step = lr * update("momentum", 0.9 * gather("momentum") + g_rows)
        elif self.name == "adagrad":
            a = update("accumulator", gather("accumulator") + g_rows * g_rows)
            step = lr * g_rows / tf.sqrt(a)
        else:
            m = update("m", 0.9 * gather("m") + 0.1 * g_rows)
            v = update("v", 0.999 * gather("v") + 0.001 * g_rows * g_rows)
            step = lr * m / (tf.sqrt(v) + 1e-8)
        var.scatter_sub(tf.IndexedSlices(step, rows))
