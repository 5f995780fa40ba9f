"""What each change costs a running job: the plan says it before anything is applied."""

from __future__ import annotations

import copy
import dataclasses
from functools import cache
from pathlib import Path

import pytest
from state_helpers import state_from

from tfplan.cli.render import plan_lines
from tfplan.config.compose import compose_config, to_config
from tfplan.config.schema import Config
from tfplan.errors import PlanError
from tfplan.planning.context import PlanContext
from tfplan.planning.costs import job_cost
from tfplan.planning.plan import Action, Plan
from tfplan.planning.planner import plan
from tfplan.planning.state import State, TaskStatus

CONF = Path(__file__).resolve().parent.parent / "conf"
CTX = PlanContext(cwd="/home/user/project", local_python="/usr/bin/python3", tf_version="2.21.0")


@cache
def _composed(overrides: tuple[str, ...]) -> Config:
    return to_config(compose_config(list(overrides), CONF))


def planned(
    *overrides: str,
    state: State | None = None,
    step: int | None = None,
    targets: tuple[str, ...] = (),
) -> Plan:
    from tfplan.backends import backend_class

    cfg = copy.deepcopy(_composed(tuple(overrides)))
    target = backend_class(cfg.cluster.backend).target(cfg.cluster, CTX)
    return plan(cfg, state, CTX, target, targets, step)


def costs(made: Plan) -> dict[str, str]:
    return {c.task: c.cost for c in made.changes if c.cost}


def test_a_fresh_plan_and_an_unchanged_job_cost_nothing() -> None:
    first = planned("algo=downpour")
    assert costs(first) == {} and job_cost(first.changes) is None
    again = planned("algo=downpour", state=state_from(first), step=1200)
    assert costs(again) == {} and not again.has_changes


def test_a_ps_restart_rolls_back_to_the_checkpoint_a_worker_restart_does_not() -> None:
    running = state_from(planned("algo=downpour"))
    more = planned("algo=downpour", "cluster.workers=3", state=running, step=1200)
    found = costs(more)
    assert found["ps/0"].startswith("rolls back to checkpoint step 1200: ")
    assert found["worker/0"].startswith("no rollback: the chief rejoins")
    assert found["worker/1"].startswith("no rollback: a worker rejoins")
    assert "worker/2" not in found  # a new task costs the job nothing
    assert job_cost(more.changes) == (
        "The running job rolls back to checkpoint step 1200 (because of ps/0)."
    )
    text = "\n".join(line for _, line in plan_lines(more))
    assert "#   cost: rolls back to checkpoint step 1200" in text
    assert text.rstrip().endswith("(because of ps/0).")


def test_what_the_step_is_when_it_is_not_known_or_there_is_no_checkpoint() -> None:
    running = state_from(planned("algo=hogwild"))
    unknown = planned("algo=hogwild", "algo.lr=0.5", state=running, step=None)
    assert costs(unknown)["ps/0"].startswith("rolls back to the last checkpoint:")
    fresh = planned("algo=hogwild", "algo.lr=0.5", state=running, step=0)
    assert costs(fresh)["ps/0"].startswith("rolls back to step 0 (no checkpoint yet):")


def test_restarting_only_workers_keeps_the_jobs_step() -> None:
    running = state_from(planned("algo=downpour"))
    made = planned("algo=downpour", "algo.lr=0.5", state=running, step=50, targets=("worker/1",))
    assert [c.task for c in made.changes if c.action is Action.REPLACE] == ["worker/1"]
    assert job_cost(made.changes) == (
        "The running job keeps its global step: no rollback (1 running task(s) stop or restart)."
    )


def test_a_resize_of_a_sync_job_says_why_it_cannot_happen_in_place() -> None:
    running = state_from(planned("algo=sync"))
    made = planned("algo=sync", "cluster.workers=3", state=running, step=10)
    worker = next(c for c in made.changes if c.task == "worker/1")
    assert worker.action is Action.REPLACE
    assert any(r.startswith("not in place: sync aggregates a fixed number") for r in worker.reasons)


