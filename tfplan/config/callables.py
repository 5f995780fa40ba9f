"""The callables of the user's that a config names (``model._target_``, ``data._target_``, a
dotted ``model.loss``): what apply ships (tfplan/engine/user_code.py) and what makes a task one
that may use Keras (tfplan/planning/planner.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tfplan.config.schema import Config

__all__ = ["named_targets"]


def named_targets(cfg: Config) -> list[tuple[str, str]]:
    """``(key, dotted target)`` for each callable of the user's the config names."""
    found = []
    for key, value in (
        ("model._target_", cfg.model._target_),
        ("data._target_", cfg.data._target_),
        ("model.loss", cfg.model.loss if "." in (cfg.model.loss or "") else None),
    ):
        if value:
            found.append((key, str(value)))
    return found
