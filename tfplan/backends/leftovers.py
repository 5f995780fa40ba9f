"""What tasks leave on their hosts on purpose, removed when the allocation is given back.

A parameter server keeps its in-memory snapshots (``lifecycle.snapshot_dir``, /dev/shm by
default: memory) in a folder that outlives its process, so that its restart comes back from
them; it removes the folder itself as it ends or is stopped, but one killed outright (SIGKILL,
the OOM killer, its host's watcher gone) cannot. ``allocate`` records those folders in the
allocation (:func:`record`) and ``release`` removes them (:func:`leftovers`), on each host the
backend's own way: once the job is over no restart needs them, and memory left there would be
lost to the host until it reboots.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import replace

from tfplan.planning.footprint import snapshot_leftovers
from tfplan.planning.plan import Plan
from tfplan.planning.state import Allocation

__all__ = ["LEFTOVERS_KEY", "leftovers", "record", "remove_script"]

LEFTOVERS_KEY = "leftovers"


def record(allocation: Allocation, plan: Plan) -> Allocation:
    """``allocation`` with the plan's leftovers (plan host -> folders) recorded, merged with
    what earlier applies of the experiment recorded (their folders may still be there)."""
    found = snapshot_leftovers(plan)
    if not found:
        return allocation
    merged = {h: list(p) for h, p in leftovers(allocation).items()}
    for host, paths in found.items():
        merged[host] = sorted({*merged.get(host, []), *paths})
    return replace(allocation, data={**allocation.data, LEFTOVERS_KEY: merged})


def leftovers(allocation: Allocation | None) -> dict[str, list[str]]:
    """Plan host -> the folders to remove there when the allocation is given back."""
    if allocation is None:
        return {}
    data = allocation.data.get(LEFTOVERS_KEY) or {}
    return {str(h): [str(p) for p in paths] for h, paths in dict(data).items()}


def remove_script(paths: Sequence[str]) -> str:
    """Removes ``paths`` (absent ones are fine)."""
    return "rm -rf -- " + " ".join(shlex.quote(p) for p in paths)
