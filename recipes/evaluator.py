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

import os
import time
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from recipes.checkpoint_names import GLOBAL_STEP, PART, model_name, sliced_names, stored
from recipes.checkpoint_rows import CheckpointRows, TableShape
from recipes.config import RunConfig
from recipes.reporting import append_eval_record, eval_line, read_result_step
from recipes.sparse_lookup import rows_from
from recipes.workload import Workload

__all__ = ["CheckpointScorer", "result_scores", "run_evaluator", "scoring_batch"]

v1 = tf.compat.v1

# Once a checkpoint at max_steps is evaluated, result.json is at most moments away: poll for it
# (or for the chief's final checkpoint) this often instead of every eval_secs.
FINAL_POLL_SECS = 0.1
# result.json's training loss is over at most this many training examples (the first ones).
TRAIN_SAMPLE = 5000
# Scored in batches of up to this many examples (never fewer than data.batch_size): a session
# run per training-sized batch cost more than the batch (a chief's final scores of a CTR model:
# 149 runs of 64 examples, 0.5 s more than 16 runs of 1,024). The scores are means over
# examples: the same in any batches (each batch's mean weighted by its size). Bounded by the
# inputs' bytes too (SCORING_BATCH_BYTES): a model of images is scored in training-sized
# batches, as its memory was sized for.
SCORING_BATCH = 1024
SCORING_BATCH_BYTES = 4 << 20


class CheckpointScorer:
    """The model's variables and ``global_step`` in a private graph and local session: restores
    a checkpoint from disk and scores the held-out data (or a sample of the training data) with
    those weights (never the live ps ones), batch by batch through ``tf.data``. An Embedding
    table larger than ``trainer.score_rows_bytes`` is not restored: each batch reads its rows
    from the checkpoint's files (recipes/checkpoint_rows.py), so the scorer never holds it."""

    def __init__(
        self, work: Workload, config: Optional[Any] = None, log: Callable[[str], None] = print
    ) -> None:
        self.work = work
        self.graph = v1.Graph()
        with self.graph.as_default():
            self._step = v1.train.get_or_create_global_step()
            self._params = work.model.create_params()
            self._state = work.model.state_variables()
            self._rows = _rows_read(work, log)
            by_rows = set(self._rows.tables) if self._rows else set()
            model_vars = {
                model_name(k): v
                for k, v in [*self._params.items(), *self._state.items()]
                if _table_path(k) not in by_rows
            }
            # a dynamic table's ids and rows in use (recipes/dynamic_table.py)
            model_vars.update(getattr(work.model, "dynamic_state", dict)())
            # A split table's parts as slices of its one name: a checkpoint of either format
            # holds the table whole, in slices, whatever number of ps wrote it.
            names = sliced_names({GLOBAL_STEP: self._step, **model_vars})
            self._saver = v1.train.Saver(var_list=names)
            # The same variables under the TF2 strategies' object-checkpoint keys.
            self._tf2_saver = v1.train.Saver(
                var_list={stored(name, True): v for name, v in names.items()}
            )
        self._splits: dict[str, tuple[Any, list[Any]]] = {}
        self._tables: Any = None
        self._sess = v1.Session(graph=self.graph, config=config)

    def restore(self, ckpt: str) -> int:
        """Load ``ckpt`` (either format); returns the global step stored in it.

        Raises:
            tf.errors.NotFoundError, tf.errors.DataLossError, ValueError: rotated away or torn.
        """
        tf2 = tf.train.load_checkpoint(ckpt).has_tensor(stored(GLOBAL_STEP, True))
        # In its own graph: the TF2 strategies' chiefs run eagerly, and Saver.restore outside
        # its graph takes the eager path, which cannot reach these graph variables.
        with self.graph.as_default():
            (self._tf2_saver if tf2 else self._saver).restore(self._sess, ckpt)
            if self._rows is not None:
                self._rows.open(ckpt, tf2)
            if self._tables is None:  # the model's own lookup tables (IntegerLookup's, ...)
                self._tables = v1.tables_initializer()
                self._sess.run(self._tables)
            return int(self._sess.run(self._step))

    def _split(self, split: str) -> tuple[Any, list[Any]]:
        """The initializer of ``split`` and one batch's fetches. Both splits go through one
        iterator and one forward pass (built at the first call): a model's forward graph is
        the costly part of scoring (about a second of CPU for a CTR model of 26 tables)."""
        if not self._splits:
            with self.graph.as_default():
                batch = scoring_batch(self.work.spec.features)
                datasets = {
                    "eval": self.work.eval_dataset(min_batch=batch),
                    "train": self.work.train_sample_dataset(TRAIN_SAMPLE, batch),
                }
                shapes = [v1.data.get_output_shapes(d) for d in datasets.values()]
                iterator = v1.data.Iterator.from_structure(
                    v1.data.get_output_types(datasets["eval"]),
                    tf.nest.map_structure(
                        lambda a, b: a.most_specific_compatible_shape(b), *shapes
                    ),
                )
                features, labels = iterator.get_next()
                with rows_from(self._rows.sources if self._rows else {}):
                    loss, metrics = self.work.scores(self._params, features, labels, self._state)
                size = tf.shape(tf.nest.flatten(labels)[0])[0]
                fetches = [size, loss, *metrics.values()]
                for name, dataset in datasets.items():
                    self._splits[name] = (iterator.make_initializer(dataset), fetches)
        return self._splits[split]

    def score(self, split: str = "eval") -> dict[str, float]:
        """``loss`` and each metric of the restored weights, averaged over every example of
        ``split`` (``eval``: the held-out data; ``train``: the first training examples).

        Raises:
            recipes.inputs.InputError: the split holds no example.
        """
        init, fetches = self._split(split)
        names = ["loss", *self.work.metric_names()]
        totals, count = [0.0] * len(names), 0
        with self.graph.as_default():
            self._sess.run(init)
            while True:
                try:
                    n, *values = self._sess.run(fetches)
                except tf.errors.OutOfRangeError:
                    break
                count += int(n)
                totals = [t + float(v) * int(n) for t, v in zip(totals, values, strict=True)]
        if count == 0:
            from recipes.inputs import InputError

            raise InputError(f"the {split} data holds no example to score")
        return {name: total / count for name, total in zip(names, totals, strict=True)}

    def close(self) -> None:
        self._sess.close()
        if self._rows is not None:
            self._rows.close()


