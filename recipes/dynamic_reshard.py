"""A dynamic table resumed with another number of parameter servers: its ids re-sharded.

A checkpoint holds a dynamic table as one set of variables per shard, one shard per ps
(recipes/dynamic_table.py): ``model/<path>/shard_<i>`` (the rows), its optimizer slots
(``model/<path>/shard_<i>/<slot>``) and ``dynamic/<path>/shard_<i>/...`` (the id each row holds,
when each was last seen, the free rows). A run resumed with another ``cluster.ps`` has other
shards; a Saver cannot map one onto the other (the rows of an id move to the shard its hash now
names). So the chief, when it finds that its latest checkpoint has another number of shards:

- initialises every variable, then restores every variable but the dynamic tables' from the
  checkpoint (a split table's slices re-slice themselves, as for any resume);
- reads each table's resident ids, rows, slots and last-seen steps from the checkpoint, puts each
  id on the shard ``FarmHash(id) mod N`` now names (the same function as the lookups), in row
  order; a shard with more ids than its rows keeps the most recently seen (said in one line);
- writes each new shard whole from the chief (rows, slots, ids, last seen, free rows): the
  table passes through the chief's memory once, at this resume only. The index is rebuilt on the
  ps at the first lookup, as after any restore.

The global step, the dense weights and every id's row, slots and last-seen step come back: the
same step, the same predictions for every resident id. :func:`resharded` is the part both
checkpoint formats share: pss's coordinator re-shards its TF2 checkpoints with it
(recipes/strategies/checkpoints.py), assigning the new shards eagerly.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Optional

import numpy as np
import tensorflow as tf

from recipes.checkpoint_names import DYNAMIC_PREFIX
from recipes.dynamic_table import FREE, DynamicTable, shard_of

__all__ = ["Resharder", "checkpoint_shards", "resharded"]

v1 = tf.compat.v1


def checkpoint_shards(reader: Any, path: str) -> int:
    """How many shards the checkpoint read by ``reader`` holds of the table at ``path``."""
    shard = re.compile(re.escape(f"model/{path}") + r"/shard_(\d+)$")
    return sum(1 for name in reader.get_variable_to_shape_map() if shard.match(name))


def _owner(ids: np.ndarray, shards: int) -> np.ndarray:
    """Each id's shard, by the lookups' own function."""
    with tf.Graph().as_default():
        bucket = shard_of(tf.constant(ids), shards)
        with v1.Session() as sess:
            return np.asarray(sess.run(bucket))


class Resharder:
    """Built in the chief's graph (after the optimizer: its slots are re-sharded too) when its
    latest checkpoint holds the dynamic tables in another number of shards."""

    def __init__(
        self,
        checkpoint: str,
        tables: dict[str, DynamicTable],
        saver_names: dict[str, Any],
        log: Callable[[str], None] = print,
    ) -> None:
        self.checkpoint, self.tables, self._log = checkpoint, tables, log
        self._reader = tf.train.load_checkpoint(checkpoint)
        ours = tuple(f"model/{p}/shard_" for p in tables) + tuple(
            f"{DYNAMIC_PREFIX}{p}/" for p in tables
        )
        others = {k: v for k, v in saver_names.items() if not k.startswith(ours)}
        self._saver = v1.train.Saver(var_list=others, sharded=False, name="reshard_restore")
        self._feeds: list[tuple[Any, tuple[str, int, str]]] = []  # placeholder, what it takes
        self._assigns: list[Any] = []
        self._plans: dict[str, dict[str, Any]] = {}
        for path, table in tables.items():
            self._build(path, table)

    @staticmethod
    def needed(checkpoint: Optional[str], tables: dict[str, DynamicTable]) -> bool:
        """Whether ``checkpoint`` holds any of ``tables`` in another number of shards."""
        if not checkpoint or not tables:
            return False
        reader = tf.train.load_checkpoint(checkpoint)
        for path, table in tables.items():
            held = checkpoint_shards(reader, path)
            if held and held != len(table.shards):
                return True
        return False

    def _build(self, path: str, table: DynamicTable) -> None:
        """Placeholders and assign ops for every variable of ``table``'s new shards."""
        plan: dict[str, Any] = {"table": table, "slots": {}}
        self._plans[path] = plan
        for shard in table.shards:
            variables = {
                "rows": shard.rows,
                "row_ids": shard.row_ids,
                "last_seen": shard.last_seen,
                "free": shard.free,
                "free_count": shard.free_count,
            }
            for slot, _ in table._slots(shard):  # noqa: SLF001 - the table's own listing
                variables["slot:" + slot.op.name.rsplit("/", 1)[-1]] = slot
            for what, var in variables.items():
                holder = v1.placeholder(var.dtype.base_dtype, var.shape, name=None)
                self._assigns.append(var.assign(holder, read_value=False))
                key = (path, shard.index, what)
                self._feeds.append((holder, key))

    def _value(self, key: tuple[str, int, str]) -> Any:
        path, index, what = key
        return self._plans[path]["values"][index][what]

    def _plan_table(self, path: str) -> None:
        """Read the old shards; the new shards' values."""
        plan = self._plans[path]
        table: DynamicTable = plan["table"]
        fills = {key[len("slot:") :]: fill for key, fill in self._slot_fills(path).items()}
        plan["values"], line = resharded(
            self._reader, path, table, fills, lambda i, name: f"model/{path}/shard_{i}/{name}"
        )
        self._log(line)

    def _slot_keys(self, path: str) -> list[str]:
        return sorted({w for _, (p, _, w) in self._feeds if p == path and w.startswith("slot:")})

    def _slot_fills(self, path: str) -> dict[str, float]:
        """Each slot's initial value (``slot:<name>`` -> value), for rows without one."""
        table: DynamicTable = self._plans[path]["table"]
        fills = {
            "slot:" + slot.op.name.rsplit("/", 1)[-1]: fill
            for slot, fill in table._slots(table.shards[0])  # noqa: SLF001
        }
        return {key: fills.get(key, 0.0) for key in self._slot_keys(path)}

    def restore(self, session: Any) -> None:
        """After every variable was initialised: the checkpoint's other variables, then the
        tables' new shards."""
        self._saver.restore(session, self.checkpoint)
        for path in self._plans:
            self._plan_table(path)
        feed = {holder: self._value(key) for holder, key in self._feeds}
        session.run(self._assigns, feed_dict=feed)
        for path in self._plans:
            self._plans[path].pop("values", None)  # the table's copy, freed


