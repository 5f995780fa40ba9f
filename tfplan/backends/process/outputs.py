"""The tasks' output folder seen from the listed hosts: whether they share it with each other
and with this machine (``cluster.output_mode``), and its files fetched back from one host."""

from __future__ import annotations

import io
import posixpath
import tarfile
import uuid
from dataclasses import replace
from pathlib import Path

from tfplan.backends.api import OutputPlace
from tfplan.backends.fanout import run_on_hosts
from tfplan.backends.transports.base import Transport
from tfplan.backends.transports.pool import TransportPool
from tfplan.backends.transports.preflight import output_sharing
from tfplan.backends.transports.scripts import SHARED_MARKER, q
from tfplan.errors import PreflightError
from tfplan.files import write_atomic
from tfplan.planning.plan import Plan, Task

__all__ = ["FETCH_MAX_KIB", "FETCH_SKIP", "fetch", "locate", "unpack_tree"]

# What fetch_outputs leaves on the host: checkpoints (TF1 and TF2 names, whatever the prefix),
# the shared-folder markers, files being written, and anything of FETCH_MAX_KIB or more.
FETCH_SKIP = (
    "checkpoint",
    "*.ckpt-*",
    "*.data-?????-of-?????",
    "*.index",
    "*.meta",
    f"{SHARED_MARKER}*",
    "*.tmp.*",
)
FETCH_MAX_KIB = 64 * 1024


def locate(pool: TransportPool, plan: Plan, hosts: tuple[str, ...]) -> OutputPlace:
    """Loopback hosts only: this machine's folder. ``output_mode=per_host``: each host's
    own. Otherwise every one of ``hosts`` writes a marker in ``output_dir`` unless one is
    there and reads it back (:func:`output_sharing` decides); this machine only looks.

    Raises:
        PreflightError: a host cannot be reached or cannot create the folder, or the
            hosts share it in a way the mode does not allow.
    """
    chief = next((t for t in plan.tasks if t.is_chief), None)
    if all(pool.targets[h].kind == "local" for h in hosts):
        found = OutputPlace(per_host=False, launcher_sees=True)
    elif plan.output_mode == "per_host":
        found = OutputPlace(
            per_host=True,
            launcher_sees=False,
            detail=f"output_dir {plan.output_dir}: per-host output (cluster.output_mode=per_host)",
        )
    else:
        token = uuid.uuid4().hex
        read = run_on_hosts(
            {h: h for h in hosts}, lambda h: pool[h].shared_marker(plan.output_dir, token)
        )
        if read.failed:
            raise PreflightError({h: str(e) for h, e in read.failed.items()})
        local = Path(plan.output_dir) / f"{SHARED_MARKER}{token}"
        try:
            mine: str | None = local.read_text().strip()
        except OSError:
            mine = None
        # Every host has read it: the markers can go (one round trip; a failure is harmless).
        marker = posixpath.join(plan.output_dir, f"{SHARED_MARKER}{token}")
        run_on_hosts(
            {h: h for h in hosts},
            lambda h: pool[h].run_script(f"rm -f {q(marker)}", f"remove {marker}"),
        )
        sharing = output_sharing(plan.output_mode, plan.output_dir, read.succeeded, mine)
        found = OutputPlace(sharing.per_host, sharing.launcher_sees, sharing.detail)
    if found.per_host and chief is not None:
        _check_evaluator_beside(plan, chief)
        found = replace(
            found,
            detail=f"{found.detail}: checkpoints stay on the chief's host {chief.host}"
            + (
                ", where the evaluator runs"
                if any(t.role.value == "evaluator" for t in plan.tasks)
                else ""
            ),
        )
    return found


def _check_evaluator_beside(plan: Plan, chief: Task) -> None:
    """Per-host output: the evaluator reads the chief's checkpoints, so it must run on the
    chief's host (the planner put it there unless that host was full).

    Raises:
        PreflightError: it was planned elsewhere.
    """
    for task in plan.tasks:
        if task.role.value == "evaluator" and task.host != chief.host:
            raise PreflightError(
                {
                    task.host: f"{task.name} is planned here and {chief.name} on "
                    f"{chief.host}, but the hosts share no output folder and the evaluator "
                    f"reads the chief's checkpoints: give {chief.host} a free cpu slot (it "
                    "then runs there), mount output_dir on every host, or set "
                    "cluster.evaluator=false"
                }
            )


def fetch(transport: Transport, folder: str, dest: Path) -> int:
    """One gzipped tar of ``folder`` on the transport's host (:data:`FETCH_SKIP`, the
    ``tfplan`` record and files of :data:`FETCH_MAX_KIB` or more left out), unpacked into
    ``dest``; how many files.

    Raises:
        BackendError: the host could not be read.
    """
    data = transport.get_tree(folder, skip=FETCH_SKIP, prune=("tfplan",), max_kib=FETCH_MAX_KIB)
    return unpack_tree(data, dest) if data else 0


def unpack_tree(data: bytes, dest: Path) -> int:
    """Unpack a gzipped tar of plain files into ``dest`` (nothing outside it); how many files."""
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            target = (dest / member.name).resolve()
            if not member.isfile() or not target.is_relative_to(dest.resolve()):
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, source.read())
            count += 1
    return count
