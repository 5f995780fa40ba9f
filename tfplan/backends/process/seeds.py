"""Warm starts on the listed hosts (:mod:`tfplan.backends.transports.seeds`): a seed started
on each host that runs Python tasks (by allocate, or by a sweep), recorded in the allocation,
a task forked from it, and the seeds stopped at release.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from tfplan.backends.api import Launched, LaunchRequest, Say
from tfplan.backends.fanout import run_on_hosts
from tfplan.backends.transports.pool import TransportPool
from tfplan.backends.transports.scripts import exit_file as exit_file_of
from tfplan.backends.transports.scripts import fork_script, q, write_file_script
from tfplan.backends.transports.seeds import (
    AGENT_SOURCE,
    KEEP_ENV,
    KEPT_RECORD,
    PRELOAD,
    SEEDS_KEY,
    WITHOUT_KERAS,
    WarmSeed,
    allocation_seeds,
    fork_request,
    forkable,
    host_folder_name,
    kept_env,
    kept_key,
    kept_lookup_script,
    kept_root,
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
    "keep_secs",
    "kept_seed",
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


def start_seed(
    pool: TransportPool,
    host: str,
    folder: str,
    python: str,
    env: dict[str, str],
    keras: bool = True,
    idle_exit: float | None = None,
) -> WarmSeed:
    """Start a warm seed on ``host`` (it imports :data:`PRELOAD`, then waits for requests);
    ``keras=False``: without the Keras 3 that TensorFlow's import pulls in (tasks that never use
    it); ``idle_exit``: a kept seed, which ends by itself once idle that long.

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
    keep = () if idle_exit is None else ("--idle-exit", f"{idle_exit:g}")
    started = transport.start(
        LaunchSpec(
            name="seed",
            command=(python, seed.agent_path, folder, *keep, *deferred, *PRELOAD),
            env=dict(env),
            workdir=folder,
            log_path=seed.log_path,
        )
    )
    return replace(seed, pid=started.pid, pgid=started.pgid, kept=idle_exit is not None)


def keep_secs(configured: object, environ: Mapping[str, str]) -> float:
    """How long a host's seed outlives a run, idle (``cluster.warm_keep_secs``): the configured
    seconds, or where that is null, ``TFPLAN_WARM_KEEP_SECS`` of tfplan's environment (a
    developer's shell sets it once for every apply), else 0: stopped with the run.

    Raises:
        BackendError: ``TFPLAN_WARM_KEEP_SECS`` is not a number of seconds >= 0.
    """
    if configured is not None:
        return float(configured)  # type: ignore[arg-type]
    text = environ.get(KEEP_ENV, "").strip()
    try:
        value = float(text) if text else 0.0
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise BackendError(
            f"{KEEP_ENV}={text!r} is not a number of seconds: set it to e.g. 300, or unset it"
        )
    return value


def kept_seed(
    pool: TransportPool, task: Task, keras: bool, keep_secs: float, local_env: dict[str, str]
) -> WarmSeed:
    """The host's kept seed that can fork ``task`` (:func:`kept_key`): a running one, adopted
    (its idle clock starts again), else one started now that outlives this run by
    ``keep_secs`` of idleness (docs/process_backend.md "Warm seeds kept between runs").

    Raises:
        BackendError: the host could not be asked, or could not start it.
    """
    transport = pool[task.host]
    local = transport.target.resolved_kind() == "local"
    env = kept_env(task.command, task.env, local_env if local else None)
    python = task.command[0]
    key = kept_key(task.host, python, env, keras)
    found = transport.run_script(
        kept_lookup_script(kept_root(local_env), task.host, key),
        f"look for a kept warm seed on {task.host}",
    )
    head, _, record = found.stdout.decode().partition("\n")
    if record.strip():
        try:
            return replace(WarmSeed.from_dict(json.loads(record)), adopted=True)
        except (ValueError, KeyError):
            pass  # a record being written: start another
    folder = posixpath.join(head.removeprefix("root ").strip(), f"{key}-{uuid.uuid4().hex[:8]}")
    seed = start_seed(pool, task.host, folder, python, env, keras, idle_exit=keep_secs)
    transport.run_script(
        write_file_script(posixpath.join(folder, KEPT_RECORD))
        + f" && printf '%s\\n' {seed.pgid} > {q(posixpath.join(folder, 'pgid'))}",
        f"record the kept warm seed in {folder}",
        stdin=json.dumps(seed.to_dict()).encode(),
    )
    return seed


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
    keep_secs: float = 0.0,
) -> Allocation:
    """A warm seed on each host of ``tasks`` that has Python tasks a seed saves TensorFlow's
    import (:func:`worth_a_seed`) and no live seed that can fork them; one that cannot start is
    said, and that host's tasks start cold. The seeds are recorded in the allocation (and it is
    submitted) as soon as they start. ``keep_secs`` > 0 (``cluster.warm_keep_secs``): the host's
    kept seed, adopted when one runs (:func:`kept_seed`)."""
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
    stale = [seeds[h] for h in wanted if h in seeds and not seeds[h].kept]
    if stale:
        run_on_hosts({s.host: s for s in stale}, lambda s: stop_seed(pool, s, 1.0))
    root = posixpath.join(posixpath.dirname(plan.code_dir), "_seed")
    local_env = dict(os.environ)

    def start(task: Task) -> WarmSeed:
        if keep_secs > 0:
            return kept_seed(pool, task, task.host in keras, keep_secs, local_env)
        folder = posixpath.join(root, host_folder_name(task.host))
        env = seed_env(task.command, task.env)
        return start_seed(pool, task.host, folder, task.command[0], env, task.host in keras)

    done = run_on_hosts(wanted, start)
    for host, error in sorted(done.failed.items()):
        say(f"warm seed on {host} could not start ({error}); its tasks start cold")
    for host, seed in sorted(done.succeeded.items()):
        if seed.adopted:
            say(
                f"warm seed on {host} (pid {seed.pid}) kept from an earlier run: tasks fork from it"
            )
    seeds.update(done.succeeded)
    allocation = replace(
        allocation,
        data={**allocation.data, SEEDS_KEY: [s.to_dict() for s in seeds.values()]},
    )
    submitted(allocation)
    return allocation


def stop_seeds(pool: TransportPool, allocation: Allocation) -> dict[str, str]:
    """Stop the seeds the allocation records (the tasks they forked have ended already), but a
    kept one (it ends by itself, idle: the next runs on its host fork from it): each host's
    that could not be confirmed gone, and why."""
    seeds = {h: s for h, s in allocation_seeds(allocation).items() if not s.kept}
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
    # A kept seed on this machine was started by another tfplan process, whose environment
    # its own is: a task forked from it gets this one's, as a cold start here would.
    whole = seed.kept and transport.target.resolved_kind() == "local"
    if whole:
        env = {
            **{
                k: v
                for k, v in os.environ.items()
                if k not in ("TFPLAN_CGROUP", "TFPLAN_MEMORY_LIMIT")
            },
            **env,
        }
    payload = fork_request(
        request.command,
        env,
        request.workdir,
        request.log_path,
        exit_path,
        request.memory_limit,
        cgroup,
        env_whole=whole,
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
    if seed.kept:
        handle["seed"] = seed.folder  # which one: a host's kept seed serves many runs
    if exit_file is not None:
        handle["exit_file"] = exit_file
    return Launched(
        handle=handle, host=request.host, address=transport.target.address, started_at=began
    )
