"""In-memory snapshots with the real recipes: a parameter server killed mid-training comes back
from its own snapshot (seconds old), not from the last checkpoint (thousands of steps old).

Waits are on log lines: the chief's line for its first snapshot, a step past it, the restore's
line. No step limit races them (training ends with the Ctrl-C).
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    base_overrides,
    free_port_base,
    kill_groups,
    paced,
    recorded_groups,
    small_tmpfs,
    tfplan,
)
from chaos_helpers import ApplyRun, checkpoint_steps, kill_task

pytestmark = [pytest.mark.cluster, pytest.mark.full]

FIRST = r"^worker/0\s+\| snapshots: every [\d.]+s, each ps into (\S+) on its own host; the first at step ([\d,]+)"
RESTORED = (
    r"^worker/0\s+\| ps/0 restored from its snapshot of step ([\d,]+) \([\d.]+ s old\): "
    r"([\d,]+) steps lost \(the chief saw step ([\d,]+)\); the last checkpoint was at step 0$"
)


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    ApplyRun.kill_all(tmp_path)  # first the supervisor, so that it restarts nothing (seen: a
    kill_groups(recorded_groups(tmp_path))  # failed run's ps restarted after this, left running)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _training_on(ws: Path, snapshot_secs: float) -> ApplyRun:
    """The default cluster training on, paced, until the Ctrl-C; one checkpoint (the first);
    snapshots every ``snapshot_secs``; a ps restarts after 0.2 s."""
    return ApplyRun(
        ws,
        [
            *base_overrides(ws, free_port_base()),
            "trainer.max_steps=100000000",
            *paced(0.02),
            "trainer.log_steps=25",
            "trainer.checkpoint_steps=1000000",
            "lifecycle.restart.backoff_secs=0.2",
            f"lifecycle.snapshot_secs={snapshot_secs:g}",
        ],
    )


@pytest.mark.timeout(600)
def test_a_killed_ps_comes_back_from_its_snapshot_not_from_the_checkpoint(ws: Path) -> None:
    shm = ws / "shm"  # lifecycle.snapshot_dir of base_overrides
    run = _training_on(ws, snapshot_secs=0.5)
    first = run.wait_for(FIRST, 300)
    where, first_step = re.search(FIRST, run.lines[first][1]).groups()  # type: ignore[union-attr]
    assert Path(where).parent == shm and (Path(where) / "ps0").is_dir()
    before = run.wait_step(_number(first_step) + 100, 300, task="worker/0")
    before_step = run.steps(before, before + 1)[0][1]
    checkpoints = checkpoint_steps(ws / "out")
    assert max(checkpoints) <= _number(first_step), checkpoints
    kill_task(ws, "ps/0")
    restored = run.wait_for(RESTORED, 120, before)
    found = re.search(RESTORED, run.lines[restored][1])
    assert found, run.lines[restored][1]
    step, lost, seen = (_number(v) for v in found.groups())
    assert step >= _number(first_step) > max(checkpoints)
    assert seen - step == lost and seen >= before_step
    for worker in ("worker/0", "worker/1"):
        run.wait_for(rf"^{worker}\s+\| step=", 120, restored)
    after = [s for _, s in run.steps(restored + 1)]
    assert after and min(after) >= step, (step, after[:5])
    assert "restoring model.ckpt" not in run.text()
    # tfplan status says it while the job runs (the chief's ps_recoveries.jsonl in output_dir)
    shown = tfplan(ws, "status", "--json", check=True)
    recoveries = json.loads(shown.stdout)["ps_recoveries"]
    assert [(r["ps"], r["source"], r["step"], r["lost_steps"]) for r in recoveries] == [
        (0, "snapshot", step, lost)
    ], recoveries
    table = tfplan(ws, "status", check=True).stdout
    assert f"ps/0 from its snapshot of step {step:,}, {lost:,} steps lost" in table, table
    run.proc.send_signal(signal.SIGINT)
    run.finish(timeout=120)
    # the Ctrl-C stopped the ps (SIGTERM): it removed its snapshots (memory), as a finished job's
    # ps does (test_recipes_cluster.py); the kill above left them for its restart, which used them
    assert not Path(where).exists(), sorted(Path(where).rglob("*"))


@pytest.mark.timeout(600)
def test_what_a_ps_killed_outright_left_in_memory_is_removed_when_the_job_ends(ws: Path) -> None:
    """A ps SIGKILLed cannot remove its snapshots (they are kept for its restart); not restarted
    here (its policy: Never), the run fails, and giving the allocation back removes them: memory
    in /dev/shm would otherwise stay taken until the host reboots."""
    shm = ws / "shm"  # lifecycle.snapshot_dir of base_overrides
    run = ApplyRun(
        ws,
        [
            *base_overrides(ws, free_port_base()),
            "trainer.max_steps=100000000",
            *paced(0.02),
            "lifecycle.restart.ps=Never",
            "lifecycle.snapshot_secs=0.5",
        ],
    )
    first = run.wait_for(FIRST, 300)
    where = Path(re.search(FIRST, run.lines[first][1]).group(1))  # type: ignore[union-attr]
    assert where.parent == shm and (where / "ps0").is_dir()
    kill_task(ws, "ps/0")
    code = run.finish(timeout=300)
    assert code != 0, run.text()[-3000:]
    assert re.search(r"ps/0 failed \(exit code 137\)", run.text()), run.text()[-3000:]
    assert not where.exists(), sorted(where.rglob("*"))


@pytest.mark.timeout(600)
def test_a_ps_killed_before_its_first_snapshot_is_recorded_as_back_from_the_checkpoint(
    ws: Path,
) -> None:
    """No snapshot to come back from yet (the first one an hour away): the chief restores every ps
    from the last checkpoint, and that recovery is said and recorded like a snapshot's (its
    source, its step, the steps lost) for the stream, ``status`` and result.json."""
    run = _training_on(ws, snapshot_secs=3600)
    before = run.wait_step(50, 300, task="worker/0")
    kill_task(ws, "ps/0")
    back = run.wait_for(
        r"^worker/0\s+\| ps/0 restored from its checkpoint of step 0 \(no newer snapshot of it\): "
        r"([\d,]+) steps lost \(the chief saw step ([\d,]+)\)$",
        120,
        before,
    )
    lost, seen = (
        _number(v)
        for v in re.search(r"([\d,]+) steps lost.*step ([\d,]+)\)", run.lines[back][1]).groups()
    )  # type: ignore[union-attr]
    assert lost == seen >= 50, run.lines[back][1]
    shown = tfplan(ws, "status", "--json", check=True)
    recoveries = json.loads(shown.stdout)["ps_recoveries"]
    assert [(r["ps"], r["source"], r["step"], r["lost_steps"]) for r in recoveries] == [
        (0, "checkpoint", 0, lost)
    ], recoveries
    run.proc.send_signal(signal.SIGINT)
    run.finish(timeout=120)


FULL = (
    r"^worker/0\s+\| snapshots: \w+Error: .*No space left on device.*; a restarted ps comes back "
    r"from the last checkpoint instead$"
)


@pytest.mark.timeout(600)
def test_a_full_snapshot_folder_is_said_once_and_a_killed_ps_comes_back_from_the_checkpoint(
    ws: Path,
) -> None:
    """lifecycle.snapshot_dir on a tmpfs of 1 MB, the ps holding more (a 4,096-wide hidden
    layer: 1.2 MB): every snapshot fails; training goes on, one line says so (once, however
    many tries), and a killed ps comes back from the last checkpoint."""
    with small_tmpfs(ws / "tiny", "1m", ws) as tiny:
        try:
            overrides = [
                o
                for o in base_overrides(ws, free_port_base())
                if not o.startswith("lifecycle.snapshot_dir=")
            ]
            run = ApplyRun(
                ws,
                [
                    *overrides,
                    f"lifecycle.snapshot_dir={tiny}",
                    "model.hidden=[4096]",
                    "trainer.max_steps=100000000",
                    *paced(0.02),
                    "trainer.log_steps=25",
                    "trainer.checkpoint_steps=1000000",
                    "lifecycle.restart.backoff_secs=0.2",
                    "lifecycle.snapshot_secs=0.5",
                ],
            )
            said = run.wait_for(FULL, 300)
            # training goes on past the failures: a hundred steps, a few dozen snapshots' tries
            at = run.wait_step(1, 300, task="worker/0", after=said)
            before = run.wait_step(run.steps(at, at + 1)[0][1] + 100, 300, "worker/0", after=at)
            kill_task(ws, "ps/0")
            back = run.wait_for(
                r"^worker/0\s+\| ps/0 restored from its checkpoint of step 0 \(no newer snapshot of "
                r"it\): ([\d,]+) steps lost",
                120,
                before,
            )
            run.wait_step(1, 120, task="worker/0", after=back)  # and trains on
            run.proc.send_signal(signal.SIGINT)
            run.finish(timeout=120)
            told = [line for _, line in run.lines if re.search(r"\| snapshots: \w+Error", line)]
            assert len(told) == 1, told
        finally:
            ApplyRun.kill_all(ws)  # the supervisor first, so that it restarts nothing


SYNC_FIRST = (
    r"^worker/0\s+\| snapshots: every [\d.]+s, each ps into \S+ on its own host and a copy on "
    r"the next ps's host, between two rounds \(the rounds wait for it\); the first at step ([\d,]+)"
)


# A model whose every update is the same: two kernels (one on each ps), the loss the mean
# prediction over inputs of ones, so each weight's gradient is exactly 1 in every round and SGD
# with a learning rate of 2**-10 moves it by exactly 2**-10: after N applied rounds each weight
# is exactly -N * 2**-10. A round applied twice, or one lost, shows in the weights against the
# global step.
COUNTING = """
import keras
import tensorflow as tf


