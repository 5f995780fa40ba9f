"""The tasks of a saved plan exactly as `tfplan apply` starts them, for the benchmarks' by-hand
baselines (bench_apply.py, bench_slurm.py): what a user who writes their own launcher reads.

The plan file holds the environment every task shares once (``env``) and each task's own
variables apart (``tasks[i].env``), and no TF_CONFIG (docs/plan_format.md); `tfplan show --task
NAME --json` gives one task in full: its whole environment and its TF_CONFIG (``null`` when the
addresses are known only after apply, as on Slurm: then it is the plan's ``cluster_spec`` with
each host's name replaced by its address).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
TFPLAN = [sys.executable, "-m", "tfplan"]

__all__ = ["planned_tasks", "stage", "tf_config_text"]


def _tfplan(cwd: Path, env: dict[str, str], *args: str) -> Any:
    done = subprocess.run(
        [*TFPLAN, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"tfplan {' '.join(args[:3])} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def planned_tasks(
    cwd: Path, env: dict[str, str], overrides: list[str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Plan ``overrides`` into ``cwd/by_hand.plan``; the plan, and each task (start order) as
    `show --task NAME --json` gives it: ``env`` the whole environment (checked to be
    ``{**plan.env, **task.env}``), ``tf_config`` a dict or None."""
    plan_file = cwd / "by_hand.plan"
    plan = _tfplan(cwd, env, "plan", "-out", str(plan_file), "--json", *overrides)
    names = [f"{t['role']}/{t['index']}" for t in plan["tasks"]]
    shown = _tfplan(cwd, env, "show", str(plan_file), "--json", *(f"--task={n}" for n in names))
    for task, full in zip(plan["tasks"], shown, strict=True):
        if full["env"] != {**plan["env"], **task["env"]} or full["command"] != task["command"]:
            raise RuntimeError(f"{full['name']}: `show --task` and the plan file disagree")
    return plan, shown


def tf_config_text(tf_config: dict[str, Any]) -> str:
    """TF_CONFIG as tfplan exports it: compact JSON, keys sorted."""
    return json.dumps(tf_config, sort_keys=True, separators=(",", ":"))


def stage(plan: dict[str, Any]) -> None:
    """What every backend ships before it starts the tasks (tfplan/backends/staging.py): the
    recipes package under ``code_dir`` (built-in recipes) and each task's run.yaml."""
    if plan["builtin_recipes"]:
        shutil.copytree(
            REPO / "recipes",
            Path(plan["code_dir"]) / "recipes",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    run_yaml = yaml.safe_dump(plan["run_config"], sort_keys=True)
    for task in plan["tasks"]:
        workdir = Path(task["workdir"])
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "run.yaml").write_text(run_yaml)
