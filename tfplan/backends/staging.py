"""What every backend puts where tasks read it: the built-in recipes and each task's run.yaml."""

from __future__ import annotations

from pathlib import Path

import yaml

from tfplan.planning.plan import Plan

__all__ = ["RECIPES_DIR", "run_yaml"]

# The recipes package, shipped to <code_dir>/recipes so a host needs no tfplan.
RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"


def run_yaml(plan: Plan) -> bytes:
    """The resolved experiment every task reads (docs/contract.md), as written to run.yaml."""
    return yaml.safe_dump(plan.run_config, sort_keys=True).encode()