def resharded(
    reader: Any,
    path: str,
    table: DynamicTable,
    slots: Mapping[str, float],
    slot_name: Callable[[int, str], str],
) -> tuple[list[dict[str, Any]], str]:
    """The values of ``table``'s shards (``rows``, ``row_ids``, ``last_seen``, ``free``,
    ``free_count``, ``slot:<name>`` for each of ``slots``, a name -> initial value) from the
    checkpoint ``reader`` reads (plain names: :class:`recipes.checkpoint_names.PlainNames`),
    which holds the table at ``path`` in another number of shards, and the line that says so.
    ``slot_name(i, name)``: the checkpoint name of slot ``name`` of the old shard ``i``."""
    old = checkpoint_shards(reader, path)
    ids: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    seen: list[np.ndarray] = []
    held_slots: dict[str, list[np.ndarray]] = {}
    for i in range(old):
        aux = f"{DYNAMIC_PREFIX}{path}/shard_{i}"
        last = reader.get_tensor(f"{aux}/last_seen")
        live = np.flatnonzero(last >= 0)
        ids.append(reader.get_tensor(f"{aux}/row_ids")[live])
        rows.append(reader.get_tensor(f"model/{path}/shard_{i}")[live])
        seen.append(last[live])
        for name in slots:
            key = slot_name(i, name)
            if reader.has_tensor(key):
                held_slots.setdefault(name, []).append(reader.get_tensor(key)[live])
    all_ids = np.concatenate(ids)
    all_rows, all_seen = np.concatenate(rows), np.concatenate(seen)
    all_slots = {k: np.concatenate(v) for k, v in held_slots.items()}
    owner = _owner(all_ids, len(table.shards)) if len(all_ids) else np.zeros(0, np.int64)
    values: list[dict[str, Any]] = []
    dropped = 0
    for shard in table.shards:
        mine = np.flatnonzero(owner == shard.index)
        if len(mine) > shard.capacity:  # the most recently seen first
            order = np.argsort(-all_seen[mine], kind="stable")
            dropped += len(mine) - shard.capacity
            mine = np.sort(mine[order[: shard.capacity]])
        n = len(mine)
        cap, width = shard.capacity, table.width
        new_rows = np.zeros((cap, width), table.dtype.as_numpy_dtype)
        new_rows[:n] = all_rows[mine]
        empty = "" if table.key_dtype == tf.string else 0
        row_ids = np.full(cap, empty, dtype=object if table.key_dtype == tf.string else np.int64)
        row_ids[:n] = all_ids[mine]
        last_seen = np.full(cap, FREE, np.int64)
        last_seen[:n] = all_seen[mine]
        free = np.zeros(cap, np.int64)
        free[: cap - n] = np.arange(cap - 1, n - 1, -1, dtype=np.int64)  # row n taken next
        value: dict[str, Any] = {
            "rows": new_rows,
            "row_ids": row_ids,
            "last_seen": last_seen,
            "free": free,
            "free_count": np.int64(cap - n),
        }
        for name, fill in slots.items():  # a slot the checkpoint lacks: its initial value
            dtype = all_slots[name].dtype if name in all_slots else new_rows.dtype
            block = np.full((cap, width), fill, dtype)
            if name in all_slots:
                block[:n] = all_slots[name][mine]
            value["slot:" + name] = block
        values.append(value)
    line = (
        f"{path}: {old} shard(s) in the checkpoint, {len(table.shards)} now: "
        f"{len(all_ids):,} resident id(s) re-sharded by their hash"
        + (
            f"; {dropped:,} least recently seen dropped (no room on their new shard)"
            if dropped
            else ""
        )
    )
    return values, line
