"""The evaluator: scores every new checkpoint on the held-out split.

It is not part of the cluster (TensorFlow's convention): it only reads checkpoints from
``output_dir``. For each new one it writes TensorBoard scalars under ``output_dir/eval`` and one
line to ``output_dir/eval/metrics.jsonl``. It exits 0 once the chief's ``result.json`` is there
and the checkpoint of its ``global_step`` has been evaluated: the chief may save its final
checkpoint after one that already passed ``max_steps`` (a straggler's step, see
docs/runtime.md), so reaching ``max_steps`` alone is not the end. A ``result.json`` that was there
before the evaluator started counts only once it has been rewritten: it is an earlier run's.
:class:`CheckpointScorer` is also what the chiefs use to score their final checkpoint for
``result.json``.

Both checkpoint formats are read: the TF1 recipes' name-based ones (``model/dense0/w``) and the
TF2 strategies' object-based ones (``model/dense0/w/.ATTRIBUTES/VARIABLE_VALUE``); the format is
told apart per checkpoint by its ``global_step`` key.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from recipes import data as data_mod
from recipes.config import RunConfig
from recipes.models import Model, loss_and_accuracy
from recipes.strategies import CKPT_KEY_SUFFIX

__all__ = ["CheckpointScorer", "run_evaluator"]

v1 = tf.compat.v1

# Once a checkpoint at max_steps is evaluated, result.json is at most moments away: poll for it
# (or for the chief's final checkpoint) this often instead of every eval_secs.
FINAL_POLL_SECS = 0.1


class CheckpointScorer:
    """The model's variables and ``global_step`` in a private graph and local session: restores
    a checkpoint from disk and scores any split with those weights (never the live ps ones)."""

    def __init__(self, cfg: RunConfig, dim: int, config: Optional[Any] = None) -> None:
        model = Model(cfg.model, cfg.data.image_size, cfg.data.channels, cfg.data.num_classes)
        self.graph = v1.Graph()
        with self.graph.as_default():
            self._x = v1.placeholder(tf.float32, [None, dim])
            self._y = v1.placeholder(tf.int64, [None])
            self._step = v1.train.get_or_create_global_step()
            params = model.create_params()
            self._loss, self._accuracy = loss_and_accuracy(model.logits(params, self._x), self._y)
            self._saver = v1.train.Saver(var_list=[self._step, *params.values()])
            # The same variables under the TF2 strategies' object-checkpoint keys.
            self._tf2_saver = v1.train.Saver(
                var_list={
                    "global_step" + CKPT_KEY_SUFFIX: self._step,
                    **{f"model/{k}{CKPT_KEY_SUFFIX}": v for k, v in params.items()},
                }
            )
        self._sess = v1.Session(graph=self.graph, config=config)

    def restore(self, ckpt: str) -> int:
        """Load ``ckpt`` (either format); returns the global step stored in it.

        Raises:
            tf.errors.NotFoundError, tf.errors.DataLossError, ValueError: rotated away or torn.
        """
        tf2 = tf.train.load_checkpoint(ckpt).has_tensor("global_step" + CKPT_KEY_SUFFIX)
        # In its own graph: the TF2 strategies' chiefs run eagerly, and Saver.restore outside
        # its graph takes the eager path, which cannot reach these graph variables.
        with self.graph.as_default():
            (self._tf2_saver if tf2 else self._saver).restore(self._sess, ckpt)
            return int(self._sess.run(self._step))

    def score(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """(loss, accuracy) of the restored weights on ``x``, ``y``."""
        with self.graph.as_default():
            loss, acc = self._sess.run([self._loss, self._accuracy], {self._x: x, self._y: y})
        return float(loss), float(acc)

    def close(self) -> None:
        self._sess.close()


def _identity(path: str) -> Optional[tuple[int, int, int]]:
    """Which file ``path`` is right now (inode, size, mtime), or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _result_step(path: str) -> Optional[int]:
    try:
        with open(path, encoding="utf-8") as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_evaluator(
    cfg: RunConfig, log: Callable[[str], None] = print, timeout: Optional[float] = None
) -> int:
    """Evaluate checkpoints until the final one; returns the exit code."""
    ds = data_mod.load(cfg.data)
    eval_dir = os.path.join(cfg.output_dir, "eval")
    os.makedirs(eval_dir, exist_ok=True)
    metrics_path = os.path.join(eval_dir, "metrics.jsonl")
    result_path = os.path.join(cfg.output_dir, "result.json")
    scorer = CheckpointScorer(cfg, ds.dim)
    writer = v1.summary.FileWriter(eval_dir, graph=None)
    log(f"evaluator watching {cfg.output_dir} every {cfg.trainer.eval_secs}s")
    deadline = None if timeout is None else time.monotonic() + timeout
    # A result.json already there at start is an earlier run's until it is rewritten: the chief
    # deletes it when it starts, but an evaluator that started faster saw it first and stopped
    # at the old step (seen with a resumed run). Rewritten (atomically: a new inode), it counts.
    stale = _identity(result_path)
    last: Optional[str] = None
    last_step = -1
    try:
        while deadline is None or time.monotonic() < deadline:
            ckpt = tf.train.latest_checkpoint(cfg.output_dir)
            if ckpt and ckpt != last:
                try:
                    step = scorer.restore(ckpt)
                except (tf.errors.NotFoundError, tf.errors.DataLossError, ValueError):
                    time.sleep(0.2)  # rotated away or half-written: take the next one
                    continue
                eval_loss, acc = scorer.score(ds.x_eval, ds.y_eval)
                _record(writer, metrics_path, step, eval_loss, acc, ckpt)
                log(f"eval step={step} accuracy={acc:.4f} loss={eval_loss:.4f}")
                last, last_step = ckpt, step
                continue
            current = _identity(result_path)
            final = _result_step(result_path) if current is not None and current != stale else None
            if final is not None and last_step >= final:
                break
            if last_step >= cfg.trainer.max_steps:
                time.sleep(min(cfg.trainer.eval_secs, FINAL_POLL_SECS))
            else:
                time.sleep(cfg.trainer.eval_secs)
        else:
            log("evaluator timed out")
            return 1
    finally:
        scorer.close()
    writer.close()
    log(f"evaluator done at step={last_step}")
    return 0


def _record(writer: Any, path: str, step: int, loss: float, acc: float, ckpt: str) -> None:
    summary = v1.Summary(
        value=[
            v1.Summary.Value(tag="eval/accuracy", simple_value=acc),
            v1.Summary.Value(tag="eval/loss", simple_value=loss),
        ]
    )
    writer.add_summary(summary, step)
    writer.flush()
    line = {
        "global_step": step,
        "accuracy": round(acc, 6),
        "loss": round(loss, 6),
        "time": round(time.time(), 3),
        "checkpoint": os.path.basename(ckpt),
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
