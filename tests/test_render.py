"""Terraform-style rendering (tfplan.render), compared with golden files.

Regenerate the goldens after an intended change with ``TFPLAN_UPDATE_GOLDEN=1 pytest
tests/test_render.py`` and review the diff by eye before committing.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import os
from functools import cache
from pathlib import Path

import pytest
from rich.console import Console
from state_helpers import state_from

from tfplan.cli.render import format_bytes, plan_lines, print_plan, summary_line, task_lines
from tfplan.config.compose import compose_config, to_config
from tfplan.config.schema import Config, HostConfig
from tfplan.engine.plans import make_plan as plan
from tfplan.planning.context import PlanContext
from tfplan.planning.plan import Plan
from tfplan.planning.state import State, TaskStatus

CONF = Path(__file__).resolve().parent.parent / "conf"
GOLDEN = Path(__file__).resolve().parent / "golden"
CTX = PlanContext(cwd="/home/user/project", local_python="/usr/bin/python3", tf_version="2.21.0")


@cache
def _composed(overrides: tuple[str, ...]) -> Config:
    return to_config(compose_config(list(overrides), CONF))


def _plan(*overrides: str, state: State | None = None) -> Plan:
    return plan(copy.deepcopy(_composed(overrides)), state, CTX)


def _text(p: Plan) -> str:
    return "\n".join(text for _, text in plan_lines(p)) + "\n"


def _state_from(p: Plan) -> State:
    return state_from(p, serial=1, lineage="L")


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("TFPLAN_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"rendering differs from {path}"


def test_golden_local_plan() -> None:
    _check_golden("plan_local.txt", _text(_plan("cluster=local")))


def _replace_destroy_plan() -> Plan:
    """worker/2 gone from the config, ps/0 dead, the rest restarted for the new cluster spec."""
    state = _state_from(_plan("cluster=local", "cluster.workers=3"))
    dead = dataclasses.replace(state.tasks[0], status=TaskStatus.FAILED, exit_code=1)
    return _plan("cluster=local", state=state.with_task(dead))


def test_golden_replace_and_destroy_plan() -> None:
    _check_golden("plan_replace_destroy.txt", _text(_replace_destroy_plan()))


def test_print_plan_without_a_terminal_is_the_plain_text() -> None:
    p = _replace_destroy_plan()
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=80, highlight=False, soft_wrap=True)
    print_plan(p, console)
    assert "\x1b[" not in out.getvalue()
    assert out.getvalue() == _text(p)


def test_no_changes_and_legend_only_lists_actions_that_occur() -> None:
    first = _plan("cluster=local")
    same = _plan("cluster=local", state=_state_from(first))
    text = _text(same)
    assert "No changes. Your cluster matches the configuration." in text
    assert "Plan:" not in text and "will perform" not in text
    legend = [
        line
        for line in _text(first).splitlines()
        if line.startswith("  ")
        and line.strip()
        in ("+ create", "~ update in-place", "- destroy", "-/+ destroy and then create replacement")
    ]
    assert legend == ["    + create"]
    updated = _plan("cluster=local", "lifecycle.stop_grace_secs=9", state=_state_from(first))
    assert "  # ps/0 will be updated in-place" in _text(updated)
    assert summary_line(updated) == "Plan: 0 to add, 3 to change, 0 to destroy."


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (3 << 20, "3.0 MiB"),
        (5 << 40, "5120.0 GiB"),
    ],
)
def test_format_bytes(size: int, text: str) -> None:
    assert format_bytes(size) == text


# --- large clusters: summarised, changes compact ----------------------------------------------


def _gpu_cluster(hosts: int, *overrides: str, state: State | None = None) -> Plan:
    """``hosts`` machines of 8 GPUs: a ps on each, a worker per GPU (9 tasks a host)."""
    cfg = copy.deepcopy(_composed(("cluster=gpu2x4", "algo=downpour", *overrides)))
    cfg.cluster.hosts = [
        HostConfig(address=f"10.0.{i // 256}.{i % 256}", name=f"gpu{i}", cpu_slots=10, gpus=8)
        for i in range(hosts)
    ]
    return plan(cfg, state, CTX)


def test_up_to_the_threshold_every_task_is_a_full_block() -> None:
    small = _gpu_cluster(3, "cluster.evaluator=false", "cluster.workers=5")  # 8 tasks
    text = _text(small)
    assert text.count('+ task "') == 8 and "summarised" not in text
    assert "TF_CONFIG  = {" in text


def test_a_large_plan_summarises_creates_by_role_and_host() -> None:
    p = _gpu_cluster(300)  # 300 ps + 2,400 workers + the evaluator
    text = _text(p)
    assert len(p.tasks) == 2701 and len(text) < 4096  # was 128 MB before the summary
    assert '+ task "' not in text
    assert "  # 2701 tasks will be created, summarised by role and by host" in text
    assert "tfplan show --task worker/0" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("  + ")]
    assert rows[0][:5] == ["+", "ps", "300", "tasks", "ps/0-299"]
    assert rows[1][:7] == ["+", "worker", "2400", "tasks", "worker/0-2399", "ports", "2223-2230"]
    assert rows[2][:5] == ["+", "evaluator", "1", "task", "evaluator/0"]
    assert "      + chief      = worker/0" in text
    assert '      + command    = "python3 -m recipes.train --config <workdir>/run.yaml"' in text
    assert '      + workdir    = "/tmp/tfplan/default/<role>-<index>"' in text
    assert "+ 300 hosts, grouped by layout:" in text
    hosts = [" ".join(line.split()) for line in text.splitlines() if line.startswith("      gpu")]
    assert hosts == [
        "gpu0 10.0.0.0 10 tasks: ps/0, worker/0-7, evaluator/0 ports 2222-2230 GPUs 0-7",
        "gpu1 … gpu299 (299) 10.0.0.1 … 10.0.1.43 (299) 9 tasks each: 1 ps, 8 worker "
        "ports 2222-2230 GPUs 0-7",
    ]
    assert "; 295 of 300 ps hold none" in text  # 5 variables
    assert summary_line(p) == "Plan: 2701 to add, 0 to change, 0 to destroy."


def test_changes_of_a_large_plan_are_listed_one_by_one_with_their_reasons() -> None:
    first = _gpu_cluster(40)
    state = _state_from(first)
    dead = dataclasses.replace(state.task("worker/17"), status=TaskStatus.FAILED, exit_code=1)
    state = state.with_task(dead)
    again = _gpu_cluster(40, "lifecycle.stop_grace_secs=9", state=state)
    text = _text(again)
    assert summary_line(again) == "Plan: 1 to add, 360 to change, 1 to destroy."
    assert text.count("will be updated in-place") == 360
    assert "  # worker/17 must be replaced\n  #   the process is not running (status failed" in text
    assert '  -/+ task "worker/17" { host = "gpu2" (10.0.0.2), port = 2224, devices = ["1"] }' in (
        text
    )
    assert "stop_grace_secs: 5.0 -> 9.0" in text
    assert "summarised" not in text and "TF_CONFIG" not in text
    assert len(text) < 1024 * len(again.tasks)


def test_full_and_summary_modes_override_the_threshold() -> None:
    small = _plan("cluster=local")
    summary = "\n".join(text for _, text in plan_lines(small, "summary"))
    assert (
        "3 tasks will be created, summarised" in summary and "TF_CONFIG  = the cluster" in summary
    )
    large = _gpu_cluster(5)  # 46 tasks
    full = "\n".join(text for _, text in plan_lines(large, "full"))
    assert full.count('+ task "') == 46 and full.count('"cluster":{"ps"') == 46


def test_a_targeted_plan_warns_like_terraform_and_counts_what_it_leaves_out() -> None:
    first = _plan("cluster=local")
    state = _state_from(first)
    dead = dataclasses.replace(state.task("worker/1"), status=TaskStatus.FAILED, exit_code=1)
    targeted = plan(
        copy.deepcopy(_composed(("cluster=local", "algo.lr=0.5"))),
        state.with_task(dead),
        CTX,
        targets=["worker/1"],
    )
    assert [c.task for c in targeted.changes] == ["worker/1"]
    assert targeted.left_out == {"replace": 2}
    text = _text(targeted)
    assert "Plan: 1 to add, 0 to change, 1 to destroy." in text
    assert "Warning: Resource targeting is in effect" in text
    assert "This plan was made with -target worker/1" in text
    assert "2 change(s) to other tasks are left out (2 to replace)" in text
    task = "\n".join(t for _, t in task_lines(targeted, "ps/0"))
    assert task.startswith("  # ps/0: not targeted by this plan\n")


def test_the_snapshots_memory_is_shown_per_ps_host_and_not_when_off_or_for_pss() -> None:
    """Two copies of each ps's variables (and the optimizer's slots) on the ps's host
    (tfplan.planning.footprint.snapshot_bytes); the golden plans show the one-host line."""
    from tfplan.planning.footprint import plan_ps_bytes, snapshot_bytes

    two = _plan("cluster=local", "cluster.ps=2", "algo.optimizer=adagrad")
    held = plan_ps_bytes(two)
    assert len(held) == 2 and min(held) > 0
    # two slots of each ps's own and of the copy of its neighbour's, both ps on one host
    assert snapshot_bytes(two) == {"localhost": 4 * sum(held)}
    line = next(t for _, t in plan_lines(two) if t.startswith("Snapshots: "))
    assert line == (
        "Snapshots: every 1s (lifecycle.snapshot_secs), each ps into /dev/shm on its host and on "
        "the next ps's host (lifecycle.snapshot_copies), two slots each: localhost "
        f"{format_bytes(4 * sum(held))}"
    )
    alone = _plan(
        "cluster=local", "cluster.ps=2", "algo.optimizer=adagrad", "lifecycle.snapshot_copies=false"
    )
    assert snapshot_bytes(alone) == {"localhost": 2 * sum(held)}
    line = next(t for _, t in plan_lines(alone) if t.startswith("Snapshots: "))
    assert line.endswith(
        f"on its host, two copies of its variables: localhost {format_bytes(2 * sum(held))}"
    )
    for off in (
        ("cluster=local", "lifecycle.snapshot_secs=0"),
        ("cluster=local_chief", "algo=pss"),
    ):
        p = _plan(*off)
        assert snapshot_bytes(p) == {} and "Snapshots: " not in _text(p), off


def test_a_ps_holding_a_table_counts_the_deltas_of_two_chains_in_its_snapshot_memory() -> None:
    """A ps with a variable from 64 KiB (here the MLP's 64 x 1024 kernel, 256 KiB; the other
    ps holds only small ones) snapshots it by changed rows: its two slots each hold a full
    snapshot and a chain of deltas of at most a quarter of it (recipes/snapshot_paths.py
    REBASE_SHARE); the other ps, and every ps with lifecycle.snapshot_deltas=false, two full
    ones."""
    from tfplan.planning.footprint import plan_ps_bytes, print_bytes, ps_bytes, snapshot_bytes

    wide = ("cluster=local", "cluster.ps=2", "model=mlp", "model.hidden=[1024]")
    p = _plan(*wide, "lifecycle.snapshot_copies=false", "algo.optimizer=adagrad")
    held = ps_bytes(p.sharding, "adagrad")
    big = [v for v in p.sharding.variables if v.bytes >= 64 * 1024]
    assert [v.shape for v in big] == [(64, 1024)], p.sharding.variables
    k = p.sharding.placements[0].assignment[big[0].name]
    expected = sum(int(2.5 * n) if i == k else 2 * n for i, n in enumerate(held))
    assert snapshot_bytes(p) == {"localhost": expected}
    # the kernel's 64 rows and its Adagrad slot's: a fingerprint of 8 bytes each, on its ps,
    # counted in what the ps holds (the memory preflight checks)
    assert print_bytes(p) == {k: 2 * 64 * 8}
    assert plan_ps_bytes(p) == tuple(n + (1024 if i == k else 0) for i, n in enumerate(held))
    line = next(t for _, t in plan_lines(p) if t.startswith("Snapshots: "))
    assert line.endswith(
        f"localhost {format_bytes(expected)}; ps/{k}: a full snapshot, then only the rows changed "
        "(lifecycle.snapshot_deltas; their rows' fingerprints 1.0 KiB on the ps)"
    ), line
    whole = _plan(
        *wide,
        "lifecycle.snapshot_copies=false",
        "algo.optimizer=adagrad",
        "lifecycle.snapshot_deltas=false",
    )
    assert snapshot_bytes(whole) == {"localhost": 2 * sum(held)} and print_bytes(whole) == {}


def test_what_the_ps_leave_in_memory_is_where_the_recipes_write_it() -> None:
    """The folder a backend removes when it gives the allocation back
    (tfplan.planning.footprint.snapshot_leftovers) is the one the recipes' ps write into
    (recipes/snapshot_paths.py snapshot_folder's parent), on each ps host; none when off or pss."""
    from recipes.snapshot_paths import snapshot_folder
    from tfplan.planning.footprint import snapshot_leftovers

    two = _plan("cluster=local", "cluster.ps=2")
    written = os.path.dirname(snapshot_folder("/dev/shm", two.output_dir, 1))
    assert snapshot_leftovers(two) == {"localhost": [written]}
    for off in (
        ("cluster=local", "lifecycle.snapshot_secs=0"),
        ("cluster=local_chief", "algo=pss"),
    ):
        assert snapshot_leftovers(_plan(*off)) == {}, off
