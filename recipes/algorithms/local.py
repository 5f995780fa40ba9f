"""What the algorithms that train a worker-local copy share (DOWNPOUR, AGN, ADAG, DynSGD, ...).

The pattern: the center lives on the ps; each replica keeps a copy and the local optimizer's
slots in ``LOCAL_VARIABLES`` on its own device (neither checkpointed nor waited for by the other
replicas); every local step is its own ``session.run`` with its own minibatch, so the forward
pass is re-evaluated on the updated copy (the seed guide's unrolled window computes T gradients
at the pulled weights). :class:`WindowedAlgorithm` builds that skeleton once; an algorithm
writes only its window (:meth:`WindowedAlgorithm.build_window`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Optional

import tensorflow as tf

from recipes.algorithms.base import (
    Algorithm,
    BuildContext,
    Params,
    Problem,
    TrainGraph,
    make_optimizer,
    move_to_local_collection,
)
from recipes.errors import ConfigError

__all__ = [
    "LOCAL",
    "LocalOptimizer",
    "Window",
    "WindowedAlgorithm",
    "add_global_steps",
    "assign_all",
    "create_local_copy",
    "local_optimizer_step",
    "local_twins",
    "option",
    "positive_int",
    "read_all",
    "reading_tables",
    "table_rows_step",
    "window_ops",
]

v1 = tf.compat.v1
LOCAL = [v1.GraphKeys.LOCAL_VARIABLES]


def option(ctx: BuildContext, key: str, default: Any) -> Any:
    """An algorithm option from the run config (absent or null: ``default``)."""
    return ctx.algo.get(key, default)


def positive_int(ctx: BuildContext, key: str, default: int) -> int:
    value = int(option(ctx, key, default))
    if value < 1:
        raise ConfigError(f"algo.{key} must be >= 1, got {value}")
    return value


def local_twins(params: Params, suffix: str) -> Params:
    """Zero-initialised worker-local variables shaped like ``params``, named
    ``local/model/w_<suffix>`` (call on the worker device)."""
    with v1.variable_scope("local"):
        return {
            k: v1.get_variable(
                f"{v.op.name}_{suffix}",
                shape=v.shape,
                dtype=v.dtype.base_dtype,
                initializer=v1.zeros_initializer(),
                collections=LOCAL,
                trainable=False,
                use_resource=True,
            )
            for k, v in params.items()
        }


def create_local_copy(problem: Problem, skip: Collection[str] = ()) -> Params:
    """The model's variables again (all but the keys in ``skip``), as ``local/model/...`` in
    LOCAL_VARIABLES (call on the worker device)."""
    with v1.variable_scope("local"):
        if skip:
            return problem.create_params(LOCAL, skip=skip)
        return problem.create_params(LOCAL)


def reading_tables(problem: Problem, tables: Params) -> Problem:
    """``problem`` whose forward passes read ``tables`` (on the ps) beside the parameters they
    are given: a windowed algorithm's copy holds the dense parameters only."""
    loss_on = problem.loss_on
    return replace(
        problem,
        loss_fn=lambda params: problem.loss_fn({**params, **tables}),
        loss_on=None if loss_on is None else lambda p, x, y: loss_on({**p, **tables}, x, y),
    )


def table_rows_step(ctx: BuildContext, loss: Any, tables: Params, optimizer: Any) -> Any:
    """Hogwild's rule for the tables, at every run of the window: the gradient of ``loss`` for
    the rows the batch read (``IndexedSlices``), applied on the ps by ``optimizer``
    (:meth:`WindowedAlgorithm.table_optimizer`; its slots on the ps beside the table, only those
    rows changed: recipes/algorithms/base.py ``make_optimizer``)."""
    with v1.device(ctx.ps_device):
        grads = optimizer.compute_gradients(loss, var_list=list(tables.values()))
        return optimizer.apply_gradients(grads, name="table_rows")


class LocalOptimizer:
    """``algo.optimizer`` (lr ``algo.lr``) on the local copy; its slots go local.

    One optimizer, one set of gradients: :meth:`apply` may be called more than once (e.g. a
    plain step and an exchange step) and every apply shares the same slots.
    """

    def __init__(self, ctx: BuildContext, loss: Any, local: Params) -> None:
        self._local = local
        self.opt = make_optimizer(ctx.algo.optimizer, ctx.algo.lr)
        self.grads = self.opt.compute_gradients(loss, var_list=list(local.values()))

    def apply(self, grad_sums: Params | None = None, control: list[Any] | None = None) -> Any:
        """One local step.

        Args:
            grad_sums: when given, each gradient is also added to its accumulator.
            control: ops the update must wait for (e.g. reads that need the pre-step weights).
        """
        # Slots are named after the local variables (local/model/w/Adam) and moved local.
        before = {id(v) for v in v1.global_variables()}
        with tf.control_dependencies(control or []):
            ops = [self.opt.apply_gradients(self.grads)]
            if grad_sums is not None:
                ops += [
                    grad_sums[k].assign_add(g)
                    for k, (g, _) in zip(self._local, self.grads, strict=True)
                ]
        step = tf.group(*ops, name="local_step")
        move_to_local_collection([v for v in v1.global_variables() if id(v) not in before])
        return step


