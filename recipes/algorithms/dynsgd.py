"""DynSGD: staleness-aware commits, center += delta / (tau + 1), with a clock on the ps.

Rule ([TH] Eq. ``dynsgd_ps``; dist-keras ``DynSGDParameterServer``): the ps keeps a clock c
(commits so far); a replica remembers the clock of its last pull, m. A commit of the window's
accumulated delta (theta_T - theta_pull, *not* divided by T, as dist-keras sends it) is scaled by
1 / (tau + 1) with tau = c - m, the number of other replicas' commits since the pull; then
c += 1 and the replica pulls the center and the clock.

"read clock -> scale -> add -> increment -> read the center and clock for the pull" runs inside
one ``tf.CriticalSection`` whose mutex lives on the ps next to the clock (``shared_name``, so
every replica's graph locks the same mutex): no commit can land between a replica's staleness
read and its add, and the pulled center is exactly the one the pulled clock names (dist-keras
computes the staleness outside its lock). The scale itself is computed on the ps.

Config keys: ``window`` (T, default 5 as dist-keras), ``optimizer`` and ``lr`` (local steps).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from recipes.algorithms.base import BuildContext, Params, Problem
from recipes.algorithms.local import (
    LOCAL,
    Window,
    WindowedAlgorithm,
    add_global_steps,
    assign_all,
    local_optimizer_step,
    local_twins,
)

v1 = tf.compat.v1
LOCK_NAME = "dynsgd_commit_lock"


def read_on_ps(params: Params) -> dict[str, Any]:
    """Each variable's value, read on its own (ps) device."""
    values = {}
    for k, var in params.items():
        with v1.device(var.device):
            values[k] = var.read_value()
    return values


class DynSGD(WindowedAlgorithm):
    name = "dynsgd"
    default_window = 5

    def build_window(
        self, ctx: BuildContext, problem: Problem, center: Params, local: Params, window: int
    ) -> Window:
        with v1.device(ctx.ps_device):
            clock = v1.get_variable(
                "dynsgd/clock",
                shape=[],
                dtype=tf.int64,
                initializer=v1.zeros_initializer(),
                trainable=False,
                use_resource=True,
            )
        with v1.device(clock.device):
            lock = tf.CriticalSection(name="dynsgd_lock", shared_name=LOCK_NAME)
        pulled = local_twins(center, "pulled")
        with v1.variable_scope("local"):
            pulled_clock = v1.get_variable(
                "dynsgd/pulled_clock",
                shape=[],
                dtype=tf.int64,
                initializer=v1.zeros_initializer(),
                collections=LOCAL,
                trainable=False,
                use_resource=True,
            )
        loss = problem.loss_fn(local)
        local_step = local_optimizer_step(ctx, loss, local)
        with tf.control_dependencies([local_step]):
            delta = {k: local[k].read_value() - pulled[k].read_value() for k in center}
            seen = pulled_clock.read_value()

        # Every op inside the lock sits on the ps next to the variable it touches: the
        # lock's output identities are colocated with these ops, and a read of a ps
        # variable placed on the worker cannot be (strict placement fails).
        def commit_and_read() -> tuple[Any, Any, dict[str, Any]]:
            with v1.device(clock.device):
                tau = clock.read_value() - seen
                scale = 1.0 / (tf.cast(tau, tf.float32) + 1.0)
            adds = []
            for k in center:
                with v1.device(center[k].device):
                    adds.append(center[k].assign_add(delta[k] * scale))
            with tf.control_dependencies(adds), v1.device(clock.device):
                new_clock = clock.assign_add(tf.constant(1, tf.int64)).read_value()
            with tf.control_dependencies([new_clock]):
                values = read_on_ps(center)
            return tau, new_clock, values

        tau, new_clock, values = lock.execute(commit_and_read, name="commit")
        exchange = tf.group(
            assign_all([local, pulled], values, "pull"),
            pulled_clock.assign(new_clock),
            add_global_steps(ctx, window),
            name="exchange",
        )

        def read_center_and_clock() -> tuple[dict[str, Any], Any]:
            with v1.device(clock.device):
                now = clock.read_value()
            return read_on_ps(center), now

        def start() -> Any:
            """Pull the center and the clock that names it, in the lock as the exchange does."""
            values, now = lock.execute(read_center_and_clock, name="local_init_read")
            return tf.group(
                assign_all([local, pulled], values, "local_init"), pulled_clock.assign(now)
            )

        extras = {"clock": clock, "pulled_clock": pulled_clock, "tau": tau, "pulled": pulled}
        return Window(loss, local_step, exchange, start=start, extras=extras)
