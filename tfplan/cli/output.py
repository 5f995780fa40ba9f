"""Terminal output shared by apply and logs: task-prefixed log lines and a global-step bar."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

__all__ = ["LogPrinter", "step_progress"]

_ROLE_STYLE = {
    "ps": "blue",
    "chief": "green",
    "worker": "cyan",
    "evaluator": "magenta",
    "tfplan": "bold",
}


class LogPrinter:
    """Prints ``worker/1 | line``: coloured by role in a terminal, plain when piped."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.width = 12

    def emit(self, task: str, line: str) -> None:
        role = task.split("/", 1)[0]
        self.width = max(self.width, len(task))
        text = Text(f"{task:<{self.width}} | ", style=_ROLE_STYLE.get(role, ""))
        text.append(line)
        self.console.print(text, soft_wrap=True, highlight=False)


@contextmanager
def step_progress(console: Console, max_steps: int | None) -> Iterator[Callable[[int], None]]:
    """A live global-step bar on a terminal; a no-op callback when output is piped."""
    if not console.is_terminal:
        yield lambda step: None
        return
    progress = Progress(
        TextColumn("global step"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    bar = progress.add_task("train", total=max_steps)
    with progress:
        yield lambda step: progress.update(bar, completed=step)
