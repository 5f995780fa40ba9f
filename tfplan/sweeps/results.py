"""A sweep's results: one row per point from its real outputs, as a table, CSV, JSON and a plot.

Each row joins the point's record (``sweep.json``: overrides, status, reason, times) with what its
chief wrote (``<point dir>/result.json``: global step, held-out accuracy, loss, examples/sec).
The plot draws held-out accuracy against seconds since the point started: one line per point,
from the evaluator's ``eval/metrics.jsonl`` when it ran (``cluster.evaluator=true``), ending at
the chief's final accuracy.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tfplan.files import read_json_object, write_atomic
from tfplan.sweeps.sweep import PointRecord, SweepRecord

__all__ = ["ResultRow", "load_rows", "render_table", "write_report", "plot_accuracy", "COLUMNS"]

COLUMNS = (
    "num",
    "overrides",
    "status",
    "global_step",
    "accuracy",
    "loss",
    "examples_per_sec",
    "wall_time_secs",
    "train_time_secs",
    "resumed_from",
    "experiment_id",
    "output_dir",
    "reason",
)


@dataclass(frozen=True)
class ResultRow:
    num: int
    overrides: str
    status: str
    global_step: int | None
    accuracy: float | None  # held-out
    loss: float | None  # on (a bounded sample of) the training set, final weights
    examples_per_sec: float | None
    wall_time_secs: float | None  # the whole point: plan, start, train, teardown
    train_time_secs: float | None  # the chief's training loop (result.json)
    resumed_from: int | None
    experiment_id: str
    output_dir: str
    reason: str
    curve: tuple[tuple[float, float], ...]  # (seconds since the point started, accuracy)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["curve"] = [list(p) for p in self.curve]
        return data


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _curve(point: PointRecord, result: dict[str, Any] | None) -> tuple[tuple[float, float], ...]:
    if point.started_at is None:
        return ()
    start = float(point.started_at)
    points: list[tuple[float, float]] = []
    try:
        lines = (Path(point.output_dir) / "eval" / "metrics.jsonl").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        at, acc = _number(entry.get("time")), _number(entry.get("accuracy"))
        if at is not None and acc is not None and at >= start:  # this run's, not a resumed one's
            points.append((round(at - start, 3), acc))
    final = _number((result or {}).get("accuracy"))
    if final is not None:
        try:  # the chief wrote result.json when training ended: that is the final point's time
            at = (Path(point.output_dir) / "result.json").stat().st_mtime
        except OSError:
            at = float(point.ended_at or start)
        points.append((round(at - start, 3), final))
    return tuple(sorted(points))


def load_rows(sweep_dir: Path) -> tuple[dict[str, Any], list[ResultRow]]:
    """(the sweep's header, one row per point) read from the sweep folder as it is now.

    Raises:
        TfplanError: no readable sweep.json in ``sweep_dir``.
    """
    header, points = SweepRecord.load(sweep_dir)
    rows = []
    for point in sorted(points, key=lambda p: p.num):
        result = read_json_object(Path(point.output_dir) / "result.json")
        if point.status != "succeeded":
            result = None  # a file left by an earlier run is not this point's
        res = result or {}
        wall = (
            round(point.ended_at - point.started_at, 3)
            if point.ended_at is not None and point.started_at is not None
            else None
        )
        step = res.get("global_step", point.last_step)
        rows.append(
            ResultRow(
                num=point.num,
                overrides=point.label,
                status=point.status,
                global_step=int(step) if isinstance(step, (int, float)) else None,
                accuracy=_number(res.get("accuracy")),
                loss=_number(res.get("loss")),
                examples_per_sec=_number(res.get("examples_per_sec")),
                wall_time_secs=wall,
                train_time_secs=_number(res.get("wall_time_secs")),
                resumed_from=point.resumed_from,
                experiment_id=point.experiment_id,
                output_dir=point.output_dir,
                reason=point.reason,
                curve=_curve(point, result),
            )
        )
    return header, rows


def _fmt(value: float | int | None, digits: int) -> str:
    if value is None:
        return ""
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def render_table(rows: list[ResultRow], console: Console, title: str) -> None:
    """One row per point; a point that did not succeed shows its reason under its overrides
    (a pruned one: ``pruned at step N: ...``, its step the one it was pruned at)."""
    table = Table(title=title)
    for name, justify in (
        ("#", "right"),
        ("overrides", "left"),
        ("status", "left"),
        ("step", "right"),
        ("accuracy", "right"),
        ("loss", "right"),
        ("examples/s", "right"),
        ("wall s", "right"),
    ):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        style = {
            "succeeded": "green",
            "failed": "red",
            "interrupted": "yellow",
            "pruned": "magenta",
        }.get(row.status, "")
        overrides = row.overrides if row.status == "succeeded" else f"{row.overrides}\n{row.reason}"
        table.add_row(
            str(row.num),
            overrides,
            f"[{style}]{row.status}[/]" if style else row.status,
            _fmt(row.global_step, 0),
            _fmt(row.accuracy, 4),
            _fmt(row.loss, 4),
            _fmt(row.examples_per_sec, 1),
            _fmt(row.wall_time_secs, 1),
        )
    console.print(table)


def write_report(sweep_dir: Path, header: dict[str, Any], rows: list[ResultRow]) -> list[Path]:
    """results.csv, results.json and accuracy.png (when matplotlib is there) in ``sweep_dir``."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.to_dict().items()})
    csv_path, json_path = sweep_dir / "results.csv", sweep_dir / "results.json"
    write_atomic(csv_path, buffer.getvalue())
    doc = {
        "sweep_id": header.get("sweep_id"),
        "sweep_dir": str(sweep_dir),
        "points": [r.to_dict() for r in rows],
    }
    write_atomic(json_path, json.dumps(doc, indent=2) + "\n")
    written = [csv_path, json_path]
    png = plot_accuracy(rows, sweep_dir / "accuracy.png", str(header.get("sweep_id", "")))
    if png is not None:
        written.append(png)
    return written


def plot_accuracy(rows: list[ResultRow], path: Path, title: str) -> Path | None:
    """Held-out accuracy against time, one line per point; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for row in rows:
        if not row.curve:
            continue
        xs, ys = zip(*row.curve, strict=True)
        failed = "" if row.status == "succeeded" else f" ({row.status})"
        ax.plot(xs, ys, marker="o", label=f"#{row.num} {row.overrides}{failed}")
    ax.set_xlabel("seconds since the point started")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"sweep {title}")
    ax.grid(True, alpha=0.3)
    if any(row.curve for row in rows):
        ax.legend(fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
