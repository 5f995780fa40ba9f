"""Dynamic embedding tables: raw ids of any range, a row of its own per id, rows that come and go.

A dynamic table replaces the row index of a ``keras.layers.Embedding`` (``model.dynamic``) by a
map from raw id (int64 or string) to row, kept on the parameter servers (built in a TF1 graph
under the replicas' device setter, or eagerly under ParameterServerStrategy with the strategy's
colocation: ``colocate``, and then looked up inside its ``tf.function``s):

- **Shards.** An id belongs to shard ``hash(id) mod N`` (N: the parameter servers; FarmHash of the
  id's decimal text, the same in every process). Shard ``s`` is, all on one ps: ``rows``
  (``capacity/N`` x width, the trainable variable, parameter key ``<path>/shard_<s>``), ``row_ids``
  (the id each row holds), ``last_seen`` (the global step that last read each row, -1: free;
  the step as the chief's maintenance thread last told the shard: the global step lives on one
  ps, which every other would wait for at each lookup), a
  stack of free rows with its count, the admission counters when ``min_count`` > 1, and a
  ``MutableHashTable`` id -> row. Lookups and updates touch only the batch's rows.
- **Atomic allocation.** Look up, admit, take free rows and insert are one critical section per
  shard (``tf.CriticalSection`` shared by name across the workers' graphs, run on the ps): two
  workers never take the same row, no row is leaked.
- **Admission.** An id gets its own row once seen ``min_count`` times (counted in a counting Bloom
  filter of ``COUNTERS_PER_ROW`` x capacity int32 counters, ``BLOOM_HASHES`` hashes: bounded
  memory, and an id may be admitted early when its counters are shared with others: the
  false-admission rate: tests/test_dynamic_table.py). The counters are cleared every
  ``ttl_steps`` global steps: an id must be seen ``min_count`` times within one such window.
  Before it has a row an id reads zeros and its gradient goes nowhere.
- **Eviction, while training.** Every :data:`POLL_SECS`, on a thread of its own
  (:class:`MaintenanceHook`), the chief asks the shards whether any needs maintenance (:meth:`DynamicTable.maintenance_due`: no lock,
  a few scalars read); when one does it runs :meth:`DynamicTable.maintenance`, inside the
  same critical section, which frees every row unseen for more than ``ttl_steps`` global steps
  (a scan every tenth of it), and when the resident rows pass ``HIGH_WATERMARK`` of a shard's
  capacity frees the least recently seen down to ``LOW_WATERMARK``. A freed row's optimizer
  slots are reset to their initial value; a row taken again gets fresh initial values (the
  layer's initializer). Resident rows never exceed the capacity: an id that finds no free row
  reads zeros until a row is freed.
- **Checkpoints and snapshots** hold only variables (``row_ids``, ``last_seen``, the free stack,
  the counters, the rows and their slots): every saver tfplan has (sharded checkpoints, in-memory
  snapshots of one ps) keeps a dynamic table with no special case. The hash table is an index,
  rebuilt from ``row_ids`` and ``last_seen`` (the free stack too) inside the critical section
  once in every ps process's life (a new job, a restarted or restored ps: a checkpoint taken
  while a maintenance ran is made whole again) and whenever its size is not the resident count:
  by the maintenance, which the chief's next check asks for; until then the shard's lookups
  take no row (its ids read zeros), so no id ever gets a second row.
- **Maintenance** runs on a thread of the chief's (:class:`MaintenanceHook`; pss: of the
  coordinator's, recipes/strategies/table_upkeep.py): a step never waits
  for it.
- **Evaluation** (``training=False``) looks ids up only: an id without a row reads zeros.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import tensorflow as tf

from recipes.checkpoint_names import DYNAMIC_PREFIX

__all__ = [
    "BLOOM_HASHES",
    "COUNTERS_PER_ROW",
    "HIGH_WATERMARK",
    "LOW_WATERMARK",
    "DynamicSettings",
    "DynamicTable",
    "POLL_SECS",
    "record_evictions",
    "shard_of",
    "shard_rows",
]

v1 = tf.compat.v1

HIGH_WATERMARK = 0.9  # a shard with more resident rows than this share of its capacity ...
LOW_WATERMARK = 0.8  # ... has its least recently seen rows freed down to this share
BLOOM_HASHES = 3  # admission counters per id
COUNTERS_PER_ROW = 4  # admission counters per row of capacity (when min_count > 1)
FREE = -1  # last_seen of a free row


@dataclass(frozen=True)
class DynamicSettings:
    """One dynamic table's settings (``model.dynamic`` and the keys beside it)."""

    capacity: int  # rows over all shards
    min_count: int = 1
    ttl_steps: int = 10_000


