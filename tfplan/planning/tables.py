"""Pure: what the plan says of a user's embedding tables, from an inspection build's listing
(``recipes/inspect_model.py``: ``tables``) and where the variables go.

Per table: its rows and width, the bytes on each ps with the optimizer's slots (the table's parts
where ``model.partition_bytes`` split it), and the most one step moves at the configured batch:
a lookup that reads only the batch's rows moves at most ``min(rows, batch x ids per example)``
rows of ``width`` floats plus their 8-byte ids each way; a whole read moves the table.
``allreduce`` keeps every table whole on every worker: one over ``algo.replicated_table_limit_mb``
is refused here, before anything starts.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from recipes.checkpoint_names import DYNAMIC_PREFIX
from tfplan.config.algorithms import ALGORITHMS
from tfplan.planning.plan import (
    DynamicTableSettings,
    EmbeddingTable,
    ShardPlacement,
    VariableSpec,
)

__all__ = ["ID_BYTES", "SLOTS_PER_ROW", "WINDOWED", "describe_tables", "replicated_table_problem"]

ID_BYTES = 8  # an int64 id travels with each row
# a dynamic table's id -> row index (recipes/dynamic_table.py), about this much per row: a hash
# map's entry; its other state is variables, named DYNAMIC_PREFIX<path>/shard_<i>/...
INDEX_BYTES_PER_ROW = 64
SLOTS_PER_ROW = {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2}
# the TF1 algorithms whose workers train on a local copy and exchange it every window: those
# whose schema has a window (the registry's own list, not a copy of it). A table they read row by
# row is not in the copy: its rows are read and written on the ps at every step, as hogwild's
# (recipes/algorithms/local.py); a table read whole is copied and exchanged per window.
WINDOWED = frozenset(
    name
    for name, algorithm in ALGORITHMS.items()
    if any(f.name == "window" for f in fields(algorithm.schema))
)


def _reads(algo: str, rows_only: bool) -> str:
    if algo == "allreduce":
        return "replica"
    if algo in WINDOWED:
        return "rows" if rows_only else "window"
    if not rows_only:
        return "whole"
    return "rows"


def describe_tables(
    raw: list[dict[str, Any]],
    variables: tuple[VariableSpec, ...],
    placement: ShardPlacement | None,
    num_ps: int,
    algo: str,
    optimizer: str,
    batch_size: int,
) -> tuple[EmbeddingTable, ...]:
    """The tables of ``raw`` (the inspection's listing) as the plan shows them; ``placement``:
    where the variables go (None without parameter servers)."""
    slots = SLOTS_PER_ROW.get(optimizer.lower(), 0)
    tables = []
    for t in raw:
        name, rows, width, size = str(t["name"]), int(t["rows"]), int(t["width"]), int(t["bytes"])
        dynamic = _dynamic(t.get("dynamic"))
        if dynamic is not None:
            size = size // max(1, rows) * dynamic.capacity
            rows = dynamic.capacity
        per_ps = [0] * num_ps
        if placement is not None and num_ps > 0:
            aux = DYNAMIC_PREFIX + name.split("/", 1)[-1] + "/"
            for var in variables:
                where = placement.assignment.get(var.name, 0)
                if var.name == name or var.name.startswith((f"{name}/part_", f"{name}/shard_")):
                    per_ps[where] += var.bytes * (1 + slots)
                elif dynamic is not None and var.name.startswith(aux):
                    per_ps[where] += var.bytes
                    if var.name.endswith("/last_seen"):  # one per shard: its index
                        per_ps[where] += INDEX_BYTES_PER_ROW * dynamic.rows_per_shard
        ids = t.get("ids_per_example")
        touched = min(rows, batch_size * int(ids)) if ids else None
        row_bytes = size // max(1, rows)
        reads = _reads(algo, bool(t.get("rows_only")) or dynamic is not None)
        moved = None if touched is None else touched * (row_bytes + ID_BYTES)
        read = {"rows": moved, "whole": size}.get(reads)  # window, replica: no ps read per step
        tables.append(
            EmbeddingTable(
                name=name,
                layer=str(t.get("layer", "")),
                feature=t.get("feature"),
                rows=rows,
                width=width,
                bytes=size,
                slots=slots,
                bytes_per_ps=tuple(per_ps),
                reads=reads,
                rows_per_step=touched,
                read_bytes_per_step=read,
                write_bytes_per_step=moved if reads in ("rows", "whole") else None,
                dynamic=dynamic,
            )
        )
    return tuple(tables)


def _dynamic(raw: Any) -> DynamicTableSettings | None:
    if not raw:
        return None
    return DynamicTableSettings(
        capacity=int(raw["capacity"]),
        rows_per_shard=int(raw["rows_per_shard"]),
        ids=str(raw["ids"]),
        min_count=int(raw["min_count"]),
        ttl_steps=int(raw["ttl_steps"]),
    )


def replicated_table_problem(
    tables: tuple[EmbeddingTable, ...], algo: str, limit_mb: float
) -> str | None:
    """The one line refusing ``allreduce`` a table over its limit (every worker holds every
    table whole, and all-reduces its gradient), else None."""
    if algo != "allreduce":
        return None
    limit = int(limit_mb * 2**20)
    over = [t for t in tables if t.bytes > limit]
    if not over:
        return None
    t = max(over, key=lambda t: t.bytes)
    return (
        f"algo=allreduce keeps every embedding table whole on every worker: {t.name} (layer "
        f"{t.layer!r}, {t.rows:,} x {t.width}) is {t.bytes / 2**20:,.1f} MiB, over "
        f"algo.replicated_table_limit_mb={limit_mb:g}: train it with a parameter-server "
        "algorithm (algo=hogwild, algo=sync, ...) that reads only the batch's rows, or raise "
        "algo.replicated_table_limit_mb"
    )
