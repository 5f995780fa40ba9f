"""Adam whose sparse updates touch only the rows of the batch (``algo.optimizer=adam``).

Why: tf.compat.v1's ``AdamOptimizer`` takes a sparse gradient (an embedding table's
``IndexedSlices``) by decaying *every* row of both slots and then updating *every* row of the
table (``m <- b1 m``, ``v <- b2 v``, ``w <- w - lr m / (sqrt(v) + eps)`` over the whole table, then
the batch's rows added): each step rewrites a table of millions of rows on its parameter server
(the rows no batch touched keep moving on their momentum). Here, as TensorFlow's former
``contrib.opt.LazyAdamOptimizer`` and TF Recommenders-Addons do, only the batch's rows change:

    m[r] <- b1 m[r] + (1 - b1) g[r];  v[r] <- b2 v[r] + (1 - b2) g[r]^2
    w[r] <- w[r] - lr sqrt(1 - b2^t) / (1 - b1^t) m[r] / (sqrt(v[r]) + eps)

for each distinct row ``r`` of the batch (duplicate ids summed first, by the base optimizer); the
other rows, and their slots, are left as they are. Dense gradients follow Adam's usual rule.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["LazyAdamOptimizer"]


class LazyAdamOptimizer(tf.compat.v1.train.AdamOptimizer):
    """tf.compat.v1 Adam with the lazy sparse rule above (dense updates unchanged)."""

    def _lazy_rows(self, grad: Any, var: Any, indices: Any) -> Any:
        beta1_power, beta2_power = self._get_beta_accumulators()
        dtype = var.dtype.base_dtype
        b1 = tf.cast(self._beta1_t, dtype)
        b2 = tf.cast(self._beta2_t, dtype)
        eps = tf.cast(self._epsilon_t, dtype)
        lr = (
            tf.cast(self._lr_t, dtype)
            * tf.sqrt(1 - tf.cast(beta2_power, dtype))
            / (1 - tf.cast(beta1_power, dtype))
        )
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        m_rows = b1 * tf.gather(m, indices) + (1 - b1) * grad
        v_rows = b2 * tf.gather(v, indices) + (1 - b2) * tf.square(grad)
        step = lr * m_rows / (tf.sqrt(v_rows) + eps)
        return tf.group(
            m.scatter_update(tf.IndexedSlices(m_rows, indices)),
            v.scatter_update(tf.IndexedSlices(v_rows, indices)),
            var.scatter_sub(tf.IndexedSlices(step, indices)),
        )

    def _apply_sparse(self, grad: Any, var: Any) -> Any:
        return self._lazy_rows(grad.values, var, grad.indices)

    def _resource_apply_sparse(self, grad: Any, var: Any, indices: Any) -> Any:
        return self._lazy_rows(grad, var, indices)
