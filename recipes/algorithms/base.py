"""The small interface between the runtime and a training algorithm.

The runtime owns the cluster, sessions, hooks, data and logging; an algorithm only builds the
graph of one training replica. Adding an algorithm = one module with a subclass of
:class:`Algorithm` registered in ``recipes/algorithms/__init__.py``; the runtime never changes.

What the runtime does with a :class:`TrainGraph`: it runs ``step_ops[i % len(step_ops)]`` with one
fresh minibatch per ``session.run`` (so a windowed algorithm gets one run, hence one re-evaluated
forward pass, per local step), fetching ``loss``; it merges ``hooks``, ``run_options`` and
``stop_grace_secs`` into its ``MonitoredSession``; it checkpoints and evaluates ``params``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

import tensorflow as tf

from recipes.algorithms.lazy_adam import LazyAdamOptimizer
from recipes.config import AlgoConf
from recipes.errors import ConfigError
from recipes.vocabulary import OPTIMIZERS

__all__ = [
    "Algorithm",
    "BuildContext",
    "Params",
    "Problem",
    "TrainGraph",
    "dense",
    "make_optimizer",
    "move_to_local_collection",
    "scaled",
]

v1 = tf.compat.v1
Params = dict[str, tf.Variable]


@dataclass(frozen=True)
class Problem:
    """What to train, independent of the algorithm.

    ``create_params(collections)`` creates a fresh set of model variables in the current device and
    variable scope (``None`` = the default global collections; ``skip=keys``: all but those).
    ``loss_fn(params)`` builds a *new* forward pass and loss from any parameter dict each time it
    is called. ``inputs`` (the minibatch ``(x, y)`` that ``loss_fn`` reads) and
    ``loss_on(params, x, y)`` (the loss of any batch) are optional; in-graph replication
    (``multi_gpu``) needs them to split the minibatch. ``table_keys()`` (once the shared set
    exists): the keys of the embedding tables the forward pass reads row by row, which the
    windowed algorithms leave on the ps (recipes/algorithms/local.py).
    """

    create_params: Callable[..., Params]
    loss_fn: Callable[[Params], tf.Tensor]
    inputs: Optional[tuple[tf.Tensor, tf.Tensor]] = None
    loss_on: Optional[Callable[[Params, tf.Tensor, tf.Tensor], tf.Tensor]] = None
    table_keys: Callable[[], frozenset[str]] = frozenset


@dataclass(frozen=True)
class BuildContext:
    """Where this replica sits in the cluster."""

    algo: AlgoConf
    n_replicas: int
    replica_index: int
    is_chief: bool
    worker_device: str  # e.g. "/job:worker/task:1"; this replica's own device
    ps_device: Any  # a replica_device_setter function: variables to ps, ops to worker_device
    global_step: tf.Variable


@dataclass
class TrainGraph:
    """What :meth:`Algorithm.build` returns."""

    params: Params  # the shared (parameter-server) variables: checkpointed and evaluated
    train_params: Params  # the variables the step ops train (local copies or ``params``)
    loss: tf.Tensor  # the minibatch loss of the forward pass that each step op uses
    step_ops: list[Any]  # run i executes step_ops[i % len(step_ops)]
    hooks: list[Any] = field(default_factory=list)  # extra SessionRunHooks for this replica
    local_init_op: Optional[Any] = None  # replaces the default local init (runs after ps init)
    run_options: Optional[Any] = None  # v1.RunOptions for every training run (e.g. a timeout)
    stop_grace_secs: float = 5.0  # MonitoredSession's stop_grace_period_secs
    batches_per_global_step: int = 1  # examples per global step = this * batch_size
    # a synchronous optimizer's rounds (recipes/sync_rounds.py): the chief's snapshots of the ps
    # are taken between two of them, and a ps that comes back brings every ps back to one
    rounds: Optional[Any] = None
    extras: dict[str, Any] = field(default_factory=dict)  # internals the rule tests inspect


class Algorithm(ABC):
    """One training algorithm; subclasses set ``name`` and implement :meth:`build`."""

    name: ClassVar[str]

    def cpu_devices(self, algo: AlgoConf) -> int:
        """How many CPU devices this replica's server must expose (in-graph CPU towers need
        more than one; ``tf.config.set_logical_device_configuration`` does not reach a
        ``tf.distribute.Server``, ``ConfigProto.device_count`` does)."""
        return 1

    @abstractmethod
    def build(self, ctx: BuildContext, problem: Problem) -> TrainGraph:
        """Build this replica's training graph in the default graph.

        Shared variables must be created under ``v1.device(ctx.ps_device)``; per-replica state in
        ``LOCAL_VARIABLES`` on ``ctx.worker_device``, out of ``GLOBAL_VARIABLES``.
        """


def dense(grad: Any) -> Any:
    """A gradient as a dense tensor. An embedding's gradient is ``IndexedSlices`` (the rows a
    batch touched); the optimizers apply those sparsely, but arithmetic on gradients needs
    tensors."""
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def scaled(grad: Any, factor: Any) -> Any:
    """``factor * grad``, keeping a sparse (``IndexedSlices``) gradient sparse."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor


def make_optimizer(name: str, lr: float) -> Any:
    """A tf.compat.v1 optimizer by config name; lock-free (``use_locking=False``) on purpose.
    Sparse gradients (embedding tables) change only their rows and those rows' slots: SGD,
    momentum and Adagrad do so themselves, Adam is the lazy one (recipes/algorithms/lazy_adam.py)."""
    name = name.lower()
    if name == "sgd":
        return v1.train.GradientDescentOptimizer(lr, use_locking=False)
    if name == "adagrad":
        return v1.train.AdagradOptimizer(lr, use_locking=False)
    if name == "adam":
        return LazyAdamOptimizer(lr, use_locking=False)
    if name == "momentum":
        return v1.train.MomentumOptimizer(lr, 0.9, use_locking=False)
    raise ConfigError(f"algo.optimizer={name}: unknown; valid: {', '.join(OPTIMIZERS)}")


def move_to_local_collection(variables: list[Any]) -> None:
    """Move variables (e.g. a local optimizer's slots) from GLOBAL_ to LOCAL_VARIABLES.

    Why: a global variable would be checkpointed by the chief and waited for by every other
    replica's readiness check, although it lives on one worker only.
    """
    graph = v1.get_default_graph()
    global_list = graph.get_collection_ref(v1.GraphKeys.GLOBAL_VARIABLES)
    moving = {id(v) for v in variables}
    # Identity, not ==: variables compare elementwise (and are unhashable) when eager is on.
    global_list[:] = [v for v in global_list if id(v) not in moving]
    for var in variables:
        graph.add_to_collection(v1.GraphKeys.LOCAL_VARIABLES, var)
