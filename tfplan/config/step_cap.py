"""``TFPLAN_MAX_STEPS_CAP=N``: train at most N steps, whatever the command line asks.

Why: the documentation's commands are run as written by a test (tests/test_docs.py), and a
command that trains 1000 steps as a user would is minutes on a small CI machine. The cap shortens
every run without editing the commands: ``trainer.max_steps`` is capped at N, and the step
cadences (checkpoints, logs, summaries) shrink by the same factor so that a capped run still
checkpoints, logs and writes summaries. The composed config is the one place every command
(plan, apply, each point of a sweep) goes through, so the cap is applied there
(:func:`tfplan.config.compose.to_config`), and says so in one line on stderr beside the plan.

The functions here are pure but :func:`cap_from_env`, which reads the environment and prints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, TextIO

from tfplan.config.schema import Config, TrainerConfig
from tfplan.errors import ConfigError

__all__ = ["ENV_VAR", "cap_from_env", "cap_steps", "capped_trainer", "read_cap"]

ENV_VAR = "TFPLAN_MAX_STEPS_CAP"

# the step cadences shrunk with max_steps, in the order the note names them
_CADENCES = ("checkpoint_steps", "log_steps", "summary_steps")

# the notes already printed by this process: a sweep composes one config per point
_said: set[str] = set()


def read_cap(env: Mapping[str, str]) -> int | None:
    """The cap ``env`` sets, or None when it sets none (unset or empty).

    Raises:
        ConfigError: the value is not a whole number >= 1 (a typo must not train 1000 steps
            in a test that meant 30).
    """
    text = env.get(ENV_VAR, "").strip()
    if not text:
        return None
    try:
        cap = int(text)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ConfigError(
            ENV_VAR, f"{text!r} is not a step count >= 1", f"set e.g. {ENV_VAR}=30, or unset it"
        )
    return cap


def capped_trainer(trainer: TrainerConfig, cap: int) -> tuple[TrainerConfig, str | None]:
    """``trainer`` with ``max_steps`` at most ``cap`` and its cadences scaled by the same factor
    (never 0, never above the cap), and the one-line note saying what changed; unchanged and
    None when ``max_steps`` is within the cap already."""
    if trainer.max_steps <= cap:
        return trainer, None
    changes: dict[str, Any] = {"max_steps": cap}
    said = [f"trainer.max_steps {trainer.max_steps} -> {cap}"]
    for name in _CADENCES:
        value = getattr(trainer, name)
        if value is None:
            continue  # checkpoint_steps=null: no step checkpoints, and none are made up
        scaled = min(cap, max(1, value * cap // trainer.max_steps))
        if scaled != value:
            changes[name] = scaled
            said.append(f"{name} {value} -> {scaled}")
    note = f"{ENV_VAR}={cap}: {said[0]}" + (f" ({', '.join(said[1:])})" if said[1:] else "")
    return replace(trainer, **changes), note


def cap_steps(cfg: Config, env: Mapping[str, str]) -> tuple[Config, str | None]:
    """``cfg`` with the cap ``env`` sets applied to its trainer, and the note (None: no cap, or
    nothing to cap).

    Raises:
        ConfigError: the cap is not a whole number >= 1.
    """
    cap = read_cap(env)
    if cap is None:
        return cfg, None
    trainer, note = capped_trainer(cfg.trainer, cap)
    return (replace(cfg, trainer=trainer) if note else cfg), note


def cap_from_env(
    cfg: Config, env: Mapping[str, str] | None = None, out: TextIO | None = None
) -> Config:
    """:func:`cap_steps` with this process's environment, its note written once per process to
    ``out`` (stderr: beside the plan, whatever stdout carries, a plan in JSON included).

    Raises:
        ConfigError: the cap is not a whole number >= 1.
    """
    capped, note = cap_steps(cfg, os.environ if env is None else env)
    if note and note not in _said:
        _said.add(note)
        print(f"Warning: {note}", file=out or sys.stderr, flush=True)
    return capped
