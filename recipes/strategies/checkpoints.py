"""The TF2 strategies' checkpoints: ``output_dir/model.ckpt-<step>`` in TF2's object format, read
and written by the chief on its own host (the evaluator reads them too: recipes/checkpoint_names.py
says how their keys differ from the TF1 recipes')."""

from __future__ import annotations

import os
from typing import Any, Optional

import tensorflow as tf

from recipes.checkpoint_names import (
    DYNAMIC_PREFIX,
    GLOBAL_STEP,
    PART,
    PlainNames,
    model_name,
    stored,
)
from recipes.config import TaskInfo
from recipes.dynamic_reshard import checkpoint_shards, resharded
from recipes.dynamic_table import DynamicTable
from recipes.errors import ConfigError
from recipes.models import Params

__all__ = ["CKPT_NAME", "Checkpoints"]

CKPT_NAME = "model.ckpt"


def _joined(flat: Params) -> Params:
    """``flat`` with the parts of each split variable (``<path>/part_<i>``, rows in order, as
    recipes/keras_model.py splits a table over the ps) as one ``ShardedVariable`` at ``<path>``:
    TensorFlow's own container of a variable split by rows, which a checkpoint stores as one
    tensor in slices and restores into any other number of parts (resharding, as the TF1
    recipes' checkpoints do). Its parts stay where they were placed; nothing is copied."""
    parts: dict[str, dict[int, Any]] = {}
    out: Params = {}
    for key, var in flat.items():
        match = PART.search(key)
        if match is None:
            out[key] = var
        else:
            parts.setdefault(key[: match.start()], {})[int(match[1])] = var
    for whole, by_index in parts.items():
        ordered = [by_index[i] for i in sorted(by_index)]
        out[whole] = tf.__internal__.distribute.ShardedVariable(ordered, name=whole)
    return out


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
    """``output_dir/model.ckpt-<step>`` in TF2's object format, the last ``keep`` kept, listed in
    ``output_dir/checkpoint`` (so ``tf.train.latest_checkpoint`` and the evaluator find them),
    written and read by the task that owns this object (the chief), on its own host.

    Keys: ``global_step``, ``model/<param>`` (e.g. ``model/dense0/w``; the model's non-trainable
    state too, e.g. a batch norm's ``moving_mean``) and ``optimizer/<slot>/<param>``, each
    followed by ``/.ATTRIBUTES/VARIABLE_VALUE``; a variable split over the ps is one key, its
    parts stored as slices of it (:func:`_joined`), so a resume with another number of ps
    restores it. A dynamic table (``tables``, by path): its shards' rows and slots as any
    parameter's, their other variables as ``dynamic/<path>/shard_<i>/<what>`` (the TF1
    recipes' names, with the suffix); restored into another number of shards, its ids are
    re-sharded by their hash (recipes/dynamic_reshard.py; ``slot_fills``: each optimizer slot's
    initial value, for rows the checkpoint has none of). Written with
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
        keep: int = 5,
        tables: Optional[dict[str, DynamicTable]] = None,
        slot_fills: Optional[dict[str, float]] = None,
    ) -> None:
        self.output_dir = output_dir
        self._keep = keep  # the newest kept (trainer.keep_checkpoints)
        self._step = step
        self._params = _joined({**params, **(state or {})})
        self._slots = dict(slots)
        self._tables = dict(tables or {})
        self._slot_fills = dict(slot_fills or {})
        self._ckpt = self._checkpoint(set())
        self.resharded: list[str] = []  # what the last restore re-sharded, one line per table
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

    def _checkpoint(self, leave_out: set[str]) -> Any:
        """The checkpoint object of everything but the dynamic tables at ``leave_out``."""

        def kept(key: str) -> bool:
            return not any(key.startswith(f"{p}/shard_") for p in leave_out)

        slots = {k: v for k, v in self._slots.items() if kept(k.split("/", 1)[-1])}
        dynamic = {
            name.removeprefix(DYNAMIC_PREFIX): var
            for path, table in self._tables.items()
            if path not in leave_out
            for name, var in table.named_state().items()
        }
        return tf.train.Checkpoint(
            global_step=self._step,
            model=_tree({k: v for k, v in self._params.items() if kept(k)}),
            optimizer=_tree(_joined(slots)),
            **({"dynamic": _tree(dynamic)} if dynamic else {}),
        )

    def _kept(self) -> list[str]:
        state = tf.train.get_checkpoint_state(self.output_dir)
        return list(state.all_model_checkpoint_paths) if state else []

    def write(self, step: int) -> str:
        os.makedirs(self.output_dir, exist_ok=True)
        prefix = os.path.join(self.output_dir, f"{CKPT_NAME}-{step}")
        path = str(self._ckpt.write(prefix, options=self._options))
        kept = [p for p in self._kept() if os.path.basename(p) != os.path.basename(path)]
        kept.append(path)
        for old in kept[: -self._keep]:
            for f in tf.io.gfile.glob(old + ".*"):
                tf.io.gfile.remove(f)
        kept = kept[-self._keep :]
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
        plain = PlainNames(reader)
        moved = {
            p
            for p, table in self._tables.items()
            if checkpoint_shards(plain, p) not in (0, len(table.shards))
        }
        for name, var in {
            GLOBAL_STEP: None,
            **{
                model_name(k): v
                for k, v in self._params.items()
                if not any(k.startswith(f"{p}/shard_") for p in moved)
            },
        }.items():
            key = stored(name, True)
            if key not in shapes or (var is not None and list(shapes[key]) != list(var.shape)):
                raise ConfigError(
                    f"checkpoint {path} does not hold {name} as this run builds it (another "
                    "algorithm or model wrote it?): use a new experiment.id or output_dir"
                )
        # expect_partial: the optimizer's slots may differ (a changed algo.optimizer starts fresh
        # slots), the model and the step may not (checked above).
        self._checkpoint(moved).read(path, options=self._options).expect_partial()
        self.resharded = [self._reshard(plain, p) for p in sorted(moved)]
        for table in self._tables.values():  # the index is rebuilt from what was restored
            for shard in table.shards:
                shard.forget_index()
        self.last_step = int(reader.get_tensor(stored(GLOBAL_STEP, True)))
        self.last_path = path
        return self.last_step

    def _reshard(self, reader: Any, path: str) -> str:
        """The dynamic table at ``path`` from a checkpoint that holds it in another number of
        shards: its ids re-sharded, each new shard written from here; the line saying so."""
        table = self._tables[path]
        values, line = resharded(
            reader,
            path,
            table,
            self._slot_fills,
            lambda i, slot: f"optimizer/{slot}/{path}/shard_{i}",
        )
        for shard, value in zip(table.shards, values, strict=True):
            targets = {"rows": shard.rows, **shard.state()}
            for slot in self._slot_fills:
                targets["slot:" + slot] = self._slots[f"{slot}/{path}/shard_{shard.index}"]
            for what, held in value.items():
                targets[what].assign(held)
        return line
