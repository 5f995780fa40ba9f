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

from tfplan.cli.render import format_bytes, plan_lines, print_plan, summary_line
from tfplan.config.compose import compose_config, to_config
from tfplan.config.schema import Config
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
