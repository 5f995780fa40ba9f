"""Warm starts on the listed hosts (:mod:`tfplan.backends.transports.seeds`): a seed started
on each host that runs Python tasks (by allocate, or by a sweep), recorded in the allocation,
a task forked from it, and the seeds stopped at release.
"""

from __future__ import annotations

import posixpath
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from tfplan.backends.api import Launched, LaunchRequest, Say
from tfplan.backends.fanout import run_on_hosts
from tfplan.backends.transports.pool import TransportPool
from tfplan.backends.transports.scripts import exit_file as exit_file_of
from tfplan.backends.transports.scripts import fork_script, q, write_file_script
from tfplan.backends.transports.seeds import (
    AGENT_SOURCE,
    PRELOAD,
    SEEDS_KEY,
    WITHOUT_KERAS,
    WarmSeed,
    allocation_seeds,
    fork_request,
    forkable,
    seed_env,
    worth_a_seed,
)
from tfplan.backends.transports.specs import LaunchSpec
from tfplan.errors import BackendError
from tfplan.planning.plan import Plan, Task
from tfplan.planning.state import Allocation

__all__ = [
    "FORK_WAIT_SECS",
    "SEEDS_KEY",
    "SEED_IMPORT_WAIT_SECS",
    "SEED_STOP_GRACE_SECS",
    "allocation_seeds",
    "fork",
    "seed_ready",
    "start_seed",
    "start_seeds",
    "stop_seed",
    "stop_seeds",
]

# how long a fork request waits for a ready seed's answer (it answers within milliseconds once
# its imports are done), and for a seed still importing to be ready: a cold start would import
# the same modules beside it, so it is waited for (30 s was too short on a loaded CI machine,
# where three cold starts beside a seed then made the load worse)
FORK_WAIT_SECS = 30.0
SEED_IMPORT_WAIT_SECS = 180.0
SEED_STOP_GRACE_SECS = 1.0  # a seed holds nothing: SIGTERM ends it at once