def local_optimizer_step(
    ctx: BuildContext, loss: Any, local: Params, grad_sums: Params | None = None
) -> Any:
    """One step of a fresh :class:`LocalOptimizer` (see there)."""
    return LocalOptimizer(ctx, loss, local).apply(grad_sums)


def assign_all(targets: list[Params], values: dict[str, Any], name: str) -> Any:
    """Assign ``values[k]`` to ``t[k]`` for every dict ``t`` in ``targets``, as one op."""
    return tf.group(*[t[k].assign(values[k]) for t in targets for k in values], name=name)


def read_all(params: Params) -> dict[str, Any]:
    return {k: v.read_value() for k, v in params.items()}


def window_ops(local_step: Any, exchange: Any, window: int) -> list[Any]:
    """``step_ops`` for a window of T runs whose last run also exchanges with the ps."""
    return [local_step] * (window - 1) + [exchange]


def add_global_steps(ctx: BuildContext, n: int) -> Any:
    """``global_step += n`` (global_step counts minibatches, whatever the algorithm)."""
    return ctx.global_step.assign_add(tf.constant(n, ctx.global_step.dtype.base_dtype))


@dataclass
class Window:
    """One window of T runs, as :meth:`WindowedAlgorithm.build_window` builds it."""

    loss: Any  # the minibatch loss of the forward pass that the local step uses
    local_step: Any  # runs 1 .. T-1
    exchange: Any  # run T: a local step, then the exchange with the ps
    # Twins that start at the center with the copy (the others start at zero).
    start_at_center: list[Params] = field(default_factory=list)
    # When set, builds the whole local init instead; it runs after the local variables' initializer.
    start: Optional[Callable[[], Any]] = None
    extras: dict[str, Any] = field(default_factory=dict)  # TrainGraph.extras
    # Further TrainGraph fields (hooks, run_options, stop_grace_secs, batches_per_global_step).
    graph_fields: dict[str, Any] = field(default_factory=dict)


class WindowedAlgorithm(Algorithm):
    """T runs on a worker-local copy of the center, the T-th of which exchanges with the ps.

    :meth:`build` is the skeleton every such algorithm shares: ``algo.window`` (T, default
    ``default_window``); the center on the ps (``model/...``, checkpointed); this replica's copy
    on its worker (``local/model/...``); the window from :meth:`build_window`, as ``step_ops`` =
    T-1 local steps and one exchange; a local init that, after the local variables are
    initialised, starts the copy (and ``Window.start_at_center``) at the center.

    Embedding tables read row by row (``Problem.table_keys``) are not copied: a table of
    gigabytes cannot be held by every worker, nor pulled and pushed whole per window. The copy
    and the window hold the dense parameters; the forward passes read the tables' rows on the
    ps, and every run applies the rows' gradients there (:func:`table_rows_step`, hogwild's
    rule): the window's rule for the dense part, hogwild's for the tables.
    """

    default_window: ClassVar[int]

    def build(self, ctx: BuildContext, problem: Problem) -> TrainGraph:
        window = positive_int(ctx, "window", self.default_window)
        with v1.device(ctx.ps_device):
            center = problem.create_params(None)
        tables = {k: center[k] for k in sorted(problem.table_keys()) if k in center}
        dense = {k: v for k, v in center.items() if k not in tables}
        with v1.device(ctx.worker_device):
            local = create_local_copy(problem, skip=tables)
            windowed = reading_tables(problem, tables) if tables else problem
            parts = self.build_window(ctx, windowed, dense, local, window)
            local_step, exchange = parts.local_step, parts.exchange
            if tables:
                rows = table_rows_step(ctx, parts.loss, tables, self.table_optimizer(ctx))
                local_step = tf.group(local_step, rows, name="local_step_and_table_rows")
                exchange = tf.group(exchange, rows, name="exchange_and_table_rows")
            # Last: the initializer covers the local variables that exist when it is made.
            with tf.control_dependencies([v1.local_variables_initializer()]):
                if parts.start is not None:
                    local_init = parts.start()
                else:
                    targets = [local, *parts.start_at_center]
                    local_init = assign_all(targets, read_all(dense), "local_init")
        return TrainGraph(
            params=center,
            train_params={**local, **tables},
            loss=parts.loss,
            step_ops=window_ops(local_step, exchange, window),
            local_init_op=local_init,
            extras=parts.extras,
            **parts.graph_fields,
        )

    def table_optimizer(self, ctx: BuildContext) -> Any:
        """What applies the tables' rows on the ps: ``algo.optimizer`` at ``algo.lr``."""
        return make_optimizer(ctx.algo.optimizer, ctx.algo.lr)

    @abstractmethod
    def build_window(
        self, ctx: BuildContext, problem: Problem, center: Params, local: Params, window: int
    ) -> Window:
        """The algorithm's own part: its loss, local step and exchange.

        Called on the worker device once the center and the copy exist. Worker state goes in
        ``LOCAL_VARIABLES`` (:func:`local_twins`, :class:`LocalOptimizer`); ps state under
        ``v1.device(ctx.ps_device)``.
        """