def build():
    x = keras.Input((4,), name="x")
    a = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="a")(x)
    b = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="b")(x)
    return keras.Model({"x": x}, keras.layers.Add(name="total")([a, b]))


def make(split, shard_index, num_shards, batch_size, seed):
    ds = tf.data.Dataset.from_tensor_slices(({"x": tf.ones((64, 4))}, tf.zeros((64, 1))))
    return (ds.repeat() if split == "train" else ds).batch(batch_size, drop_remainder=True)


def mean_prediction(y_true, y_pred):
    return tf.reduce_mean(y_pred)
"""
LR = 2.0**-10


def _weights(folder: Path) -> tuple[int, dict[str, list[float]]]:
    """The global step and the kernels of the latest checkpoint in ``folder``."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(folder))
    names = reader.get_variable_to_shape_map()
    kernels = {
        n: [float(v) for v in reader.get_tensor(n).ravel()]
        for n in names
        if n.endswith("kernel") and "/" in n and not any(s in n for s in ("Adagrad", "Momentum"))
    }
    return int(reader.get_tensor("global_step")), kernels


@pytest.mark.timeout(600)
def test_a_synchronous_job_brings_every_ps_back_to_one_snapshot_and_applies_every_round_once(
    ws: Path,
) -> None:
    """sync on 2 ps: the snapshots are taken between two rounds (SyncReplicasOptimizer's chief
    applies rounds in a thread of its own, held back for each). ps/1 killed: every ps goes back
    to the same snapshot, so the global step counts exactly the rounds both hold (ps/1 alone
    back would lose rounds the step on ps/0 counts). Training goes on from that step: the
    accumulators on the ps that lived take the rounds again (the chief's session sets their
    step), none is applied twice (no step below it, none skipped). Read in the weights of a
    model whose every round moves each by exactly lr (:data:`COUNTING`): the final checkpoint's
    are exactly -step * lr, so the restored ones were the snapshot's step's, and no round was
    applied after training's end (RoundGate.finish, before the final checkpoint)."""
    package = ws / "counting"
    package.mkdir()
    (package / "__init__.py").write_text(COUNTING)
    steps = 800  # paced: 16 s at least; the kill comes in its first two hundred steps
    run = ApplyRun(
        ws,
        [
            *base_overrides(ws, free_port_base()),
            "algo=sync",
            f"algo.lr={LR}",
            "cluster.ps=2",
            "model._target_=counting.build",
            "data._target_=counting.make",
            "model.loss=counting.mean_prediction",
            "model.metrics=[]",
            "data.batch_size=16",
            f"trainer.max_steps={steps}",
            *paced(0.02),
            "trainer.log_steps=10",
            "trainer.checkpoint_steps=1000000",
            "trainer.export_model=false",
            "lifecycle.restart.backoff_secs=0.2",
            "lifecycle.snapshot_secs=0.5",
        ],
    )
    first = run.wait_for(SYNC_FIRST, 300)
    first_step = _number(re.search(SYNC_FIRST, run.lines[first][1])[1])  # type: ignore[index]
    before = run.wait_step(first_step + 30, 300, task="worker/0")
    last_checkpoint = max(checkpoint_steps(ws / "out"))  # (the recovered session writes one)
    kill_task(ws, "ps/1")
    together = run.wait_for(
        r"^worker/0\s+\| ps/1 came back: every ps goes back to one snapshot \(synchronous rounds\)",
        120,
        before,
    )
    restored = []
    for k in (0, 1):
        line = run.wait_for(
            rf"^worker/0\s+\| ps/{k} restored from its snapshot of step", 60, together
        )
        restored.append(_number(re.search(r"of step ([\d,]+)", run.lines[line][1])[1]))  # type: ignore[index]
    assert restored[0] == restored[1] > last_checkpoint, (restored, last_checkpoint)
    step = restored[0]
    again = run.wait_for(r"^worker/0\s+\| step=", 120, together)
    after = [s for name, s in run.steps(again) if name == "worker/0"]
    assert after and min(after) >= step, (step, after[:5])
    run.wait_step(step + 30, 120, task="worker/0", after=again)  # rounds go on from there
    recoveries = json.loads(tfplan(ws, "status", "--json", check=True).stdout)["ps_recoveries"]
    assert sorted((r["ps"], r["source"], r["step"]) for r in recoveries) == [
        (0, "snapshot", step),
        (1, "snapshot", step),
    ], recoveries
    code = run.finish(timeout=300)
    assert code == 0, run.text()[-3000:]
    final, kernels = _weights(ws / "out")
    assert final >= steps and len(kernels) == 2, (final, kernels)
    # each round after the restore moved each weight by lr and the step by 1: the weights are
    # -final * lr only if those restored were -step * lr, the snapshot's step
    for name, values in kernels.items():
        assert values == [-final * LR] * 4, (name, final, values, -final * LR)
