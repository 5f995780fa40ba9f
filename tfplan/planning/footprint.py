"""Pure: what the model takes on the parameter servers (memory) and in the chief's checkpoints
(disk), from the plan's sharding preview.

A parameter server holds the variables placed on it (``round_robin``, what the recipes use) and
the optimizer's slots beside the model's (``algo.optimizer``: sgd none, momentum and adagrad
one, adam two); a checkpoint holds every variable and every slot. Algorithms that keep more on
the parameter servers (the windowed ones' center copy, ``sync``'s accumulators) hold and write
more, and a checkpoint has its graph file besides: the figures are lower bounds, which is what a
refusal needs. ``trainer.keep_checkpoints`` checkpoints are kept in ``output_dir``.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from recipes.snapshot_paths import REBASE_SHARE, TABLE_BYTES, VECTOR_BLOCK, snapshot_folder
from tfplan.config.algorithms import TF2_STRATEGIES
from tfplan.planning.plan import Plan, Role, ShardingPreview, VariableSpec
from tfplan.planning.tables import SLOTS_PER_ROW

__all__ = [
    "snapshot_leftovers",
    "snapshot_root",
    "CheckpointSize",
    "checkpoint_size",
    "delta_chains",
    "plan_checkpoints",
    "plan_ps_bytes",
    "print_bytes",
    "ps_bytes",
    "room_problem",
    "snapshot_bytes",
]


@dataclass(frozen=True)
class CheckpointSize:
    each: int  # bytes of one checkpoint, at least
    kept: int  # trainer.keep_checkpoints
    slots: int  # the optimizer's slots per trainable variable
    optimizer: str

    @property
    def total(self) -> int:
        return self.each * self.kept


def checkpoint_size(sharding: ShardingPreview, optimizer: str, keep: int) -> CheckpointSize | None:
    """The checkpoints of a plan whose variables are known (None: a ``recipe=command``
    program's, or a plan without parameter servers' preview)."""
    if not sharding.variables:
        return None
    slots = SLOTS_PER_ROW.get(optimizer.lower(), 0)
    model = sum(v.bytes for v in sharding.variables if v.name.startswith("model/"))
    each = sharding.total_bytes + slots * model
    return CheckpointSize(each=each, kept=keep, slots=slots, optimizer=optimizer)


def ps_bytes(sharding: ShardingPreview, optimizer: str) -> tuple[int, ...]:
    """The bytes each parameter server holds at least: its variables as placed (the preview's
    first placement, round-robin) and the optimizer's slots of its model variables; empty when
    the variables are not known or there is no ps."""
    if not sharding.variables or not sharding.placements:
        return ()
    slots = SLOTS_PER_ROW.get(optimizer.lower(), 0)
    placement = sharding.placements[0]
    held = list(placement.bytes_per_ps)
    for var in sharding.variables:
        if var.name.startswith("model/") and var.name in placement.assignment:
            held[placement.assignment[var.name]] += slots * var.bytes
    return tuple(held)


def _optimizer(plan: Plan) -> str:
    return str((plan.run_config.get("algo") or {}).get("optimizer") or "sgd")


def plan_checkpoints(plan: Plan) -> CheckpointSize | None:
    """:func:`checkpoint_size` of ``plan`` (its optimizer, its ``trainer.keep_checkpoints``)."""
    keep = int((plan.run_config.get("trainer") or {}).get("keep_checkpoints", 5))
    return checkpoint_size(plan.sharding, _optimizer(plan), keep)


def plan_ps_bytes(plan: Plan) -> tuple[int, ...]:
    """:func:`ps_bytes` of ``plan`` (its optimizer), and on each ps the fingerprints of its
    tables' rows that the snapshots' deltas keep there (:func:`print_bytes`)."""
    held = ps_bytes(plan.sharding, _optimizer(plan))
    prints = print_bytes(plan)
    return tuple(n + prints.get(k, 0) for k, n in enumerate(held))


def print_bytes(plan: Plan) -> dict[int, int]:
    """ps -> the bytes of the row fingerprints it keeps for the snapshots' deltas
    (recipes/snapshot_deltas.py): 8 a row of each table and of its optimizer slots (a vector's:
    8 a block of ``VECTOR_BLOCK``); empty when snapshots or their deltas are off."""
    slots = SLOTS_PER_ROW.get(_optimizer(plan).lower(), 0)
    prints: dict[int, int] = {}
    for v, k in _tables(plan):
        units = v.shape[0] if len(v.shape) >= 2 else v.shape[0] // VECTOR_BLOCK
        copies = 1 + (slots if v.name.startswith("model/") else 0)
        prints[k] = prints.get(k, 0) + 8 * units * copies
    return prints


def delta_chains(plan: Plan) -> set[int]:
    """The ps whose snapshots are chains of deltas (a table on them, ``snapshot_deltas`` on)."""
    return {k for _, k in _tables(plan)}


def _tables(plan: Plan) -> list[tuple[VariableSpec, int]]:
    """Each table in the snapshots' sense (a variable of at least recipes/snapshot_paths.py
    ``TABLE_BYTES``) and its ps, while the snapshots and their deltas are on: the variables the
    deltas take by rows."""
    snapshots = plan.run_config.get("snapshots") or {}
    algo = str((plan.run_config.get("algo") or {}).get("name") or "")
    on = float(snapshots.get("secs") or 0) and snapshots.get("deltas", True)
    if not on or algo in TF2_STRATEGIES or not plan.sharding.placements:
        return []
    assignment = plan.sharding.placements[0].assignment
    return [
        (v, assignment[v.name])
        for v in plan.sharding.variables
        if v.shape and v.bytes >= TABLE_BYTES and v.name in assignment
    ]


def snapshot_bytes(plan: Plan) -> dict[str, int]:
    """The memory the in-memory snapshots take on each ps host (``lifecycle.snapshot_dir``, by
    default /dev/shm): two copies (the slots taken in turn) of each ps's variables and slots,
    and with ``snapshot_copies`` (2 or more ps) two of the previous ps's (ps/k's copy lives on
    ps/k+1's host), summed per host; a ps with a table (``snapshot_deltas``) also keeps the
    deltas of two chains, each ended at ``REBASE_SHARE`` of its variables; empty when off, for
    the TF2 strategies and when the variables are unknown."""
    snapshots = plan.run_config.get("snapshots") or {}
    algo = str((plan.run_config.get("algo") or {}).get("name") or "")
    held = ps_bytes(plan.sharding, _optimizer(plan))  # what is saved (not the fingerprints)
    if not held or not float(snapshots.get("secs") or 0) or algo in TF2_STRATEGIES:
        return {}
    n_ps = len(held)
    copies = bool(snapshots.get("copies", True)) and n_ps > 1
    chains = delta_chains(plan)
    kept = [int((2 + 2 * REBASE_SHARE) * n) if k in chains else 2 * n for k, n in enumerate(held)]
    hosts: dict[str, int] = {}
    for task in plan.tasks:
        if task.role is Role.PS and task.index < n_ps:
            mine = kept[task.index] + (kept[(task.index - 1) % n_ps] if copies else 0)
            hosts[task.host] = hosts.get(task.host, 0) + mine
    return hosts


def snapshot_root(folder: str, output_dir: str) -> str:
    """The folder on a ps host that holds the in-memory snapshots of the job writing into
    ``output_dir``: the parent of every ps's own (recipes/snapshot_paths.py)."""
    return posixpath.dirname(snapshot_folder(folder, output_dir, 0))


