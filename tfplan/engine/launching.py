"""What the engine asks a backend to start: the launch request of a planned or recorded task.

TF_CONFIG is derived here, at start, from the cluster as bound (a scheduler may pick the
addresses only at apply time), and never stored per task; the request carries it apart from the
environment, and the backend delivers it (tfplan.backends.delivery). A user's command with placeholders
is filled in again when the hosts were bound only now.
"""

from __future__ import annotations

from tfplan.backends.api import LaunchRequest
from tfplan.planning.commands import TaskFacts, fill_command
from tfplan.planning.plan import Plan, Task, cluster_spec_of
from tfplan.planning.state import Allocation, State, TaskRecord
from tfplan.planning.tf_config import ClusterSpecText

__all__ = ["STANDBY_ENV", "PlanLaunches", "restart_request", "standby_log", "standby_request"]

# The environment variable that tells a program it is a warm standby (docs/contract.md).
STANDBY_ENV = "TFPLAN_STANDBY"


class PlanLaunches:
    """The launch requests of a plan's tasks, under one allocation."""

    def __init__(self, plan: Plan, allocation: Allocation) -> None:
        self.plan = plan
        self.allocation = allocation
        self.addresses = {
            h.name: allocation.bound[h.name][1]
            if h.name in allocation.bound
            else (h.address or h.name)
            for h in plan.hosts
        }
        self.cluster = cluster_spec_of(plan.tasks, self.addresses)
        self.text = ClusterSpecText(self.cluster)

    def address(self, task: Task) -> str:
        return self.addresses[task.host]

    def command(self, task: Task) -> tuple[str, ...]:
        if not self.plan.command_template or not self.allocation.bound:
            return task.command
        facts = TaskFacts(
            task.role.value,
            task.index,
            self.cluster,
            task.port,
            task.is_chief,
            self.plan.output_dir,
        )
        return fill_command(self.plan.command_template, facts)

    def request(self, task: Task) -> LaunchRequest:
        return LaunchRequest(
            name=task.name,
            role=task.role.value,
            index=task.index,
            host=task.host,
            command=self.command(task),
            env=dict(task.env),
            workdir=task.workdir,
            log_path=task.log_path,
            devices=task.devices,
            tf_config=self.text.tf_config(task.role.value, task.index),
            memory_limit=task.memory_limit,
            experiment=self.plan.experiment_id,
        )


def restart_request(record: TaskRecord, state: State) -> LaunchRequest:
    """Start ``record`` again as it ran: same host, port, command and cluster; the previous
    log kept as ``<log>.<restarts>``."""
    text = ClusterSpecText(state.cluster_spec())
    return LaunchRequest(
        name=record.name,
        role=record.role,
        index=record.index,
        host=record.planned_host,
        command=record.command,
        env=dict(record.env),
        workdir=record.workdir,
        log_path=record.log_path,
        devices=record.devices,
        keep_log_as=f"{record.log_path}.{record.restarts}",
        attempt=record.restarts + 1,
        tf_config=text.tf_config(record.role, record.index),
        memory_limit=record.memory_limit,
        experiment=state.experiment_id,
    )


def standby_log(record: TaskRecord) -> str:
    """Where a warm standby of ``record`` writes until it takes over: beside the task's log."""
    return f"{record.log_path}.standby"


def standby_request(record: TaskRecord, state: State) -> LaunchRequest:
    """A warm standby of ``record``: started as its next life would be (same host, port,
    command, cluster), with ``TFPLAN_STANDBY=1`` so that the program prepares and waits for
    SIGUSR1 instead of serving; its own log."""
    text = ClusterSpecText(state.cluster_spec())
    return LaunchRequest(
        name=record.name,
        role=record.role,
        index=record.index,
        host=record.planned_host,
        command=record.command,
        env={**record.env, STANDBY_ENV: "1"},
        workdir=record.workdir,
        log_path=standby_log(record),
        devices=record.devices,
        attempt=record.restarts + 1,
        tf_config=text.tf_config(record.role, record.index),
        standby=True,
        memory_limit=record.memory_limit,
        experiment=state.experiment_id,
    )