def _safe(host: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "host"


def start_seed(
    pool: TransportPool,
    host: str,
    folder: str,
    python: str,
    env: dict[str, str],
    keras: bool = True,
) -> WarmSeed:
    """Start a warm seed on ``host`` (it imports :data:`PRELOAD`, then waits for requests);
    ``keras=False``: without the Keras 3 that TensorFlow's import pulls in (tasks that never use
    it).

    Raises:
        BackendError: the host could not start it.
    """
    transport = pool[host]
    seed = WarmSeed(host, 0, 0, folder, python, dict(env), keras)
    # The folder is the experiment's: an earlier seed's ``ready`` would pass this one for ready
    # (a fork request then signalled it mid-import and waited FORK_WAIT_SECS for nothing), and
    # its unanswered requests are not this apply's. Cleared in the same call that writes.
    clear = f"rm -rf {q(seed.ready_path)} {q(seed.started_path)} {q(seed.requests)} && "
    transport.run_script(
        clear + write_file_script(seed.agent_path),
        f"write the warm seed's agent {seed.agent_path}",
        stdin=AGENT_SOURCE.encode(),
    )
    deferred = () if keras else WITHOUT_KERAS
    started = transport.start(
        LaunchSpec(
            name="seed",
            command=(python, seed.agent_path, folder, *deferred, *PRELOAD),
            env=dict(env),
            workdir=folder,
            log_path=seed.log_path,
        )
    )
    return replace(seed, pid=started.pid, pgid=started.pgid)


def seed_ready(pool: TransportPool, seed: WarmSeed) -> bool:
    """Whether the seed has imported what it preloads (it answers requests from then on)."""
    data, _ = pool[seed.host].read_log(seed.ready_path)  # missing: not yet
    return bool(data)


def stop_seed(pool: TransportPool, seed: WarmSeed, grace_secs: float = 5.0) -> None:
    """Stop a seed by its process group (the tasks it forked have groups of their own).

    Raises:
        BackendError: the group survived SIGKILL or the host is unreachable.
    """
    pool[seed.host].stop(seed.pid, seed.pgid, grace_secs)


def _seeds_alive(pool: TransportPool, seeds: Sequence[WarmSeed]) -> dict[str, bool]:
    if not seeds:
        return {}

    def look(seed: WarmSeed) -> bool:
        info = pool[seed.host].status([seed.pid]).get(seed.pid)
        return info is not None and info.alive

    looked = run_on_hosts({s.host: s for s in seeds}, look)
    return {h: bool(v) for h, v in looked.succeeded.items()}


def start_seeds(
    pool: TransportPool,
    plan: Plan,
    tasks: Sequence[Task],
    allocation: Allocation,
    say: Say,
    submitted: Callable[[Allocation], None],
) -> Allocation:
    """A warm seed on each host of ``tasks`` that has Python tasks a seed saves TensorFlow's
    import (:func:`worth_a_seed`) and no live seed that can fork them; one that cannot start is said, and that host's tasks start cold. The seeds are
    recorded in the allocation (and it is submitted) as soon as they start."""
    seeds = allocation_seeds(allocation)
    alive = _seeds_alive(pool, list(seeds.values()))
    forked = [t for t in tasks if worth_a_seed(t.command, t.workdir)]
    keras = {t.host for t in forked if t.keras}  # hosts with a task that may use Keras
    wanted: dict[str, Task] = {}
    for task in forked:
        if task.host in wanted:
            continue
        seed = seeds.get(task.host)
        if (
            seed is not None
            and alive.get(seed.host)
            and forkable(seed, task.command, task.env)
            and (seed.keras or task.host not in keras)
        ):
            continue
        wanted[task.host] = task
    if not wanted:
        return allocation
    stale = [seeds[h] for h in wanted if h in seeds]
    if stale:
        run_on_hosts({s.host: s for s in stale}, lambda s: stop_seed(pool, s, 1.0))
    root = posixpath.join(posixpath.dirname(plan.code_dir), "_seed")

    def start(task: Task) -> WarmSeed:
        folder = posixpath.join(root, _safe(task.host))
        env = seed_env(task.command, task.env)
        return start_seed(pool, task.host, folder, task.command[0], env, task.host in keras)

    done = run_on_hosts(wanted, start)
    for host, error in sorted(done.failed.items()):
        say(f"warm seed on {host} could not start ({error}); its tasks start cold")
    seeds.update(done.succeeded)
    allocation = replace(
        allocation,
        data={**allocation.data, SEEDS_KEY: [s.to_dict() for s in seeds.values()]},
    )
    submitted(allocation)
    return allocation


def stop_seeds(pool: TransportPool, allocation: Allocation) -> dict[str, str]:
    """Stop the seeds the allocation records (the tasks they forked have ended already): each
    host's that could not be confirmed gone, and why."""
    seeds = allocation_seeds(allocation)
    if not seeds:
        return {}
    stopped = run_on_hosts(seeds, lambda s: stop_seed(pool, s, SEED_STOP_GRACE_SECS))
    return {h: f"warm seed: {e}" for h, e in stopped.failed.items()}


def fork(
    pool: TransportPool,
    seed: WarmSeed,
    request: LaunchRequest,
    env: dict[str, str],
    exit_file: str | None,
    cgroup: str = "",
) -> Launched | str:
    """``request`` forked from ``seed``, or why it could not be (the seed is gone, did not
    answer within the wait, or failed to fork, or to make the task's memory cgroup
    ``cgroup``): the caller starts it the usual way."""
    transport = pool[request.host]
    began = time.time()
    exit_path = exit_file or exit_file_of(request.workdir)
    token = f"{request.name.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
    payload = fork_request(
        request.command,
        env,
        request.workdir,
        request.log_path,
        exit_path,
        request.memory_limit,
        cgroup,
    )
    try:
        answer = transport.run_script(
            fork_script(seed.requests, token, seed.pgid, FORK_WAIT_SECS, SEED_IMPORT_WAIT_SECS),
            f"fork {request.name} from the warm seed",
            stdin=payload,
            timeout=FORK_WAIT_SECS + SEED_IMPORT_WAIT_SECS + 30.0,
        )
    except BackendError as error:  # the script says why last: "is gone", "did not answer"
        return str(error).rsplit(" failed: ", 1)[-1]
    text = answer.stdout.decode().strip()
    if not text.isdigit():
        return f"could not fork it ({text or 'no answer'})"
    pid = int(text)
    handle: dict[str, object] = {"pid": pid, "pgid": pid, "forked": True}
    if exit_file is not None:
        handle["exit_file"] = exit_file
    return Launched(
        handle=handle, host=request.host, address=transport.target.address, started_at=began
    )
