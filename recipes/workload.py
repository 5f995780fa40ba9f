"""What one run trains, from its config: the model, the objective and the inputs, as one object.

Every training path goes through a :class:`Workload`: the TF1 replicas (all twelve parameter-server
algorithms), the evaluator's and the chiefs' :class:`recipes.evaluator.CheckpointScorer`, and the
TF2 strategies. The model is the user's Keras model (``model._target_``,
:class:`recipes.keras_model.KerasModel`) or a built-in one (:class:`recipes.models.Model`); both
offer the same interface (``create_params``, ``create_variables``, ``state_variables``,
``forward``), so no recipe tells them apart. The inputs are ``tf.data`` pipelines
(:mod:`recipes.inputs`) for every source, the bundled in-memory sets included.

Checkpoint names: every model variable is stored as ``model/<name>`` (the built-ins' names,
``dense0/w``, or the Keras paths, ``dense/kernel``), the global step as ``global_step``; the rest
of the graph's global variables (optimizer slots, an algorithm's own ps state) under their own
names. :func:`saver_names` gives that mapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import tensorflow as tf

from recipes import inputs
from recipes.checkpoint_names import sliced_names
from recipes.config import RunConfig
from recipes.inputs import InputSpec
from recipes.models import build_model, objective_of
from recipes.objective import Objective, ObjectiveError

__all__ = ["Workload", "sample_features", "saver_names"]

v1 = tf.compat.v1


def sample_features(spec: InputSpec) -> Any:
    """One example's worth of zeros in the features' structure: builds a Keras model that has no
    ``keras.Input`` (a Sequential without one, a subclassed model)."""

    def one(shape: tuple[int, ...], dtype: str) -> Any:
        if dtype == "string":
            return tf.fill([1, *shape], "")
        return tf.zeros([1, *shape], tf.as_dtype(dtype))

    if spec.single:
        ((shape, dtype),) = spec.features.values()
        return one(shape, dtype)
    return {name: one(shape, dtype) for name, (shape, dtype) in spec.features.items()}


@dataclass
class Workload:
    """The model, the objective and the input spec of a run config."""

    cfg: RunConfig
    model: Any
    objective: Objective
    spec: InputSpec

    @classmethod
    def of(cls, cfg: RunConfig, partitions: int = 1) -> Workload:
        """Build it from the run config (reads the data's spec: a file header, one record).
        ``partitions``: the parameter servers a large variable is split over
        (``model.partition_bytes``): the cluster's ps count, the same in every task.

        Raises:
            recipes.inputs.InputError: the data cannot be read as configured.
            recipes.keras_model.ModelError: the model's callable cannot be imported or called.
        """
        spec = inputs.input_spec(cfg.data)
        model = build_model(
            cfg, sample=lambda: sample_features(spec), spec=spec, partitions=partitions
        )
        return cls(cfg, model, objective_of(cfg), spec)

    # -- datasets -------------------------------------------------------------------------
    def train_dataset(self, shard_index: int, num_shards: int, seed: int) -> Any:
        return inputs.train_dataset(self.cfg.data, shard_index, num_shards, seed)

    def eval_dataset(self, max_examples: Optional[int] = None, min_batch: int = 0) -> Any:
        return inputs.eval_dataset(self.cfg.data, max_examples, min_batch)

    def train_sample_dataset(self, max_examples: int, min_batch: int = 0) -> Any:
        return inputs.train_sample_dataset(self.cfg.data, max_examples, min_batch)

    # -- graph pieces ---------------------------------------------------------------------
    def outputs(
        self, params: Any, features: Any, training: bool, state: Optional[Any] = None
    ) -> Any:
        outputs = self.model.forward(params, features, training, state)
        self.objective.check(outputs, None)
        return outputs

    def loss(
        self,
        params: Any,
        features: Any,
        labels: Any,
        training: bool = True,
        state: Optional[Any] = None,
    ) -> Any:
        """The mean loss of one batch, from a forward pass on ``params`` (any dict of variables
        or tensors)."""
        return self.objective.loss_of(self.outputs(params, features, training, state), labels)

    def scores(
        self, params: Any, features: Any, labels: Any, state: Optional[Any] = None
    ) -> tuple[Any, dict[str, Any]]:
        """The mean loss and each metric over one batch, in inference mode."""
        out = self.outputs(params, features, False, state)
        return self.objective.loss_of(out, labels), self.objective.metric_values(out, labels)

    def metric_names(self) -> list[str]:
        return list(self.objective.metrics)


def saver_names(global_step: Any, params: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's name -> variable mapping (graph mode): ``global_step``, the model's
    variables as ``model/<name>``, and every other global variable under its op name; the
    parts of a split table, and of each of its optimizer slots, as one name whose value is the
    list of its slices (a checkpoint holds the whole table, restorable into any other split).

    Raises:
        ObjectiveError: two model variables would share a checkpoint name.
    """
    named: dict[str, Any] = {"global_step": global_step}
    for key, var in [*params.items(), *state.items()]:
        name = f"model/{key}"
        if name in named:
            raise ObjectiveError(f"two model variables are named {key!r}")
        named[name] = var
    taken = {id(v) for v in named.values()}
    for var in v1.global_variables():
        if id(var) not in taken:
            named.setdefault(var.op.name, var)
    return sliced_names(named)  # a split table (and its slots) once, in slices
