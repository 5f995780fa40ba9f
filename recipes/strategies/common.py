"""What the two TF2 strategies share: variables, optimizer, checkpoints, progress, result.json.

Both run eagerly (``tf.function`` steps), unlike the TF1 recipes. They keep the TF1 recipes'
outputs: ``model.ckpt-<step>`` checkpoints listed in ``output_dir/checkpoint`` (TF2's object
format, which ``recipes/evaluator.py`` reads as well), TensorBoard scalars ``loss``, ``accuracy``,
``learning_rate`` and ``global_step/sec`` in ``output_dir``, ``step=N loss=... examples_per_sec=...``
lines and the chief's ``result.json`` with the keys of ``recipes/replica.py``: it describes the
final checkpoint (its step, and its weights restored from disk by the evaluator's
``CheckpointScorer``), as the TF1 recipes' does.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from recipes.config import ConfigError, RunConfig, TaskInfo
from recipes.evaluator import CheckpointScorer, final_line, result_scores
from recipes.models import Params
from recipes.replica import write_json_atomic
from recipes.strategies import CKPT_KEY_SUFFIX
from recipes.workload import Workload

__all__ = [
    "CKPT_KEY_SUFFIX",
    "EXIT_GROUP_LOST",
    "Checkpoints",
    "Optimizer",
    "Progress",
    "first_line",
    "stream_seed",
    "write_result",
]

Log = Callable[[str], None]
EXIT_GROUP_LOST = 5  # a peer (allreduce) or a parameter server (pss) was lost: restart, resume
CKPT_NAME = "model.ckpt"
KEEP_CHECKPOINTS = 5  # as tf.compat.v1.train.Saver's default max_to_keep


def stream_seed(cfg: RunConfig, replica: int, start_step: int) -> int:
    """The minibatch stream's seed: per replica as in the TF1 recipes, and per start step, so
    that a resumed run does not replay the batches it trained on before."""
    return (cfg.trainer.seed * 1000 + replica + 7919 * start_step) % (2**32)


def first_line(e: BaseException) -> str:
    """The first telling line of an error message (TF's run to dozens of lines and start with
    generic ones such as "Graph execution error:"), at most 200 characters."""
    generic = ("Graph execution error", "Detected at node", "<stack traces", "File ")
    for line in str(e).splitlines():
        line = line.strip()
        if line and not line.startswith(generic) and "root error(s) found" not in line:
            return line[:200]
    return type(e).__name__


class Optimizer:
    """``algo.optimizer`` with tf.compat.v1's update rules (as the TF1 recipes use them), for
    eager variables, distributed ones included: ``sgd``; ``momentum`` (0.9: a <- 0.9 a + g,
    w <- w - lr a); ``adagrad`` (accumulator from 0.1: a <- a + g^2, w <- w - lr g / sqrt(a));
    ``adam`` (0.9, 0.999, 1e-8, bias correction with t = global step + 1).

    Why not a Keras optimizer: Keras 3 optimizers track their own ``keras.Variable`` state and
    step counter; these few lines keep the slots in our checkpoints under plain names.
    """

    SLOTS = {"sgd": (), "momentum": ("momentum",), "adagrad": ("accumulator",), "adam": ("m", "v")}

    def __init__(self, name: str, lr: float) -> None:
        name = name.lower()
        if name not in self.SLOTS:
            raise ValueError(f"unknown optimizer '{name}'; valid: sgd, adagrad, adam, momentum")
        self.name = name
        self.lr = float(lr)

    def create_slots(
        self, params: Params, colocate: Callable[[Any], AbstractContextManager[Any]] | None = None
    ) -> Params:
        """One slot per parameter and slot kind, keyed ``<slot>/<param>``, next to its variable."""
        slots: Params = {}
        for pname, var in params.items():
            for slot in self.SLOTS[self.name]:
                with colocate(var) if colocate else nullcontext():
                    init = 0.1 if slot == "accumulator" else 0.0
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
            if self.name == "sgd":
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


def _tree(flat: Params) -> tf.Module:
    """Nest ``{"dense0/w": var}`` as modules, so the checkpoint key is ``.../dense0/w/...``."""
    root = tf.Module()
    for key, var in flat.items():
        node = root
        *path, leaf = key.split("/")
        for part in path:
            if part not in vars(node):
                setattr(node, part, tf.Module())
            node = getattr(node, part)
        setattr(node, leaf, var)
    return root


class Checkpoints:
    """``output_dir/model.ckpt-<step>`` in TF2's object format, the last 5 kept, listed in
    ``output_dir/checkpoint`` (so ``tf.train.latest_checkpoint`` and the evaluator find them),
    written and read by the task that owns this object (the chief), on its own host.

    Keys: ``global_step``, ``model/<param>`` (e.g. ``model/dense0/w``; the model's non-trainable
    state too, e.g. a batch norm's ``moving_mean``) and ``optimizer/<slot>/<param>``, each
    followed by ``/.ATTRIBUTES/VARIABLE_VALUE``. Written with
    ``Checkpoint.write`` (no save counter: one more variable that TF would create lazily, and
    in a distribution scope on one task only).
    """

    def __init__(
        self,
        output_dir: str,
        step: Any,
        params: Params,
        slots: Params,
        task: Optional[TaskInfo] = None,
        state: Optional[Params] = None,
    ) -> None:
        self.output_dir = output_dir
        self._params = {**params, **(state or {})}
        self._ckpt = tf.train.Checkpoint(
            global_step=step, model=_tree(self._params), optimizer=_tree(slots)
        )
        # Why: by default each variable's device does the file I/O, so pss's ps would write
        # (and read) their shards on their own hosts; every read and write of the checkpoint
        # happens here instead, on this task's host (TF 2.21, hosts without a shared folder).
        self._options = tf.train.CheckpointOptions(
            experimental_io_device=f"/job:{task.type}/replica:0/task:{task.index}/device:CPU:0"
            if task is not None
            else None
        )
        self.last_step: Optional[int] = None
        self.last_path: Optional[str] = None  # the checkpoint of last_step

    def _kept(self) -> list[str]:
        state = tf.train.get_checkpoint_state(self.output_dir)
        return list(state.all_model_checkpoint_paths) if state else []

    def write(self, step: int) -> str:
        os.makedirs(self.output_dir, exist_ok=True)
        prefix = os.path.join(self.output_dir, f"{CKPT_NAME}-{step}")
        path = str(self._ckpt.write(prefix, options=self._options))
        kept = [p for p in self._kept() if os.path.basename(p) != os.path.basename(path)]
        kept.append(path)
        for old in kept[:-KEEP_CHECKPOINTS]:
            for f in tf.io.gfile.glob(old + ".*"):
                tf.io.gfile.remove(f)
        kept = kept[-KEEP_CHECKPOINTS:]
        tf.compat.v1.train.update_checkpoint_state(
            self.output_dir,
            os.path.basename(path),
            all_model_checkpoint_paths=[os.path.basename(p) for p in kept],
        )
        self.last_step, self.last_path = step, path
        return path

    def restore_latest(self) -> Optional[int]:
        """Restore the newest checkpoint of ``output_dir``; its step, or None when there is none.

        Raises:
            ConfigError: the checkpoint is not one of these strategies' (another algorithm's,
                or another model's): resume needs the same experiment setup.
        """
        path = tf.train.latest_checkpoint(self.output_dir)
        if path is None:
            return None
        reader = tf.train.load_checkpoint(path)
        shapes = reader.get_variable_to_shape_map()
        for name, var in {
            "global_step": None,
            **{f"model/{k}": v for k, v in self._params.items()},
        }.items():
            key = name + CKPT_KEY_SUFFIX
            if key not in shapes or (var is not None and list(shapes[key]) != list(var.shape)):
                raise ConfigError(
                    f"checkpoint {path} does not hold {name} as this run builds it (another "
                    "algorithm or model wrote it?): use a new experiment.id or output_dir"
                )
        # expect_partial: the optimizer's slots may differ (a changed algo.optimizer starts fresh
        # slots), the model and the step may not (checked above).
        self._ckpt.read(path, options=self._options).expect_partial()
        self.last_step = int(reader.get_tensor("global_step" + CKPT_KEY_SUFFIX))
        self.last_path = path
        return self.last_step


class Progress:
    """Progress lines on every task that logs, TensorBoard scalars on the chief."""

    def __init__(
        self,
        cfg: RunConfig,
        examples_per_step: int,
        process_start: float,
        is_chief: bool,
        log: Log,
    ) -> None:
        self.cfg = cfg
        self.examples_per_step = examples_per_step
        self.process_start = process_start
        self.log = log
        self.writer = tf.summary.create_file_writer(cfg.output_dir) if is_chief else None
        self.recent: deque[float] = deque(maxlen=20)
        self.first_gs: Optional[int] = None
        self.t_start = self.t_last = time.monotonic()
        self._log_gs = self._sum_gs = 0
        self._log_t = self._sum_t = self.t_start

    def update(
        self, gs: int, losses: Iterable[float], metrics: Optional[dict[str, float]] = None
    ) -> None:
        """Record the global step ``gs`` reached, the minibatch losses since the last call and
        the last minibatch's metrics (``model.metrics``)."""
        losses = list(losses)
        self.recent.extend(losses)
        now = self.t_last = time.monotonic()
        t = self.cfg.trainer
        if self.first_gs is None:
            self.first_gs, self.t_start = gs, now
            self._log_gs = self._sum_gs = gs
            self._log_t = self._sum_t = now
            self.log(
                f"step={gs} loss={losses[-1]:.4f} first step "
                f"{time.time() - self.process_start:.2f}s after launch"
            )
        elif gs // t.log_steps > self._log_gs // t.log_steps:
            rate = (gs - self._log_gs) * self.examples_per_step / max(now - self._log_t, 1e-9)
            self.log(f"step={gs} loss={np.mean(self.recent):.4f} examples_per_sec={rate:.1f}")
            self._log_gs, self._log_t = gs, now
        if self.writer is not None and (
            gs == self.first_gs or gs // t.summary_steps > self._sum_gs // t.summary_steps
        ):
            with self.writer.as_default():
                tf.summary.scalar("loss", losses[-1], step=gs)
                for name, value in (metrics or {}).items():
                    tf.summary.scalar(name, value, step=gs)
                tf.summary.scalar("learning_rate", self.cfg.algo.lr, step=gs)
                if gs > self._sum_gs:
                    per_sec = (gs - self._sum_gs) / max(now - self._sum_t, 1e-9)
                    tf.summary.scalar("global_step/sec", per_sec, step=gs)
            self.writer.flush()
            self._sum_gs, self._sum_t = gs, now

    @property
    def wall(self) -> float:
        return time.monotonic() - self.t_start if self.first_gs is not None else 0.0

    @property
    def train_secs(self) -> float:
        """From the first to the last step recorded (the TF1 recipes' wall time): not the end
        barrier, the final checkpoint or its scoring, which come after."""
        return self.t_last - self.t_start if self.first_gs is not None else 0.0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def write_result(
    cfg: RunConfig,
    ckpt: str,
    work: Workload,
    progress: Progress,
    replicas: int,
    n_ps: int,
    log: Log,
    threads: int = 0,
) -> dict[str, Any]:
    """``result.json`` with the keys of ``recipes/replica.py``, describing the final checkpoint
    ``ckpt``: its stored global step, and its weights restored from disk (as the evaluator
    restores them) scored on up to 5,000 training examples (``loss``) and on the held-out split.
    """
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads
    )
    gs, scores = result_scores(CheckpointScorer(work, config), ckpt)
    first = progress.first_gs if progress.first_gs is not None else gs
    wall = progress.train_secs
    result = {
        "status": "succeeded",
        "global_step": gs,
        "last_batch_loss": round(float(np.mean(progress.recent)), 6)
        if progress.recent
        else float("nan"),
        **scores,
        "examples_per_sec": round((gs - first) * progress.examples_per_step / max(wall, 1e-9), 1),
        "wall_time_secs": round(wall, 3),
        "algo": cfg.algo.name,
        "replicas": replicas,
        "ps": n_ps,
        "checkpoint": os.path.basename(ckpt),  # the one whose step and weights these are
    }
    write_json_atomic(os.path.join(cfg.output_dir, "result.json"), result)
    log(f"step={gs} final: {final_line(result)}")
    return result
