"""Warm starts on Slurm: one seed step per node, each task a step of its own that the seed forks.

- At allocation, as soon as the job runs: on each node with Python tasks a seed saves an import
  (:func:`~tfplan.backends.transports.seeds.worth_a_seed`), a step ``tfplan-seed-<node>`` runs
  the seed agent (:mod:`tfplan.backends.transports.seed_agent`), which imports TensorFlow while
  tfplan stages the code and checks the nodes. Its folder is on the shared folder
  (``<workdir>/_seed/<node>``): the submit host writes the agent there, reads ``ready``.
- A task is still one step (``--job-name=<task>.<life>``: squeue, ``scancel JOB.STEP``, its
  output forwarded by srun into its log, its exit code srun's), but the step runs
  :mod:`tfplan.backends.transports.seed_client`, which has the node's seed fork the program,
  stands for it in the step (signals passed on, its exit code) and takes it down when the step
  is cancelled; a seed that is not there makes the client start the program itself (cold).
- What changes against a cold step: the program is a child of the seed's step, not of its
  own, so Slurm's per-step accounting (``sacct``'s CPU and memory of the step) and a per-step
  cgroup (``TaskPlugin=task/cgroup`` limits) see the client, not the program; the job's own
  limits still hold. ``cluster.warm=false`` gives the cold steps back (docs/slurm_notes.md).
- Release: ``scancel JOB`` ends the seed steps with the job.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Callable, Sequence
from dataclasses import replace

from tfplan.backends.api import LaunchRequest, Say
from tfplan.backends.transports.local import LocalTransport
from tfplan.backends.transports.seeds import (
    AGENT_SOURCE,
    CLIENT_SOURCE,
    PRELOAD,
    SEEDS_KEY,
    WITHOUT_KERAS,
    WarmSeed,
    allocation_seeds,
    forkable,
    seed_env,
    worth_a_seed,
)
from tfplan.backends.transports.specs import LaunchSpec
from tfplan.errors import BackendError
from tfplan.planning.plan import Plan, Task
from tfplan.planning.state import Allocation

__all__ = ["SEEDS_KEY", "allocation_seeds", "fork_command", "start_seeds", "stop_seeds"]

CLIENT_FILE = "seed_client.py"


def start_seeds(
    local: LocalTransport,
    srun: Callable[[str, str], list[str]],
    plan: Plan,
    tasks: Sequence[Task],
    allocation: Allocation,
    say: Say,
    submitted: Callable[[Allocation], None],
) -> Allocation:
    """A seed step on each node of ``tasks`` that runs Python tasks worth a seed and has no
    seed yet (``srun(node, step_name)``: the srun words that start a step there). Recorded in the
    allocation (submitted) as soon as they start; one that cannot start is said, and that
    node's tasks start cold."""
    seeds = allocation_seeds(allocation)
    forked = [t for t in tasks if worth_a_seed(t.command, t.workdir)]
    keras = {t.host for t in forked if t.keras}
    wanted: dict[str, Task] = {}
    for task in forked:
        if task.host not in seeds and task.host not in wanted:
            wanted[task.host] = task
    if not wanted:
        return allocation
    root = posixpath.join(posixpath.dirname(plan.code_dir), "_seed")
    for host, task in sorted(wanted.items()):
        node = allocation.bound[host][0]
        folder = posixpath.join(root, node)
        env = seed_env(task.command, task.env)
        seed = WarmSeed(host, 0, 0, folder, task.command[0], env, host in keras)
        try:
            local.run_script(
                f"rm -rf {shlex.quote(folder)} && mkdir -p {shlex.quote(seed.requests)}",
                f"clear the warm seed's folder {folder}",
            )
            local.write_file(seed.agent_path, AGENT_SOURCE.encode())
            local.write_file(posixpath.join(folder, CLIENT_FILE), CLIENT_SOURCE.encode())
            deferred = () if seed.keras else WITHOUT_KERAS
            started = local.start(
                LaunchSpec(
                    name=f"seed-{node}",
                    command=(
                        *srun(node, f"tfplan-seed-{node}"),
                        seed.python,
                        seed.agent_path,
                        folder,
                        *deferred,
                        *PRELOAD,
                    ),
                    env=env,
                    workdir=folder,
                    log_path=seed.log_path,
                )
            )
        except BackendError as error:
            say(f"warm seed on {node} could not start ({error}); its tasks start cold")
            continue
        seeds[host] = replace(seed, pid=started.pid, pgid=started.pgid)
    allocation = replace(
        allocation,
        data={**allocation.data, SEEDS_KEY: [s.to_dict() for s in seeds.values()]},
    )
    submitted(allocation)
    return allocation


def fork_command(
    local: LocalTransport,
    seed: WarmSeed | None,
    request: LaunchRequest,
    env: dict[str, str],
) -> tuple[str, ...] | None:
    """The step's command that has ``seed`` fork the task (the request written beside its
    workdir), or None when this task cannot be forked (no seed, another interpreter or
    import-time environment, not a Python program, a standby)."""
    if (
        seed is None
        or request.standby
        or not forkable(seed, request.command, env)
        or not worth_a_seed(request.command, request.workdir)
    ):
        return None
    path = posixpath.join(request.workdir, f".tfplan-fork.{request.attempt}.json")
    payload = {"argv": list(request.command), "workdir": request.workdir}
    local.write_file(path, json.dumps(payload).encode())
    client = posixpath.join(seed.folder, CLIENT_FILE)
    return (seed.python, "-S", client, seed.folder, path)


def stop_seeds(local: LocalTransport, allocation: Allocation) -> dict[str, str]:
    """Stop the seed steps' srun clients on this machine (their steps end with them, and with
    the job): each node's that could not be confirmed gone, and why."""
    problems: dict[str, str] = {}
    for host, seed in sorted(allocation_seeds(allocation).items()):
        if not seed.pid:
            continue
        try:
            local.stop(seed.pid, seed.pgid, 1.0)
        except BackendError as error:
            problems[host] = f"warm seed: {error}"
    return problems


def seed_ready(seed: WarmSeed) -> bool:
    try:
        with open(seed.ready_path) as ready:
            return bool(ready.read())
    except OSError:
        return False