def test_allreduce_restarts_its_group_together_and_pss_its_coordinator() -> None:
    running = state_from(planned("cluster=local_allreduce", "algo=allreduce"))
    made = planned(
        "cluster=local_allreduce", "algo=allreduce", "algo.lr=0.5", state=running, step=300
    )
    assert all(
        c.startswith("rolls back to checkpoint step 300: the all-reduce group")
        for c in costs(made).values()
    )
    running = state_from(planned("cluster=local_chief", "algo=pss"))
    made = planned("cluster=local_chief", "algo=pss", "algo.lr=0.5", state=running, step=7)
    assert costs(made)["chief/0"].startswith("rolls back to checkpoint step 7: the coordinator")


def test_a_users_program_is_not_judged_and_the_cost_survives_a_saved_plan() -> None:
    command = ("recipe=command", "recipe.command='python train.py'")
    running = state_from(planned(*command))
    made = planned(*command, "cluster.workers=3", state=running, step=5)
    assert costs(made) == {}
    running = state_from(planned("algo=downpour"))
    made = planned("algo=downpour", "cluster.workers=3", state=running, step=5)
    assert costs(Plan.from_json(made.to_json())) == costs(made)


def test_the_step_is_read_from_the_checkpoint_index_of_a_folder_here(tmp_path: Path) -> None:
    from dataclasses import replace

    from tfplan.engine.plans import checkpoint_step

    running = state_from(planned("algo=downpour"))  # its chief runs on 127.0.0.1
    here = replace(running, output_dir=str(tmp_path))
    assert checkpoint_step(here) == 0  # the folder is here and holds no checkpoint yet
    (tmp_path / "checkpoint").write_text(
        f'model_checkpoint_path: "{tmp_path}/model.ckpt-16640"\n'
        f'all_model_checkpoint_paths: "{tmp_path}/model.ckpt-15825"\n'
    )
    assert checkpoint_step(here) == 16640
    assert checkpoint_step(replace(running, output_dir=str(tmp_path / "elsewhere"))) is None
    remote = replace(here, tasks=tuple(replace(t, address="10.0.0.2") for t in here.tasks))
    (tmp_path / "checkpoint").unlink()
    assert checkpoint_step(remote) is None  # the chief's own folder may hold one


ELASTIC = ("algo=downpour", "data.shard=none")


def test_workers_join_and_leave_an_elastic_job_in_place() -> None:
    running = state_from(planned(*ELASTIC))
    out = planned(*ELASTIC, "cluster.workers=4", state=running, step=900)
    actions = {c.task: c.action for c in out.changes}
    assert actions == {
        "ps/0": Action.NOOP,
        "worker/0": Action.NOOP,
        "worker/1": Action.NOOP,
        "worker/2": Action.CREATE,
        "worker/3": Action.CREATE,
    }
    joined = next(c for c in out.changes if c.task == "worker/3")
    assert joined.reasons == ("joins the running job at its current global step (in place)",)
    assert job_cost(out.changes) is None  # nothing that runs stops
    back = planned(*ELASTIC, state=state_from(out), step=950)
    actions = {c.task: c.action for c in back.changes}
    assert actions["worker/2"] is Action.DESTROY and actions["worker/3"] is Action.DESTROY
    assert {actions[t] for t in ("ps/0", "worker/0", "worker/1")} == {Action.NOOP}
    left = next(c for c in back.changes if c.task == "worker/2")
    assert any(
        r.startswith("leaves in place: asked to stop after its next push") for r in left.reasons
    )
    assert left.cost.startswith("no rollback: the job goes on without it")


def test_an_asynchronous_job_that_splits_its_data_by_worker_count_says_so() -> None:
    running = state_from(planned("algo=hogwild"))
    out = planned("algo=hogwild", "cluster.workers=3", state=running, step=10)
    ps = next(c for c in out.changes if c.task == "ps/0")
    assert ps.action is Action.REPLACE
    assert any("data.shard=auto splits the data by the number of workers" in r for r in ps.reasons)