def _table_path(key: str) -> str:
    """The variable a parameter key belongs to: a split table's part's table."""
    part = PART.search(key)
    return key[: part.start()] if part else key


def _rows_read(work: Workload, log: Callable[[str], None]) -> Optional[CheckpointRows]:
    """The tables of ``work``'s model (built in the current graph) that are scored by rows:
    its row-read Embedding tables larger than ``trainer.score_rows_bytes``; None when none is."""
    limit = work.cfg.trainer.score_rows_bytes
    shapes: dict[str, tuple[tuple[int, ...], str]] = getattr(
        work.model, "sparse_table_shapes", dict
    )()
    if limit is None or not shapes:
        return None
    tables = {}
    for path, (shape, dtype) in shapes.items():
        size = np.dtype(dtype).itemsize
        for d in shape:
            size *= d
        if size > limit:
            tables[path] = TableShape(shape, dtype)
    if not tables:
        return None
    total = sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in tables.values())
    log(
        f"scoring: {len(tables)} table(s) of {total / 2**20:,.1f} MiB read from each checkpoint "
        f"row by row, not loaded (trainer.score_rows_bytes={limit:,})"
    )
    return CheckpointRows(tables, log)


def scoring_batch(features: dict[str, tuple[tuple[int, ...], str]]) -> int:
    """The examples a scoring batch may hold (data.batch_size still when larger): up to
    :data:`SCORING_BATCH`, as many as :data:`SCORING_BATCH_BYTES` of the inputs hold."""
    size = 0
    for shape, dtype in features.values():
        count = 1
        for dim in shape:
            count *= max(int(dim), 1)
        size += count * (64 if dtype == "string" else tf.as_dtype(dtype).size)
    return max(1, min(SCORING_BATCH, SCORING_BATCH_BYTES // max(size, 1)))


def result_scores(scorer: CheckpointScorer, ckpt: str) -> tuple[int, dict[str, float]]:
    """What result.json says of the checkpoint ``ckpt``: its global step, and ``loss`` (on the
    first training examples), ``eval_loss`` and each metric (held-out), rounded. Closes
    ``scorer``."""
    try:
        gs = scorer.restore(ckpt)
        held_out = scorer.score("eval")
        train = scorer.score("train")
    finally:
        scorer.close()
    scores = {"loss": round(train["loss"], 6)}
    scores.update({k: round(v, 6) for k, v in held_out.items() if k != "loss"})
    scores["eval_loss"] = round(held_out["loss"], 6)
    return gs, scores


def _identity(path: str) -> Optional[tuple[int, int, int]]:
    """Which file ``path`` is right now (inode, size, mtime), or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def run_evaluator(
    cfg: RunConfig,
    log: Callable[[str], None] = print,
    timeout: Optional[float] = None,
    partitions: int = 1,
) -> int:
    """Evaluate checkpoints until the final one; returns the exit code. ``partitions``: the
    cluster's ps count (the training tasks split large variables over them)."""
    work = Workload.of(cfg, partitions)
    eval_dir = os.path.join(cfg.output_dir, "eval")
    os.makedirs(eval_dir, exist_ok=True)
    metrics_path = os.path.join(eval_dir, "metrics.jsonl")
    result_path = os.path.join(cfg.output_dir, "result.json")
    scorer = CheckpointScorer(work)
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
                scores = scorer.score("eval")
                _record(writer, metrics_path, step, scores, ckpt)
                log(eval_line(step, scores))
                last, last_step = ckpt, step
                continue
            current = _identity(result_path)
            final = (
                read_result_step(result_path) if current is not None and current != stale else None
            )
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


def _record(writer: Any, path: str, step: int, scores: dict[str, float], ckpt: str) -> None:
    summary = v1.Summary(
        value=[
            v1.Summary.Value(tag=f"eval/{name}", simple_value=value)
            for name, value in scores.items()
        ]
    )
    writer.add_summary(summary, step)
    writer.flush()
    append_eval_record(path, step, scores, ckpt)
