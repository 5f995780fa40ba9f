"""Terminal output of apply, logs and watch: task-prefixed log lines and a global-step bar."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from tfplan.engine.lognoise import HIDDEN_HINT, NoiseFilter

__all__ = [
    "LogPrinter",
    "add_all_lines_argument",
    "recoveries_line",
    "shown_step",
    "start_progress",
    "step_progress",
]


def recoveries_line(recoveries: object) -> str | None:
    """result.json's ``ps_recoveries`` (each ps restore the chief made while training) as one
    line of apply's report; None when there were none."""
    if not isinstance(recoveries, list):
        return None
    parts = []
    for r in recoveries:
        if not isinstance(r, dict):
            continue
        step, lost = r.get("step"), r.get("lost_steps")
        of = (
            f" of step {step:,}"
            if isinstance(step, int) and r.get("source") != "initial values"
            else ""
        )
        gone = f", {lost:,} steps lost" if isinstance(lost, int) else ""
        copy = f" (its copy on {r['copy_on']})" if r.get("copy_on") else ""
        parts.append(f"ps/{r.get('ps')} from its {r.get('source')}{of}{copy}{gone}")
    return "Parameter servers recovered while training: " + "; ".join(parts) if parts else None


_ROLE_STYLE = {
    "ps": "blue",
    "chief": "green",
    "worker": "cyan",
    "evaluator": "magenta",
    "tfplan": "bold",
}


class LogPrinter:
    """Prints ``worker/1 | line``: coloured by role in a terminal, plain when piped.

    TensorFlow's start-up noise (:mod:`tfplan.engine.lognoise`) is left out unless ``show_all``;
    the first time a line is left out, one ``tfplan | ...`` line says so and how to see it.
    """

    def __init__(self, console: Console, show_all: bool = False) -> None:
        self.console = console
        self.width = 12
        self.noise = NoiseFilter(show_all)

    def emit(self, task: str, line: str) -> None:
        if not self.noise.keeps(task, line):
            if self.noise.hint_due:
                self._print("tfplan", HIDDEN_HINT)
            return
        self._print(task, line)

    def emit_log(self, task: str, lines: Iterable[str], last: int = 0) -> None:
        """Print a log read whole (``tfplan logs`` without ``-f``): its shown lines, only the
        last ``last`` of them when given."""
        kept = [line for line in lines if self.noise.keeps(task, line)]
        if self.noise.hint_due:
            self._print("tfplan", HIDDEN_HINT)
        for line in kept[-last:] if last else kept:
            self._print(task, line)

    def _print(self, task: str, line: str) -> None:
        role = task.split("/", 1)[0]
        self.width = max(self.width, len(task))
        text = Text(f"{task:<{self.width}} | ", style=_ROLE_STYLE.get(role, ""))
        text.append(line)
        self.console.print(text, soft_wrap=True, highlight=False)


def add_all_lines_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--all-lines",
        action="store_true",
        help="show every line of the tasks' logs, TensorFlow's start-up messages included "
        "(hidden by default, as with recipe.show_tf_noise=false; the logs keep them)",
    )


def shown_step(step: int, total: int | None) -> tuple[int, str]:
    """(the bar's count, a note after it) for global step ``step`` of ``total``.

    In the asynchronous algorithms every worker finishes the step it has begun when the chief
    reaches trainer.max_steps, so the global step ends a few past it (305 of 300): the count
    stops at the total, and the note says the true step."""
    if total is None or step <= total:
        return step, ""
    return total, f" (global step {step})"


@contextmanager
def step_progress(console: Console, max_steps: int | None) -> Iterator[Callable[[int], None]]:
    """A live global-step bar on a terminal, that ends at ``max_steps`` however far past it the
    step goes (:func:`shown_step`); a no-op callback when output is piped."""
    if not console.is_terminal:
        yield lambda step: None
        return
    progress = Progress(
        TextColumn("global step"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}{task.fields[past]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    bar = progress.add_task("train", total=max_steps, past="")

    def update(step: int) -> None:
        count, past = shown_step(step, max_steps)
        progress.update(bar, completed=count, past=past)

    with progress:
        yield update


@contextmanager
def start_progress(console: Console, show_from: int = 25) -> Iterator[Callable[[int, int], None]]:
    """Tasks started so far, for an apply of ``show_from`` tasks or more: a live bar on a
    terminal; when output is piped, a plain line at every tenth."""
    shown: list[int] = []
    if not console.is_terminal:

        def plain(done: int, total: int) -> None:
            if total < show_from or done == 0:
                return
            tenth = done * 10 // total
            if not shown or tenth > shown[-1]:
                shown.append(tenth)
                console.print(f"tfplan | started {done}/{total} tasks", highlight=False)

        yield plain
        return
    progress = Progress(
        TextColumn("starting tasks"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    bar: list[Any] = []

    def live(done: int, total: int) -> None:
        if total < show_from:
            return
        if not bar:
            progress.start()
            bar.append(progress.add_task("start", total=total))
        progress.update(bar[0], completed=done)

    try:
        yield live
    finally:
        if bar:
            progress.stop()
