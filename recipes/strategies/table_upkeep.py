"""``algo=pss``: the dynamic tables' maintenance, run by the coordinator (recipes/dynamic_table.py).

As the TF1 algorithms' chief does (``MaintenanceHook``), pss's coordinator asks with a thread
of its own, every ``POLL_SECS`` (two functions it runs directly, their ops on the ps: one reads the global
step, tells every shard and returns whether any is due, without a lock; the other is the
eviction, in each shard's critical section), while the workers train. Rows are then marked seen
at a global step at most ``POLL_SECS`` old. A checkpoint is never written during a maintenance
(:meth:`TableUpkeep.paused`); the coordinator writes one only between scheduled steps, so a
checkpoint holds each table whole. What a maintenance freed goes to
``output_dir/dynamic_tables.jsonl``, as with the TF1 algorithms.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

import tensorflow as tf

from recipes.dynamic_table import EVENTS_FILE, DynamicTable, record_evictions

__all__ = ["POLL_SECS", "TableUpkeep"]

POLL_SECS = 0.1  # between two checks of the shards


class TableUpkeep:
    """The maintenance of ``tables`` (by path) at the global step ``step`` (a variable), the
    freed rows' slots reset: ``slots`` (``<slot>/<path>/shard_<i>`` -> variable, as
    :class:`recipes.strategies.optimizer.Optimizer` makes them) with ``slot_fills`` (each slot's
    initial value)."""

    def __init__(
        self,
        tables: dict[str, DynamicTable],
        step: Any,
        slots: dict[str, Any],
        slot_fills: dict[str, float],
        output_dir: str,
    ) -> None:
        self._paths = sorted(tables)
        self._names = [f"model/{p}" for p in self._paths]
        self._events = os.path.join(output_dir, EVENTS_FILE)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

        def slots_of(path: str, table: DynamicTable) -> dict[int, list[tuple[Any, float]]]:
            return {
                shard.index: [
                    (slots[f"{slot}/{path}/shard_{shard.index}"], fill)
                    for slot, fill in slot_fills.items()
                ]
                for shard in table.shards
            }

        per_table = {p: slots_of(p, tables[p]) for p in self._paths}

        @tf.function
        def due() -> Any:
            now = tf.cast(step.read_value(), tf.int64)
            flags = tf.concat([tables[p].maintenance_due(now) for p in self._paths], axis=0)
            return tf.reduce_any(flags), now

        @tf.function
        def maintain(now: Any) -> Any:
            return tf.stack([tables[p].maintenance(now, per_table[p]) for p in self._paths])

        self._due, self._maintain = due, maintain

    def check(self) -> bool:
        """Ask the shards once; run the maintenance when one is due. Whether it ran."""
        with self._lock:
            is_due, now = self._due()
            if not bool(is_due):
                return False
            counts = self._maintain(now)
            record_evictions(self._events, self._names, counts.numpy(), int(now))
            return True

    def _loop(self) -> None:
        while not self._stop.wait(POLL_SECS):
            try:
                self.check()
            except tf.errors.OpError:  # a ps went away: the coordinator's steps fail and say so
                continue

    def start(self) -> None:
        """Check now (a restored table's index is rebuilt before the first step takes a row),
        then every ``POLL_SECS`` on a thread of its own."""
        self.check()
        self._thread = threading.Thread(target=self._loop, name="table-upkeep", daemon=True)
        self._thread.start()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No maintenance runs inside (a checkpoint being written)."""
        with self._lock:
            yield

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