def snapshot_leftovers(plan: Plan) -> dict[str, list[str]]:
    """Plan host -> the snapshot folder its parameter servers keep in memory (a ps removes its
    own as it ends or is stopped; one killed outright leaves it, for its restart): what a
    backend removes when it gives the allocation back. Empty when snapshots are off."""
    snapshots = plan.run_config.get("snapshots") or {}
    algo = str((plan.run_config.get("algo") or {}).get("name") or "")
    folder = str(snapshots.get("folder") or "")
    if not float(snapshots.get("secs") or 0) or not folder or algo in TF2_STRATEGIES:
        return {}
    root = snapshot_root(folder, plan.output_dir)
    return {t.host: [root] for t in plan.tasks if t.role is Role.PS}


def room_problem(size: CheckpointSize, free: int, output_dir: str, host: str) -> str | None:
    """One line naming the key and the fix when ``free`` bytes on ``host``'s disk of
    ``output_dir`` cannot hold the kept checkpoints; None when they fit."""
    if free >= size.total:
        return None
    fewer = max(1, free // size.each) if size.each else 1
    keep_fix = (
        f"keep fewer (trainer.keep_checkpoints={fewer})"
        if free >= size.each and fewer < size.kept
        else "shrink the model"
    )
    return (
        f"cluster.output_dir: {size.kept} checkpoint(s) of at least {_size(size.each)} each "
        f"(trainer.keep_checkpoints={size.kept}) need {_size(size.total)}, but {output_dir} on "
        f"{host} has {_size(free)} free: free space there, set cluster.output_dir to a larger "
        f"disk, or {keep_fix}"
    )


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