def shard_rows(capacity: int, shards: int) -> int:
    """Rows of each of ``shards`` shards of a table of ``capacity`` rows."""
    return -(-int(capacity) // max(1, int(shards)))


def _id_text(ids: Any) -> Any:
    return ids if ids.dtype == tf.string else tf.strings.as_string(ids)


def shard_of(ids: Any, shards: int) -> Any:
    """Each id's shard: FarmHash of its text, the same in every process."""
    return tf.cast(tf.strings.to_hash_bucket_fast(_id_text(ids), shards), tf.int32)


def _initial_fill(var: Any) -> float:
    """The constant a slot variable was initialised with (its initializer's Fill or Const op:
    0 for Adam's and momentum's slots, ``initial_accumulator_value`` for Adagrad's); 0 when it
    is not a constant."""
    try:
        op = var.initial_value.op
    except (AttributeError, ValueError):
        return 0.0
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    if op.type == "Fill":
        value = tf.get_static_value(op.inputs[1])
        return 0.0 if value is None else float(value)
    if op.type == "Const":
        proto = op.get_attr("value")
        for field in ("float_val", "double_val", "half_val"):
            values = getattr(proto, field)
            if len(values) == 1:
                return float(values[0])
    return 0.0


def _random_rows(initializer: Any, shape: Any, dtype: Any) -> Any:
    """New rows' values from a Keras initializer (uniform, normal, truncated normal, zeros,
    constant), for a row count known only when the graph runs; uniform in +-0.05 (Keras'
    Embedding default) for any other initializer."""
    name = type(initializer).__name__
    config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    if name == "RandomUniform":
        return tf.random.uniform(shape, config["minval"], config["maxval"], dtype)
    if name == "RandomNormal":
        return tf.random.normal(shape, config["mean"], config["stddev"], dtype)
    if name == "TruncatedNormal":
        return tf.random.truncated_normal(shape, config["mean"], config["stddev"], dtype)
    if name == "Zeros":
        return tf.zeros(shape, dtype)
    if name == "Ones":
        return tf.ones(shape, dtype)
    if name == "Constant":
        return tf.fill(shape, tf.cast(config["value"], dtype))
    return tf.random.uniform(shape, -0.05, 0.05, dtype)


def _colocated_gradient(op_type: str) -> str:
    """The name of a gradient for ``op_type`` that is TensorFlow's own, built colocated with the
    forward op (by default, gradients are built where the optimizer is: the worker)."""
    name = f"TfplanColocated{op_type}"
    # TensorFlow's registered gradient functions have no public lookup
    from tensorflow.python.framework import ops  # noqa: PLC0415

    own = ops._gradient_registry.lookup(op_type)  # noqa: SLF001
    try:

        @tf.RegisterGradient(name)
        def _gradient(op: Any, *grads: Any) -> Any:
            with v1.colocate_with(op):
                return own(op, *grads)

    except KeyError:  # registered already (this module imported twice)
        pass
    return name


# a shard's gather and its zeros for ids without a row take their gradients on the ps
_ON_THE_PS = {op: _colocated_gradient(op) for op in ("ResourceGather", "GatherV2", "ScatterNd")}


class _Shard:
    """One shard's variables and index on one ps (created in the current device scope: the
    device setter puts ``rows`` on a ps, everything else is colocated with it)."""

    def __init__(
        self,
        name: str,
        index: int,
        rows: int,
        width: int,
        dtype: Any,
        key_dtype: Any,
        counters: int,
        window: int = 0,
        colocate: Optional[Callable[[Any], AbstractContextManager[Any]]] = None,
    ) -> None:
        self.index, self.capacity, self.width, self.counters_size = index, rows, width, counters
        self.key_dtype = key_dtype
        self.rows = tf.Variable(
            lambda: tf.zeros([rows, width], dtype), name=f"{name}/shard_{index}", trainable=True
        )
        # not under the rows' name (the optimizer's slots are) nor under model/ (the model's
        # variables, which have slots): dynamic/<path>/shard_<i>/<what>
        scope = f"{DYNAMIC_PREFIX}{name.split('/', 1)[-1]}/shard_{index}"
        self.scope = scope

        # beside the rows, and past the device setter: its round-robin counts every variable it
        # sees (colocated or not), and the next shard's rows must go to the next ps.
        # ``colocate``: how the caller's variable creator puts a variable beside another (TF2:
        # a strategy's ``colocate_vars_with``; its round-robin ignores device scopes)
        with (
            v1.device(None),
            v1.colocate_with(self.rows),
            colocate(self.rows) if colocate is not None else nullcontext(),
        ):
            empty_id = "" if key_dtype == tf.string else 0
            self.row_ids = tf.Variable(
                lambda: tf.fill([rows], tf.constant(empty_id, key_dtype)),
                name=f"{scope}/row_ids",
                trainable=False,
            )
            self.last_seen = tf.Variable(
                lambda: tf.fill([rows], tf.constant(FREE, tf.int64)),
                name=f"{scope}/last_seen",
                trainable=False,
            )
            # the free rows, a stack: free[0:free_count] (row 0 taken last)
            self.free = tf.Variable(
                lambda: tf.range(rows - 1, -1, -1, dtype=tf.int64),
                name=f"{scope}/free",
                trainable=False,
            )
            # shared by node name with every graph that builds the same table (every worker)
            self.index_table = tf.lookup.experimental.MutableHashTable(
                key_dtype,
                tf.int64,
                default_value=-1,
                name=f"{scope}/index",
                experimental_is_anonymous=False,
            )
            # empty in a ps process that has not rebuilt the index yet (a resumed job, a
            # restarted or restored ps): its one key is set by the rebuild (or by a new table's
            # initializer, below), and, not being a variable, it is never restored: the index
            # is rebuilt once in every life of a ps that restored the table, whatever the
            # variables a checkpoint or snapshot caught mid-maintenance say
            self.index_built = tf.lookup.experimental.MutableHashTable(
                tf.int64,
                tf.int64,
                default_value=-1,
                name=f"{scope}/index_built",
                experimental_is_anonymous=False,
            )

            def all_free() -> Any:
                # a new table's index (empty) matches its variables: built, nothing to rebuild;
                # a restored one's is not (a restore runs no initializer)
                marked = self.index_built.insert(
                    tf.constant([0], tf.int64), tf.constant([1], tf.int64)
                )
                with tf.control_dependencies([marked]):
                    return tf.constant(rows, tf.int64)

            self.free_count = tf.Variable(all_free, name=f"{scope}/free_count", trainable=False)
            # the global step as the chief's maintenance last read it: what rows are marked
            # seen at, read on this ps (the global step lives on one ps: reading it at every
            # lookup would make every other ps wait for it)
            self.now = tf.Variable(tf.constant(0, tf.int64), name=f"{scope}/now", trainable=False)
            # the step from which the next scan for rows past their TTL is due
            self.next_scan = tf.Variable(
                tf.constant(0, tf.int64), name=f"{scope}/next_scan", trainable=False
            )
            self.counters: Optional[Any] = None
            self.window_end: Optional[Any] = None
            if counters:
                self.counters = tf.Variable(
                    lambda: tf.zeros([counters], tf.int32),
                    name=f"{scope}/admission",
                    trainable=False,
                )
                self.window_end = tf.Variable(
                    tf.constant(window, tf.int64), name=f"{scope}/admission_window", trainable=False
                )
            self.lock = tf.CriticalSection(name=f"{scope}/lock", shared_name=f"{scope}/lock")

    def state(self) -> dict[str, Any]:
        """The variables beside the rows, by what they hold (``row_ids``, ``last_seen``, ...)."""
        out = {
            "row_ids": self.row_ids,
            "last_seen": self.last_seen,
            "free": self.free,
            "free_count": self.free_count,
            "now": self.now,
            "next_scan": self.next_scan,
        }
        if self.counters is not None and self.window_end is not None:
            out.update(admission=self.counters, admission_window=self.window_end)
        return out

    def forget_index(self) -> Any:
        """Mark the index stale (eagerly: TF2, after a restore assigned the variables, which a
        new table's initializer had marked built); the next maintenance rebuilds it."""
        return self.index_built.remove(tf.constant([0], tf.int64))

    def _row_of(self, ids: Any) -> Any:
        """The index's row of each of ``ids`` (a vector), -1 for none; a vector (inside a
        ``tf.function`` a table made eagerly does not tell its lookups' shape)."""
        return tf.reshape(self.index_table.lookup(ids), [-1])

    def resident(self, free_count: Optional[Any] = None) -> Any:
        """Rows held by an id: the capacity less the free count (read now, or ``free_count``)."""
        free = self.free_count.read_value() if free_count is None else free_count
        return tf.constant(self.capacity, tf.int64) - free

    def _rebuild(self) -> Any:
        """The index and the free stack again from ``row_ids`` and ``last_seen``: after a
        restore (checkpoint or snapshot) the variables are back but the index is empty."""
        seen = self.last_seen.read_value()
        live = seen >= 0
        rows = tf.cast(tf.where(live)[:, 0], tf.int64)
        ids = tf.gather(self.row_ids.read_value(), rows)
        keys, _ = self.index_table.export()
        cleared = self.index_table.remove(keys)
        with tf.control_dependencies([cleared]):
            inserted = self.index_table.insert(ids, rows)
        free_rows = tf.cast(tf.where(tf.logical_not(live))[:, 0], tf.int64)
        n_free = tf.size(free_rows, out_type=tf.int64)
        stacked = self.free.scatter_update(
            tf.IndexedSlices(free_rows, tf.range(n_free, dtype=tf.int64))
        )
        with tf.control_dependencies([inserted, stacked]):
            count = self.free_count.assign(n_free, read_value=True)
        built = self.index_built.insert(tf.constant([0], tf.int64), tf.constant([1], tf.int64))
        with tf.control_dependencies([built]):
            return tf.identity(count)

    def _stale(self, free_count: Any) -> Any:
        """Whether the index must be rebuilt from the variables: once in every ps life, and
        whenever its size is not the resident count (given the free count)."""
        return tf.logical_or(
            tf.equal(self.index_built.size(), 0),
            tf.not_equal(self.index_table.size(), self.resident(free_count)),
        )

    def _indexed(self) -> Any:
        """A tensor that is ready once the index matches the resident rows (rebuilt when
        :meth:`_stale`)."""
        stale = self._stale(self.free_count.read_value())
        return tf.cond(stale, self._rebuild, lambda: tf.identity(self.free_count.read_value()))

    def _admitted(self, missing: Any, counts: Any, min_count: int) -> Any:
        """Which of ``missing`` (seen ``counts`` times in this batch) have their counters reach
        ``min_count`` with this batch counted: a bool mask."""
        assert self.counters is not None
        text = _id_text(missing)
        positions = [
            tf.strings.to_hash_bucket_strong(text, self.counters_size, key=[j + 1, 0x9E3779B9])
            for j in range(BLOOM_HASHES)
        ]
        added = [
            self.counters.scatter_add(tf.IndexedSlices(tf.cast(counts, tf.int32), p))
            for p in positions
        ]
        with tf.control_dependencies(added):
            estimate = tf.reduce_min(
                tf.stack([tf.gather(self.counters, p) for p in positions]), axis=0
            )
        return estimate >= min_count

    def allocate(
        self,
        ids: Any,
        counts: Optional[Any],
        min_count: int,
        new_rows: Callable[[Any], Any],
    ) -> Any:
        """Inside the lock: each of ``ids`` (distinct) its row, taking free rows for the
        admitted ids that have none; -1 for an id without a row (not admitted yet, or no free
        row). Marks every row read as seen now (:attr:`now`). Takes no row while the index
        does not match the variables (a restored ps's, until the chief's next check has the
        maintenance rebuild it: :meth:`due`): no id gets a second row."""
        rows = self._row_of(ids)
        count = self.free_count.read_value()
        step = self.now.read_value()
        indexed = tf.logical_not(self._stale(count))
        found = rows >= 0
        held = tf.boolean_mask(rows, found)
        touched = self.last_seen.scatter_update(
            tf.IndexedSlices(tf.fill(tf.shape(held), step), held)
        )
        absent = tf.logical_not(found)
        missing = tf.boolean_mask(ids, absent)
        at = tf.where(absent)  # where each missing id is in ids
        if counts is not None and self.counters is not None and min_count > 1:
            admitted = self._admitted(missing, tf.boolean_mask(counts, absent), min_count)
            missing, at = tf.boolean_mask(missing, admitted), tf.boolean_mask(at, admitted)
        n = tf.minimum(tf.size(missing, out_type=tf.int64), count) * tf.cast(indexed, tf.int64)
        taken_ids = missing[:n]
        taken = tf.gather(self.free, tf.range(count - n, count))
        writes = [
            self.free_count.assign_sub(n),
            self.index_table.insert(taken_ids, taken),
            self.row_ids.scatter_update(tf.IndexedSlices(taken_ids, taken)),
            self.last_seen.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(taken), step), taken)),
            self.rows.scatter_update(tf.IndexedSlices(new_rows(tf.size(taken)), taken)),
            touched,
        ]
        with tf.control_dependencies(writes):
            # the rows found, and the rows just taken where their ids are
            return tf.tensor_scatter_nd_update(rows, at[:n], taken)

    def find(self, ids: Any) -> Any:
        """Inside the lock: each of ``ids`` its row, -1 for none; nothing changes but a stale
        index (a restored evaluator's)."""
        with tf.control_dependencies([self._indexed()]):
            return self._row_of(ids)

    def evict(self, step: Any, ttl_steps: int, slots: Sequence[tuple[Any, float]]) -> Any:
        """Inside the lock: now is ``step`` (the global step). When the shard is above the high
        watermark, or a scan for rows unseen for ``ttl_steps`` is due (every tenth of it), free
        the rows unseen for more than ``ttl_steps`` steps, then, above the high watermark, the
        least recently seen down to the low one, and reset their slots; at the end of the
        admission window clear the counters. Nothing else: a call with nothing to do reads two
        numbers. Returns [evicted, resident]."""
        with tf.control_dependencies([self._indexed(), self.now.assign(step)]):
            count = self.free_count.read_value()
            due = step >= self.next_scan.read_value()
        high = int(self.capacity * HIGH_WATERMARK)
        needed = tf.logical_or(self.resident(count) > high, due)
        evicted = tf.cond(
            needed,
            lambda: self._free_rows(step, ttl_steps, slots, count),
            lambda: tf.constant(0, tf.int64),
        )
        writes = [evicted]
        if self.counters is not None and self.window_end is not None:
            counters, window_end = self.counters, self.window_end

            def clear() -> Any:
                with tf.control_dependencies(
                    [counters.assign(tf.zeros_like(counters)), window_end.assign(step + ttl_steps)]
                ):
                    return tf.constant(True)

            writes.append(
                tf.cond(step >= window_end.read_value(), clear, lambda: tf.constant(False))
            )
        with tf.control_dependencies(writes):
            return tf.stack([tf.identity(evicted), self.resident()])

    def due(self, step: Any) -> Any:
        """Outside the lock (what it reads may be a step old; the lock's holder decides):
        now is ``step``; whether :meth:`evict` has anything to do (a bool)."""
        with v1.colocate_with(self.rows), tf.control_dependencies([self.now.assign(step)]):
            count = self.free_count.read_value()
            high = int(self.capacity * HIGH_WATERMARK)
            headroom = tf.constant(high - self.capacity, tf.int64) + count
            due = tf.logical_or(headroom < 0, step >= self.next_scan.read_value())
            due = tf.logical_or(due, self._stale(count))
            if self.window_end is not None:
                due = tf.logical_or(due, step >= self.window_end.read_value())
            return due

    def _free_rows(
        self, step: Any, ttl_steps: int, slots: Sequence[tuple[Any, float]], count: Any
    ) -> Any:
        """The eviction itself (a scan of the shard); returns the rows freed."""
        seen = self.last_seen.read_value()
        live = seen >= 0
        expired = tf.logical_and(live, step - seen > ttl_steps)
        n_expired = tf.reduce_sum(tf.cast(expired, tf.int64))
        staying = self.resident(count) - n_expired
        high = int(self.capacity * HIGH_WATERMARK)
        low = int(self.capacity * LOW_WATERMARK)
        extra = tf.where(staying > high, staying - low, tf.constant(0, tf.int64))
        candidates = tf.logical_and(live, tf.logical_not(expired))
        age = tf.where(candidates, -seen, tf.fill(tf.shape(seen), tf.int64.min))
        oldest = tf.math.top_k(age, k=tf.cast(extra, tf.int32), sorted=False).indices
        rows = tf.concat([tf.cast(tf.where(expired)[:, 0], tf.int64), tf.cast(oldest, tf.int64)], 0)
        n = tf.size(rows, out_type=tf.int64)
        ids = tf.gather(self.row_ids.read_value(), rows)
        # an id is removed only where the index still maps it to this row
        mapped = tf.equal(self._row_of(ids), rows)
        writes = [
            self.index_table.remove(tf.boolean_mask(ids, mapped)),
            self.last_seen.scatter_update(
                tf.IndexedSlices(tf.fill(tf.shape(rows), tf.constant(FREE, tf.int64)), rows)
            ),
            self.free.scatter_update(tf.IndexedSlices(rows, tf.range(count, count + n))),
            self.free_count.assign_add(n),
            self.next_scan.assign(step + max(1, ttl_steps // 10)),
        ]
        for slot, fill in slots:
            width = slot.shape[1:].as_list()
            values = tf.fill(
                tf.concat([[n], tf.constant(width, tf.int64)], 0), tf.cast(fill, slot.dtype)
            )
            writes.append(slot.scatter_update(tf.IndexedSlices(values, rows)))
        with tf.control_dependencies(writes):
            return tf.identity(n)


class DynamicTable:
    """A dynamic table in the current graph: ``shards`` shards of ``settings.capacity`` rows of
    ``width``, ids of ``key_dtype`` (tf.int64 or tf.string); new rows from ``initializer`` (a
    Keras initializer). Build under the replicas' device setter (or none, in a local graph)."""

    def __init__(
        self,
        name: str,
        settings: DynamicSettings,
        width: int,
        dtype: Any,
        key_dtype: Any,
        shards: int,
        initializer: Any = None,
        colocate: Optional[Callable[[Any], AbstractContextManager[Any]]] = None,
    ) -> None:
        self.name, self.settings, self.width = name, settings, int(width)
        self.dtype, self.key_dtype = tf.as_dtype(dtype), tf.as_dtype(key_dtype)
        self.initializer = initializer
        per_shard = shard_rows(settings.capacity, shards)
        counters = COUNTERS_PER_ROW * per_shard if settings.min_count > 1 else 0
        self.shards = [
            _Shard(
                name,
                s,
                per_shard,
                self.width,
                self.dtype,
                self.key_dtype,
                counters,
                settings.ttl_steps,
                colocate,
            )
            for s in range(max(1, int(shards)))
        ]

    def params(self, key: str) -> dict[str, Any]:
        """The trainable variables by parameter key, ``<key>/shard_<i>``."""
        return {f"{key}/shard_{s.index}": s.rows for s in self.shards}

    def state_variables(self) -> list[Any]:
        """Every shard's variables beside its rows."""
        return [v for s in self.shards for v in s.state().values()]

    def named_state(self) -> dict[str, Any]:
        """Every shard's variables beside its rows by checkpoint name,
        ``dynamic/<path>/shard_<i>/<what>`` (the names a graph gives them, without one)."""
        return {f"{s.scope}/{what}": v for s in self.shards for what, v in s.state().items()}

    def _step(self, step: Any = None) -> Any:
        step = v1.train.get_global_step() if step is None else step
        return tf.constant(0, tf.int64) if step is None else tf.cast(step, tf.int64)

    def _new_rows(self, n: Any) -> Any:
        return _random_rows(self.initializer, tf.stack([n, self.width]), self.dtype)

    def lookup(self, rows: Sequence[Any], ids: Any, training: bool) -> Any:
        """The rows of ``ids`` (any shape), shaped ``ids.shape + [width]``, read from the shard
        variables ``rows`` (this table's :meth:`params`, or the same variables passed through a
        parameter set). Training: ids without a row get one (admission permitting)."""
        if ids.dtype != self.key_dtype:
            if self.key_dtype == tf.string or ids.dtype == tf.string:
                raise TypeError(f"ids of {ids.dtype.name}, not {self.key_dtype.name}")
            ids = tf.cast(ids, self.key_dtype)
        flat = tf.reshape(ids, [-1])
        counting = training and self.settings.min_count > 1
        if counting:
            unique, back, counts = tf.unique_with_counts(flat, out_idx=tf.int64)
        else:  # admission needs no counts
            unique, back = tf.unique(flat, out_idx=tf.int64)
            counts = None
        n_shards = len(self.shards)
        where = tf.range(tf.size(unique))
        if n_shards > 1:
            owner = shard_of(unique, n_shards)
            at_parts = tf.dynamic_partition(where, owner, n_shards)
            id_parts = tf.dynamic_partition(unique, owner, n_shards)
            count_parts = tf.dynamic_partition(counts, owner, n_shards) if counting else None
        else:
            at_parts, id_parts, count_parts = [where], [unique], [counts] if counting else None
        positions, parts = [], []
        graph = v1.get_default_graph()
        for shard, table in zip(self.shards, rows, strict=True):
            mine_at, mine = at_parts[shard.index], id_parts[shard.index]
            mine_counts = count_parts[shard.index] if count_parts else None
            # everything from the ids to their rows (zeros where an id has no row), and the
            # gradient back to the rows read, runs on the shard's ps: one tensor travels each
            # way per shard and step (the rows read, their gradient), as for a plain table
            with v1.colocate_with(shard.rows), graph.gradient_override_map(_ON_THE_PS):
                # received once on the ps (the lock waits for its inputs by a control edge,
                # which would otherwise be a second transfer of the same ids)
                mine = tf.identity(mine)
                mine_counts = None if mine_counts is None else tf.identity(mine_counts)
                if training:
                    found = shard.lock.execute(
                        lambda s=shard, i=mine, c=mine_counts: s.allocate(
                            i, c, self.settings.min_count, self._new_rows
                        ),
                        exclusive_resource_access=False,
                    )
                else:
                    found = shard.lock.execute(
                        lambda s=shard, i=mine: s.find(i), exclusive_resource_access=False
                    )
                valid = found >= 0
                got = tf.gather(table, tf.boolean_mask(found, valid))
                dense = tf.scatter_nd(
                    tf.where(valid),
                    got,
                    tf.stack(
                        [tf.size(found, out_type=tf.int64), tf.constant(self.width, tf.int64)]
                    ),
                )
            positions.append(mine_at)
            parts.append(dense)
        joined = tf.dynamic_stitch(positions, parts) if n_shards > 1 else parts[0]
        out = tf.gather(joined, back)
        return tf.reshape(out, tf.concat([tf.shape(ids), [self.width]], axis=0))

    def _slots(self, shard: _Shard) -> list[tuple[Any, float]]:
        """The optimizer slots of ``shard``'s rows (variables named ``<rows>/<slot>`` shaped as
        the rows), with the constant each was initialised with."""
        prefix = shard.rows.op.name + "/"
        shape = shard.rows.shape
        return [
            (var, _initial_fill(var))
            for var in v1.global_variables()
            if var.op.name.startswith(prefix) and var.shape == shape
        ]

    def maintenance_due(self, step: Any = None) -> Any:
        """Cheap, and taking no lock: tells every shard the global step (``step``, default the
        graph's), and, per shard, whether it needs :meth:`maintenance` (above the high
        watermark, a TTL scan due, the end of an admission window): a ``[shards]`` bool tensor
        (:class:`MaintenanceHook` reads it)."""
        step = self._step(step)
        return tf.stack([shard.due(step) for shard in self.shards])

    def maintenance(
        self,
        step: Any = None,
        slots: Optional[Mapping[int, Sequence[tuple[Any, float]]]] = None,
    ) -> Any:
        """Eviction on every shard at the global step ``step`` (default the graph's): a
        ``[shards, 2]`` tensor of rows evicted and rows resident per shard. ``slots``: each
        shard's optimizer slots with their initial value (reset in the rows freed); default
        the graph's variables named after the rows (build it after the optimizer then)."""
        step = self._step(step)
        out = []
        for shard in self.shards:
            slots_of = self._slots(shard) if slots is None else list(slots.get(shard.index, ()))
            with v1.colocate_with(shard.rows):
                out.append(
                    shard.lock.execute(
                        lambda s=shard, sl=slots_of: s.evict(step, self.settings.ttl_steps, sl),
                        exclusive_resource_access=False,
                    )
                )
        return tf.stack(out)


EVENTS_FILE = "dynamic_tables.jsonl"  # output_dir/: one line per eviction that freed rows


def record_evictions(path: str, tables: Sequence[str], counts: Any, step: int) -> None:
    """Append to ``path`` (``output_dir/dynamic_tables.jsonl``) one line per shard that a
    maintenance freed rows of: ``counts`` is its ``[tables, shards, 2]`` result (evicted,
    resident), ``tables`` the tables' names in its order, ``step`` the global step."""
    lines = [
        json.dumps(
            {
                "at": round(time.time(), 3),
                "step": int(step),
                "table": table,
                "shard": shard,
                "evicted": int(evicted),
                "resident": int(resident),
            }
        )
        for table, per_shard in zip(tables, counts, strict=True)
        for shard, (evicted, resident) in enumerate(per_shard)
        if evicted
    ]
    if lines:
        with open(path, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


POLL_SECS = 0.05  # between two checks of the shards by the chief's maintenance thread


class MaintenanceHook(v1.train.SessionRunHook):  # type: ignore[name-defined]
    """The chief's: a thread of its own, started with each session, asks the tables' shards
    every ``poll_secs`` whether any needs its maintenance (``due``: it tells them the global
    step and reads a few scalars, no lock taken), runs the maintenance (``op``, from
    ``KerasModel.table_maintenance``) when one does, and appends what it freed to
    ``output_dir/dynamic_tables.jsonl`` (``at``, ``step``, ``table``, ``shard``, ``evicted``,
    ``resident``). No step waits for it. Why a thread on a clock, not the chief's steps: a
    chief that runs no step for a while (its first checkpoint, a slow save, a busy host) while
    the other workers train would leave the shards' step behind (every row read meanwhile would
    look unseen since, and be freed while in use) and free nothing while the table fills (seen
    in busy test runs: a chief that ran 2 of 241 steps). Its ``end`` stops the thread: list it
    before the checkpoint hook, so that the final checkpoint is written after the last
    maintenance. A checkpoint is never written while a maintenance runs (:meth:`saving`, a
    listener of the checkpoint hook): a save reads a shard's variables one by one, and an
    eviction between two reads would leave its free rows and its last-seen steps apart in the
    checkpoint (a restore rebuilds them, but the final checkpoint is also what is exported)."""

    def __init__(
        self,
        due: Any,
        op: Any,
        paths: Sequence[str],
        global_step: Any,
        output_dir: str,
        poll_secs: float = POLL_SECS,
    ) -> None:
        self._due, self._op, self._paths, self._step = due, op, list(paths), global_step
        self._path = f"{output_dir}/{EVENTS_FILE}"
        self._poll = float(poll_secs)
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._running = threading.Lock()  # held by a maintenance, and by a checkpoint's save
        self._held_by_save = False
        self.checks = 0  # checks completed (tests wait on it)

    def saving(self) -> Any:
        """A listener for the checkpoint hook: each save waits for a maintenance under way to
        end, and none starts until the save has."""
        return _HeldWhileSaving(self)

    def _save_begins(self) -> None:
        self._running.acquire()
        self._held_by_save = True

    def _save_ended(self) -> None:
        if self._held_by_save:
            self._held_by_save = False
            self._running.release()

    def after_create_session(self, session: Any, coord: Any) -> None:
        # a new session (the first, or after a ps came back): a new thread; an older one's
        # session is closed and its thread ends at its next check. A save that failed with the
        # old session (a ps gone) never told its end: it does not hold the maintenance back.
        self._save_ended()
        self._stop.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, args=(session, self._stop), name="table-maintenance", daemon=True
        )
        self._thread.start()

    def _loop(self, session: Any, stop: threading.Event) -> None:
        while not stop.wait(self._poll):
            try:
                self.check(session)
            except RuntimeError:  # "Attempted to use a closed Session": a recovery replaced it
                return
            except tf.errors.OpError:  # a ps went away: the steps say so; try again
                continue

    def check(self, session: Any) -> bool:
        """Ask the shards once; run the maintenance when one is due. Whether it ran."""
        flags = session.run(self._due)
        ran = bool(flags.any())
        if ran:
            self.run(session)
        self.checks += 1
        return ran

    def run(self, session: Any) -> None:
        """The maintenance itself, and its record."""
        with self._running:
            counts, step = session.run([self._op, self._step])
        record_evictions(self._path, self._paths, counts, int(step))

    def end(self, session: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


class _HeldWhileSaving(v1.train.CheckpointSaverListener):  # type: ignore[name-defined]
    def __init__(self, hook: MaintenanceHook) -> None:
        self._hook = hook

    def before_save(self, session: Any, global_step_value: int) -> None:
        self._hook._save_begins()

    def after_save(self, session: Any, global_step_value: int) -> None:
        self._hook._save_ended()