def test_a_users_program_resizes_in_place_when_it_says_it_can() -> None:
    command = ("recipe=command", "recipe.command='python train.py'", "recipe.elastic=true")
    running = state_from(planned(*command))
    out = planned(*command, "cluster.workers=3", state=running)
    assert {c.task: c.action for c in out.changes if c.action is not Action.NOOP} == {
        "worker/2": Action.CREATE
    }
    stiff = ("recipe=command", "recipe.command='python train.py'")
    out = planned(*stiff, "cluster.workers=3", state=state_from(planned(*stiff)))
    ps = next(c for c in out.changes if c.task == "ps/0")
    assert ps.action is Action.REPLACE and any("recipe.elastic=true" in r for r in ps.reasons)


def test_on_slurm_workers_join_in_the_allocation_and_a_larger_one_restarts_every_task() -> None:
    slurm = ("cluster=slurm", *ELASTIC)  # 3 nodes x 2 slots
    running = state_from(planned(*slurm))
    room = planned(*slurm, "cluster.workers=4", state=running, step=300)
    assert {c.task: c.action for c in room.changes if c.action is not Action.NOOP} == {
        "worker/2": Action.CREATE,
        "worker/3": Action.CREATE,
    }
    larger = planned(
        *slurm, "cluster.workers=7", "cluster.options.nodes=4", state=running, step=300
    )
    kept = {c.task: c for c in larger.changes if c.task in ("ps/0", "worker/0", "worker/1")}
    assert {c.action for c in kept.values()} == {Action.REPLACE}
    assert (
        "the Slurm job is asked for differently (cluster.options): every task restarts in a "
        "new Slurm job"
    ) in kept["ps/0"].reasons
    assert kept["ps/0"].cost.startswith("rolls back to checkpoint step 300")


def test_a_running_slurm_job_without_room_says_a_larger_job_restarts_every_task() -> None:
    slurm = ("cluster=slurm", *ELASTIC)
    running = state_from(planned(*slurm))
    with pytest.raises(PlanError) as refused:
        planned(*slurm, "cluster.workers=7", state=running)
    message = str(refused.value)
    assert message.startswith("cluster.options.nodes: no free slot for worker/5")
    assert "raise cluster.options.tasks_per_node" in message
    assert message.endswith(
        "the running Slurm job has no room for more, and a larger one restarts every task"
    )


def test_a_resize_while_the_ps_is_down_goes_with_its_restart_and_says_so() -> None:
    """Serialised, not refused: the ps restarts (rolling back, as the plan says) and the new
    workers start with the restarted job; nothing claims to be in place."""
    running = state_from(planned(*ELASTIC))
    down = running.with_task(
        dataclasses.replace(running.task("ps/0"), status=TaskStatus.FAILED, exit_code=137)
    )
    out = planned(*ELASTIC, "cluster.workers=4", state=down, step=700)
    ps = next(c for c in out.changes if c.task == "ps/0")
    assert ps.action is Action.REPLACE
    assert ps.reasons[-1].startswith("not in place: ps/0 restart(s), and the resize goes with it")
    assert ps.cost.startswith("rolls back to checkpoint step 700")
    joiners = [c for c in out.changes if c.action is Action.CREATE]
    assert [c.reasons for c in joiners] == [("starts with the restarted job",)] * 2
    assert (
        job_cost(out.changes)
        == "The running job rolls back to checkpoint step 700 (because of ps/0)."
    )


def test_a_resize_of_a_job_that_is_not_running_starts_it_again_and_claims_nothing() -> None:
    """Not an error (apply on an ended job trains it again, as for any change): but nothing
    is said to join or leave in place, and nothing running is costed."""
    ended = state_from(planned(*ELASTIC), status="succeeded")
    out = planned(*ELASTIC, "cluster.workers=4", state=ended, step=500)
    reasons = [r for c in out.changes for r in c.reasons]
    assert not [r for r in reasons if "in place" in r]
    assert {c.task: c.action for c in out.changes} == {
        "ps/0": Action.REPLACE,
        "worker/0": Action.REPLACE,
        "worker/1": Action.REPLACE,
        "worker/2": Action.CREATE,
        "worker/3": Action.CREATE,
    }
    assert job_cost(out.changes) is None
