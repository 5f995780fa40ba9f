"""What the two TF2 strategies share besides their update rule (``optimizer.py``) and their
checkpoints (``checkpoints.py``): the minibatch stream's seed, progress (the lines of
``recipes/reporting.py`` plus TensorBoard scalars ``loss``, ``accuracy``, ``learning_rate`` and
``global_step/sec`` in ``output_dir``, as the TF1 recipes' hooks write them) and the chief's
``result.json``, which describes the final checkpoint (its step, and its weights restored from
disk by the evaluator's ``CheckpointScorer``), as the TF1 recipes' does.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Callable, Optional

import tensorflow as tf

from recipes.config import RunConfig
from recipes.evaluator import CheckpointScorer, result_scores
from recipes.export import export_final
from recipes.reporting import ProgressLog, result_record
from recipes.reporting import write_result as write_result_file
from recipes.workload import Workload

__all__ = ["Log", "Progress", "stream_seed", "write_result"]

Log = Callable[[str], None]


def stream_seed(cfg: RunConfig, replica: int, start_step: int) -> int:
    """The minibatch stream's seed: per replica as in the TF1 recipes, and per start step, so
    that a resumed run does not replay the batches it trained on before."""
    return (cfg.trainer.seed * 1000 + replica + 7919 * start_step) % (2**32)


class Progress(ProgressLog):
    """Progress lines on every task that logs, TensorBoard scalars on the chief."""

    def __init__(
        self,
        cfg: RunConfig,
        examples_per_step: int,
        process_start: float,
        is_chief: bool,
        log: Log,
    ) -> None:
        super().__init__(examples_per_step, cfg.trainer.log_steps, process_start, log)
        self.cfg = cfg
        self.writer = tf.summary.create_file_writer(cfg.output_dir) if is_chief else None
        self._sum_gs, self._sum_t = 0, self.t_start

    def update(
        self, gs: int, losses: Iterable[float], metrics: Optional[dict[str, float]] = None
    ) -> None:
        """Record the global step ``gs`` reached, the minibatch losses since the last call and
        the last minibatch's metrics (``model.metrics``)."""
        losses = [float(x) for x in losses]
        first = not self.started
        self.step(gs, losses)
        now = self.t_last
        if first:
            self._sum_gs, self._sum_t = gs, now
        every = self.cfg.trainer.summary_steps
        if self.writer is not None and (first or gs // every > self._sum_gs // every):
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
        return time.monotonic() - self.t_start if self.started else 0.0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def write_result(
    cfg: RunConfig,
    ckpt: str,
    work: Workload,
    progress: ProgressLog,
    replicas: int,
    n_ps: int,
    log: Log,
    threads: int = 0,
) -> None:
    """``result.json`` (recipes/reporting.py), describing the final checkpoint ``ckpt``: its
    stored global step, and its weights restored from disk (as the evaluator restores them)
    scored on up to 5,000 training examples (``loss``) and on the held-out split. Then a
    user's Keras model is exported from the same checkpoint to ``output_dir/model.keras``,
    in-process (these chiefs run eagerly, as Keras saves); a failed export is a warning line."""
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads
    )
    gs, scores = result_scores(CheckpointScorer(work, config), ckpt)
    result = result_record(progress, gs, scores, cfg.algo.name, replicas, n_ps, ckpt)
    write_result_file(cfg.output_dir, result, log)
    export_final(cfg, ckpt, log)
