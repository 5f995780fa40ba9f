"""The lines and files tfplan reads from a training task, written in one place for every
training path (the TF1 replicas, the TF2 strategies, the evaluator): docs/contract.md is their
specification, tfplan's engine and sweeps parse them.

- progress lines on stdout: ``step=N loss=L first step Ts after launch``, then one
  ``step=N loss=L examples_per_sec=R`` every ``trainer.log_steps`` global steps, and
  ``step=N loss=L back from global step M`` when the global step went back (a ps restarted and
  the chief restored a checkpoint);
- the chief's ``result.json`` (written atomically) and its last line, ``step=N final: loss=...``;
- the evaluator's ``eval step=N accuracy=... loss=...`` lines and ``eval/metrics.jsonl``.

Stdlib only (no TensorFlow): what a task prints does not depend on how it trains.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Callable, Optional

from recipes.vocabulary import METRICS

__all__ = [
    "METRIC_KEYS",
    "ProgressLog",
    "append_eval_record",
    "eval_line",
    "final_line",
    "read_result_step",
    "result_record",
    "write_json_atomic",
    "write_result",
]

Log = Callable[[str], None]
METRIC_KEYS = METRICS  # the metrics result.json may hold (model.metrics)
RESULT_FILE = "result.json"
RECENT_LOSSES = 20  # the progress lines' loss is the mean of the last 20 minibatches


def write_json_atomic(path: str, obj: dict[str, Any]) -> None:
    """Write ``obj`` as JSON through a temporary file and a rename: a reader (the evaluator,
    tfplan) never sees half a file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return math.fsum(values) / len(values) if values else float("nan")


MIN_RATE_SECS = 1.0  # a task's own window shorter than this says nothing of the job's speed


class ProgressLog:
    """The progress lines of one training task, and what its result says of its speed.

    ``examples_per_step``: examples trained per global step (minibatch size times the
    minibatches a global step takes), for ``examples_per_sec``.
    """

    def __init__(
        self, examples_per_step: int, log_steps: int, process_start: float, log: Log
    ) -> None:
        self.examples_per_step = examples_per_step
        self.log_steps = max(1, int(log_steps))
        self.process_start = process_start
        self.log = log
        self.recent: deque[float] = deque(maxlen=RECENT_LOSSES)
        self.first_gs: Optional[int] = None
        self.t_start = self.t_last = time.monotonic()
        # (when it ended, seconds) of each checkpoint written since the first step
        self.pauses: list[tuple[float, float]] = []
        self._prev_gs = 0
        self._log_gs, self._log_t = 0, self.t_start

    def step(self, gs: int, losses: Iterable[float]) -> None:
        """Record that the global step ``gs`` was reached, with the minibatch losses since the
        last call (at least one)."""
        losses = [float(x) for x in losses]
        self.recent.extend(losses)
        now = self.t_last = time.monotonic()
        if self.first_gs is None:
            self.first_gs, self.t_start = gs, now
            self._log_gs, self._log_t = gs, now
            self.log(
                f"step={gs} loss={losses[-1]:.4f} first step "
                f"{time.time() - self.process_start:.2f}s after launch"
            )
        elif gs < self._prev_gs:  # a restarted ps: the chief restored a checkpoint
            self.log(f"step={gs} loss={losses[-1]:.4f} back from global step {self._prev_gs}")
            self._log_gs, self._log_t = gs, now
        elif gs // self.log_steps > self._log_gs // self.log_steps:
            rate = (gs - self._log_gs) * self.examples_per_step / max(now - self._log_t, 1e-9)
            self.log(f"step={gs} loss={_mean(self.recent):.4f} examples_per_sec={rate:.1f}")
            self._log_gs, self._log_t = gs, now
        self._prev_gs = gs

    def pause(self, secs: float) -> None:
        """The last ``secs`` went to something other than training (a checkpoint written):
        from the first step on and up to the last, they are left out of :attr:`train_secs`
        (the one the saver writes as the session ends comes after the last step: not counted)."""
        if self.first_gs is not None:
            self.pauses.append((time.monotonic(), secs))

    @property
    def started(self) -> bool:
        return self.first_gs is not None

    @property
    def train_secs(self) -> float:
        """From the first to the last step recorded, less the checkpoints written meanwhile
        (:meth:`pause`): not the end barrier, the checkpoints or the final scoring."""
        if self.first_gs is None:
            return 0.0
        paused = sum(secs for ended, secs in self.pauses if ended <= self.t_last)
        return self.t_last - self.t_start - paused

    def examples_per_sec(self, global_step: int) -> float:
        """The job's speed as this task saw it: the global steps made between its first and
        its last step, over that time. A task that saw less than a second of it (a chief whose
        workers did nearly every step before it got its first) says the job's mean since this
        task started instead, which counts its start-up: lower than the truth, never absurd
        (the steps others made before its first step over its own few milliseconds gave 6e10)."""
        seen = self._prev_gs - self.first_gs if self.first_gs is not None else 0
        if self.train_secs >= MIN_RATE_SECS and seen > 0:
            return seen * self.examples_per_step / self.train_secs
        since_start = max(time.time() - self.process_start, 1e-3)
        return global_step * self.examples_per_step / since_start

    @property
    def last_batch_loss(self) -> float:
        """The mean loss of the last minibatches (NaN before any)."""
        return _mean(self.recent)


def result_record(
    progress: ProgressLog,
    global_step: int,
    scores: dict[str, float],
    algo: str,
    replicas: int,
    n_ps: int,
    checkpoint: str,
) -> dict[str, Any]:
    """What ``result.json`` holds: the final checkpoint's stored ``global_step`` and
    ``scores`` (its weights, restored from disk), this task's speed, and the cluster."""
    wall = progress.train_secs
    return {
        "status": "succeeded",
        "global_step": global_step,
        "last_batch_loss": round(progress.last_batch_loss, 6),
        **scores,
        "examples_per_sec": round(progress.examples_per_sec(global_step), 1),
        "wall_time_secs": round(wall, 3),
        "algo": algo,
        "replicas": replicas,
        "ps": n_ps,
        "checkpoint": os.path.basename(checkpoint),  # the one whose step and weights these are
    }


def final_line(result: dict[str, Any]) -> str:
    """``loss=... accuracy=... examples_per_sec=...``: the chief's last line."""
    keys = ["loss", *(k for k in result if k in METRIC_KEYS), "examples_per_sec"]
    return " ".join(f"{k}={result[k]}" for k in keys if k in result)


def write_result(output_dir: str, result: dict[str, Any], log: Log) -> None:
    """Write ``output_dir/result.json`` atomically, then the chief's final line."""
    write_json_atomic(os.path.join(output_dir, RESULT_FILE), result)
    log(f"step={result['global_step']} final: {final_line(result)}")


def read_result_step(path: str) -> Optional[int]:
    """The ``global_step`` of a ``result.json``; None when it is not there or not whole."""
    try:
        with open(path, encoding="utf-8") as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def eval_line(step: int, scores: dict[str, float]) -> str:
    """``eval step=N accuracy=... loss=...``: what sweeps' pruning reads."""
    shown = " ".join(f"{k}={v:.4f}" for k, v in scores.items() if k != "loss")
    return f"eval step={step} {shown} loss={scores['loss']:.4f}".replace("  ", " ")


def append_eval_record(path: str, step: int, scores: dict[str, float], checkpoint: str) -> None:
    """One line of ``eval/metrics.jsonl``."""
    line = {
        "global_step": step,
        **{name: round(value, 6) for name, value in scores.items()},
        "time": round(time.time(), 3),
        "checkpoint": os.path.basename(checkpoint),
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
