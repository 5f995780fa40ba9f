"""Print a run config's model variables as JSON: ``python -m recipes.inspect_model run.yaml [N]``
(``N``: the parameter servers, which a large variable is split over: ``model.partition_bytes``).

What a launcher needs to preview where the variables go without building the model itself (the
planner imports no TensorFlow): every global variable the model creates, in creation order
(``replica_device_setter`` places them round-robin in that order), with ``global_step`` first as
the replicas create it, under the names the checkpoints use (``model/<name>``), their shapes and
bytes. Built exactly as a TF1 replica builds it: graph mode, under a device setter.

It also runs the model once on a batch of zeros shaped as the data's features (what a first
step would do), checks that each of the model's named inputs is a feature, and lists the
features no input takes.

Output: ``{"variables": [{"name", "shape", "bytes", "trainable", "ps"}, ...], "unused_features":
[...], "tables": [{"name", "layer", "feature", "rows", "width", "bytes", "rows_only",
"ids_per_example"}, ...]}`` on stdout (``tables``: the model's Embedding tables). A config,
model or data problem is one line on stderr and exit status 2; an
exception of the user's own code is that line, the frames of the user's files (indented) and exit
status 1 (recipes/errors.py).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

__all__ = ["inspect", "model_variables"]


def inspect(config_path: str, partitions: int = 1) -> dict[str, object]:
    """The variables and the unused features, as described above.

    Raises:
        recipes.errors.RecipeError: the config, the data or the model cannot be used, or the
            user's code raised (UserCodeError).
    """
    import tensorflow as tf

    from recipes.config import load_run_config
    from recipes.errors import RecipeError, UserCodeError
    from recipes.workload import Workload, sample_features

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    cfg = load_run_config(config_path)
    work = Workload.of(cfg, partitions)
    with tf.Graph().as_default():
        variables = model_variables(work, partitions)
        tables = work.model.embedding_tables()
    with tf.Graph().as_default():  # one forward pass, as a replica's first step builds it
        params = work.model.create_params()
        try:
            work.outputs(params, sample_features(work.spec), training=False)
        except RecipeError:
            raise
        except Exception as e:  # noqa: BLE001 - the model's own call failed on the features
            if not cfg.model.target:
                raise
            raise UserCodeError(
                "model._target_",
                cfg.model.target,
                e,
                "failed on a batch shaped as the data's features:",
            ) from e
    unused = list(getattr(work.model, "unused_features", ()))
    return {"variables": variables, "unused_features": unused, "tables": tables}


def model_variables(work: Any, partitions: int = 1) -> list[dict[str, object]]:
    """The variables of ``work``'s model created in the current graph, as described above."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with v1.device(v1.train.replica_device_setter(ps_tasks=max(1, partitions))):
        step = v1.train.get_or_create_global_step()
        params = work.model.create_params()
        state = work.model.state_variables()
    names = {id(step): "global_step"}
    names.update({id(v): f"model/{k}" for k, v in [*params.items(), *state.items()]})
    trainable = {id(v) for v in params.values()}
    out = []
    for var in v1.global_variables():
        shape = [int(d) for d in var.shape]
        size = 1
        for d in shape:
            size *= d
        out.append(
            {
                "name": names.get(id(var), var.op.name),
                "shape": shape,
                "bytes": size * var.dtype.base_dtype.size,
                "trainable": id(var) in trainable,
                # where replica_device_setter put it (its round-robin counts every variable
                # created under it, in order)
                "ps": tf.DeviceSpec.from_string(var.device).task or 0,
            }
        )
    return out


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m recipes.inspect_model RUN_YAML [PS_COUNT]", file=sys.stderr)
        return 2
    from recipes.errors import RecipeError, UserCodeError

    try:
        found = inspect(argv[0], int(argv[1]) if len(argv) > 1 else 1)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        if os.environ.get("TFPLAN_DEBUG"):  # the whole traceback, indented under the line
            for line in traceback.format_exception(e.__cause__ or e):
                for part in line.rstrip().splitlines():
                    print(f"  {part}", file=sys.stderr)
        elif isinstance(e, UserCodeError):
            for frame in e.details():
                print(f"  {frame}", file=sys.stderr)
        return e.code
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    import shutil
    import tempfile

    from recipes.scratch import use_scratch

    scratch = use_scratch(Path(tempfile.mkdtemp(prefix="tfplan-inspect-")))
    code = main(sys.argv[1:])
    sys.stdout.flush()
    shutil.rmtree(scratch, ignore_errors=True)  # os._exit skips autograph's own clean-up
    os._exit(code)
