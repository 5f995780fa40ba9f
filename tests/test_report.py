"""`tfplan report`: a sweep's table, CSV, JSON and accuracy plot, re-rendered from its folder."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from apply_helpers import free_port_base, kill_groups, recorded_groups, tfplan
from sweep_helpers import command, result_task, sweep_overrides


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def test_report_rerenders_the_runs_figures_and_plot(ws: Path) -> None:
    port = free_port_base(30)
    script = result_task(ws)
    tfplan(
        ws,
        "apply",
        "-m",
        "--auto-approve",
        *sweep_overrides(ws, port),
        "recipe=command",
        f"recipe.command={command(script, steps='5')}",
        "algo.lr=0.03,0.05",
        check=True,
    )
    sweep = ws / "out"
    for name in ("results.csv", "results.json", "accuracy.png"):
        (sweep / name).unlink()

    proc = tfplan(ws, "report", str(sweep), check=True)
    lines = [ln for ln in proc.stdout.splitlines() if "algo.lr=" in ln]
    assert len(lines) == 2
    assert "succeeded" in lines[0] and "0.9800" in lines[0] and "5" in lines[0].split()
    assert "0.2000" not in proc.stdout and "1.0000" in lines[1]  # 1 - |lr - 0.05|

    rows = list(csv.DictReader((sweep / "results.csv").open()))
    assert [
        (
            r["overrides"],
            r["status"],
            r["global_step"],
            r["accuracy"],
            r["loss"],
            r["examples_per_sec"],
        )
        for r in rows
    ] == [
        ("algo.lr=0.03", "succeeded", "5", "0.98", "0.1", "1005.0"),
        ("algo.lr=0.05", "succeeded", "5", "1.0", "0.1", "1005.0"),
    ]
    for row in rows:
        assert 0 < float(row["wall_time_secs"]) < 60 and row["experiment_id"].startswith("s-")
    points = json.loads((sweep / "results.json").read_text())["points"]
    for point in points:
        metrics = [
            json.loads(ln)
            for ln in (Path(point["output_dir"]) / "eval" / "metrics.jsonl")
            .read_text()
            .splitlines()
        ]
        curve = point["curve"]
        # Every evaluation of this run, then the final accuracy; time runs forward.
        assert [acc for _, acc in curve] == [m["accuracy"] for m in metrics] + [point["accuracy"]]
        assert [t for t, _ in curve] == sorted(t for t, _ in curve) and curve[0][0] > 0

    png = sweep / "accuracy.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[0] >= 300 and image.shape[1] >= 500
    # Two coloured lines were drawn: matplotlib's first two colours are in the image.
    rgb = (image[..., :3] * 255).round().astype(int).reshape(-1, 3)
    colours = {tuple(int(v) for v in c) for c in np.unique(rgb, axis=0)}
    assert (31, 119, 180) in colours and (255, 127, 14) in colours

    by_id = tfplan(ws, "report", "s", check=True)  # a sweep id works as well as its folder
    assert "algo.lr=0.03" in by_id.stdout


def test_report_on_a_folder_that_is_no_sweep_is_one_line(ws: Path) -> None:
    proc = tfplan(ws, "report", str(ws))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "is not a sweep folder (no sweep.json)" in proc.stderr
    unknown = tfplan(ws, "report", "nosuch")
    assert unknown.returncode == 1 and "no experiment or sweep 'nosuch'" in unknown.stderr
