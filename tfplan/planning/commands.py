"""Pure: the command line of each task: the built-in recipes, or the user's own command.

A user's command (``recipe=command``) may name per-task values in braces, so flag-style scripts
(the distributed TensorFlow guide's ``--job_name=... --task_index=... --ps_hosts=...``) run
unchanged::

    recipe.command="python trainer.py --job_name={job_name} --task_index={task_index}
                    --ps_hosts={ps_hosts} --worker_hosts={worker_hosts}"

``{{`` and ``}}`` are literal braces. The command is split into words first (shell quoting
rules), then each word is filled in, so a value can never split or join words.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfplan.config.schema import Config
from tfplan.errors import ConfigError
from tfplan.planning.topology import Place

__all__ = [
    "PLACEHOLDERS",
    "TaskFacts",
    "fill_command",
    "with_python",
    "placeholders_in",
    "split_command",
    "task_command",
]

PLACEHOLDERS = {
    "job_name": "the task's job: ps, worker, chief or evaluator",
    "task_index": "the task's index within its job",
    "ps_hosts": "every ps as host:port, comma-separated",
    "worker_hosts": "every worker as host:port, comma-separated",
    "chief_hosts": "the chief as host:port (empty when worker 0 is the chief)",
    "task_address": "this task's own host:port (empty for the evaluator)",
    "port": "this task's port (empty for the evaluator)",
    "num_ps": "how many parameter servers",
    "num_workers": "how many workers",
    "is_chief": "true for the chief (or worker 0 when it is the chief), else false",
    "output_dir": "the experiment's output folder",
    "python": "the interpreter the plan gives the task's host (its python, or cluster.python)",
}


@dataclass(frozen=True)
class TaskFacts:
    """What a command template can name about one task."""

    job_name: str
    task_index: int
    cluster: Mapping[str, Sequence[str]]  # job -> endpoints ("address:port")
    port: int | None
    is_chief: bool
    output_dir: str
    python: str = "python3"

    def value(self, name: str) -> str:
        """One placeholder's value (computed on demand: host lists grow with the cluster)."""
        if name in ("ps_hosts", "worker_hosts", "chief_hosts"):
            return ",".join(self.cluster.get(name.split("_")[0], ()))
        if name == "task_address":
            own = self.cluster.get(self.job_name, ())
            return own[self.task_index] if self.port is not None and own else ""
        if name == "num_ps":
            return str(len(self.cluster.get("ps", ())))
        if name == "num_workers":
            return str(len(self.cluster.get("worker", ())))
        simple = {
            "job_name": self.job_name,
            "task_index": str(self.task_index),
            "port": "" if self.port is None else str(self.port),
            "is_chief": "true" if self.is_chief else "false",
            "output_dir": self.output_dir,
            "python": self.python,
        }
        return simple[name]


class _Values(dict[str, str]):
    def __init__(self, facts: TaskFacts) -> None:
        super().__init__()
        self.facts = facts

    def __missing__(self, key: str) -> str:
        value = self.facts.value(key)
        self[key] = value
        return value


def placeholders_in(words: Sequence[str]) -> list[str]:
    """The placeholder names a template uses, in order of appearance.

    Raises:
        ConfigError: a brace is unbalanced, or a name is not one of :data:`PLACEHOLDERS`.
    """
    found: list[str] = []
    for word in words:
        try:
            parsed = list(string.Formatter().parse(word))
        except ValueError as error:
            raise ConfigError(
                "recipe.command",
                f"{word!r}: {error}",
                "write literal braces as {{ and }}",
            ) from None
        for _, field, spec, conversion in parsed:
            if field is None:
                continue
            if field not in PLACEHOLDERS or spec or conversion:
                raise ConfigError(
                    "recipe.command",
                    f"unknown placeholder {{{field}}}",
                    "use one of "
                    + ", ".join(f"{{{name}}}" for name in PLACEHOLDERS)
                    + " (or {{ and }} for literal braces)",
                )
            found.append(field)
    return found


def fill_command(words: Sequence[str], facts: TaskFacts) -> tuple[str, ...]:
    """The template's words with every placeholder filled in for one task."""
    values = _Values(facts)
    return tuple(word.format_map(values) for word in words)


def with_python(words: Sequence[str], python: str) -> tuple[str, ...]:
    """``words`` with ``{python}`` filled in and every other placeholder kept, for templates
    filled when the hosts are known (Slurm, Kubernetes: one interpreter for every node)."""

    def literal(text: str) -> str:
        return text.replace("{", "{{").replace("}", "}}")

    filled = []
    for word in words:
        parts = []
        for text, field, _, _ in string.Formatter().parse(word):
            parts.append(literal(text))
            if field is not None:
                parts.append(literal(python) if field == "python" else "{" + field + "}")
        filled.append("".join(parts))
    return tuple(filled)


def split_command(text: str) -> tuple[str, ...]:
    """The user's command as words (shell quoting rules).

    Raises:
        ConfigError: the quoting is broken.
    """
    try:
        return tuple(shlex.split(text))
    except ValueError as error:
        raise ConfigError(
            "recipe.command", f"cannot split {text!r}: {error}", "fix the quoting"
        ) from None


def task_command(
    cfg: Config,
    role: str,
    index: int,
    cluster: Mapping[str, Sequence[str]],
    where: Place,
    port: int | None,
    is_chief: bool,
    output_dir: str,
    run_yaml: str,
) -> tuple[str, ...]:
    """One task's command line: ``python -m recipes.train --config run.yaml`` for the built-in
    recipes, else the user's command with its placeholders filled in."""
    if cfg.recipe.kind != "command":
        return (where.python, "-m", "recipes.train", "--config", run_yaml)
    words = split_command(cfg.recipe.command or "")
    placeholders_in(words)
    facts = TaskFacts(role, index, cluster, port, is_chief, output_dir, where.python)
    return fill_command(words, facts)
