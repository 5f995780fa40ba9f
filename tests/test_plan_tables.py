"""The plan shows each embedding table (tfplan/planning/tables.py, from the inspection build's
listing in recipes/inspect_model.py): rows, width, bytes per ps with the optimizer's slots, what
one step moves at the configured batch; ``allreduce`` refuses a table over its limit at plan time
with one line; a table read whole under a TF1 algorithm is a plan warning naming the layer.

The pure part is checked against numbers worked out by hand; the end-to-end part plans a user's
model of three tables (one id, a bag of five ids, an Embedding subclass with its own call) on
npz data with the real CLI, which builds the model in a real TensorFlow process.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from apply_helpers import tfplan

from tfplan.planning.plan import ShardingPreview, ShardPlacement, VariableSpec
from tfplan.planning.tables import describe_tables, replicated_table_problem

RAW = [
    {
        "name": "model/user/embeddings",
        "layer": "user",
        "feature": "user",
        "rows": 1000,
        "width": 8,
        "bytes": 1000 * 8 * 4,
        "rows_only": True,
        "ids_per_example": 1,
    },
    {
        "name": "model/tags/embeddings",
        "layer": "tags",
        "feature": "tags",
        "rows": 300,
        "width": 4,
        "bytes": 300 * 4 * 4,
        "rows_only": True,
        "ids_per_example": 5,
    },
]
VARIABLES = (
    VariableSpec("global_step", (), 8),
    VariableSpec("model/user/embeddings/part_0", (500, 8), 16_000),
    VariableSpec("model/user/embeddings/part_1", (500, 8), 16_000),
    VariableSpec("model/tags/embeddings", (300, 4), 4_800),
)
PLACEMENT = ShardPlacement(
    "round_robin",
    {
        "global_step": 0,
        "model/user/embeddings/part_0": 1,
        "model/user/embeddings/part_1": 0,
        "model/tags/embeddings": 1,
    },
    (16_008, 20_800),
)


def test_bytes_per_ps_count_the_slots_and_a_step_moves_the_batchs_rows_with_their_ids() -> None:
    user, tags = describe_tables(RAW, VARIABLES, PLACEMENT, 2, "hogwild", "adam", 64)
    assert user.bytes_per_ps == (16_000 * 3, 16_000 * 3)  # the table and Adam's m and v
    assert tags.bytes_per_ps == (0, 4_800 * 3)
    assert (user.rows_per_step, tags.rows_per_step) == (64, 300)  # 64 x 5 = 320 > 300 rows
    assert user.read_bytes_per_step == user.write_bytes_per_step == 64 * (8 * 4 + 8)
    assert tags.read_bytes_per_step == 300 * (4 * 4 + 8)
    assert (user.reads, user.slots) == ("rows", 2)


@pytest.mark.parametrize(
    ("algo", "reads", "read_bytes"),
    [("pss", "rows", 64 * 40), ("downpour", "rows", 64 * 40), ("allreduce", "replica", None)],
)
def test_what_a_step_reads_follows_the_algorithm(algo: str, reads: str, read_bytes: int) -> None:
    """pss reads rows as the TF1 algorithms do; so do the windowed ones, whose copy leaves the
    tables out (a table read whole is copied: see below); allreduce has no ps."""
    num_ps = 0 if algo == "allreduce" else 2
    placement = None if algo == "allreduce" else PLACEMENT
    user, _ = describe_tables(RAW, VARIABLES, placement, num_ps, algo, "sgd", 64)
    assert (user.reads, user.read_bytes_per_step) == (reads, read_bytes)
    assert user.bytes_per_ps == (16_000, 16_000)[:num_ps]  # no ps: every worker holds it


def test_a_windowed_algorithm_copies_a_table_it_cannot_read_by_rows() -> None:
    """A table read whole (an Embedding subclass with its own call) stays in the windowed
    algorithms' copy, exchanged whole per window: no per-step read of the ps."""
    whole = [{**t, "rows_only": False} for t in RAW]
    user, _ = describe_tables(whole, VARIABLES, PLACEMENT, 2, "downpour", "sgd", 64)
    assert (user.reads, user.read_bytes_per_step, user.write_bytes_per_step) == (
        "window",
        None,
        None,
    )


def test_allreduce_refuses_a_table_over_its_limit_in_one_line() -> None:
    tables = describe_tables(RAW, VARIABLES, None, 0, "allreduce", "sgd", 64)
    assert replicated_table_problem(tables, "allreduce", 1.0) is None  # 31 KiB < 1 MiB
    line = replicated_table_problem(tables, "allreduce", 0.01)
    assert line is not None and "\n" not in line
    assert "model/user/embeddings" in line and "algo.replicated_table_limit_mb=0.01" in line
    assert "algo=hogwild" in line
    assert replicated_table_problem(tables, "hogwild", 0.01) is None


def test_the_tables_survive_the_plans_round_trip() -> None:
    tables = describe_tables(RAW, VARIABLES, PLACEMENT, 2, "hogwild", "adagrad", 32)
    preview = ShardingPreview(VARIABLES, (PLACEMENT,), "an inspection build", tables)
    assert ShardingPreview.from_dict(json.loads(json.dumps(preview.to_dict()))) == preview
    assert ShardingPreview.from_dict({"variables": [], "placements": []}).tables == ()


MODEL = textwrap.dedent(
    """
    import keras


    class Wrapped(keras.layers.Embedding):
        def call(self, inputs):  # its own call: read whole
            return super().call(inputs)


    def build(vocab=1000):
        user = keras.Input((), dtype="int64", name="user")
        tags = keras.Input((5,), dtype="int64", name="tags")
        u = keras.layers.Embedding(vocab, 8, name="user_emb")(user)
        t = keras.layers.Embedding(300, 4, name="tag_emb")(tags)
        w = Wrapped(vocab, 2, name="wrapped_emb")(user)
        x = keras.layers.Concatenate()([u, keras.layers.Flatten()(t), w])
        return keras.Model({"user": user, "tags": tags}, keras.layers.Dense(1)(x))
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "ctr_model.py").write_text(MODEL)
    rng = np.random.RandomState(0)
    np.savez(
        tmp_path / "train.npz",
        user=rng.randint(0, 1000, 256).astype(np.int64),
        tags=rng.randint(0, 300, (256, 5)).astype(np.int64),
        label=rng.randint(0, 2, 256).astype(np.int64),
    )
    return tmp_path


def _plan(project: Path, *overrides: str) -> tuple[int, str]:
    proc = tfplan(
        project,
        "plan",
        "model._target_=ctr_model.build",
        "data=npz",
        "data.train=train.npz",
        "data.batch_size=32",
        "model.loss=binary_crossentropy",
        f"cluster.workdir={project / 'work'}",
        *overrides,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_the_plan_lists_each_table_and_warns_of_one_read_whole(project: Path) -> None:
    code, out = _plan(project, "cluster.ps=2", "algo=hogwild", "algo.optimizer=adagrad")
    assert code == 0, out
    text = " ".join(out.split())
    assert "Embedding tables: 3 (algo.optimizer=adagrad: 1 slot(s) per row" in text
    assert "model/user_emb/embeddings 1,000 x 8 31.2 KiB (layer 'user_emb', feature 'user')" in text
    # the bag of five ids: 32 x 5 = 160 rows at most, 160 x (16 + 8) bytes
    assert "model/tag_emb/embeddings 300 x 4" in text
    assert "a step: <= 160 rows; reads only the batch's rows (<= 3.8 KiB)" in text
    assert "Warning: model/wrapped_emb/embeddings (layer 'wrapped_emb') is read whole" in text
    assert "user_emb') is read whole" not in text


def test_a_table_over_64_mib_is_split_over_the_ps_without_a_key(project: Path) -> None:
    """model.partition_bytes' default: 2,200,000 x 8 float32 (67.1 MB, over 64 MiB) is split
    by rows into one part per ps; the table of 2 columns (17.6 MB) stays whole; null: never."""
    big = ("cluster.ps=2", "algo=hogwild", "model.vocab=2200000")
    code, out = _plan(project, *big)
    assert code == 0, out
    parts = [ln.split() for ln in out.splitlines() if "/part_" in ln]
    assert [p[0] for p in parts] == [
        "model/user_emb/embeddings/part_0",
        "model/user_emb/embeddings/part_1",
    ], out
    assert {p[1] for p in parts} == {"1100000x8"} and {p[-1] for p in parts} == {"ps/0", "ps/1"}
    assert "wrapped_emb/embeddings/part_" not in out
    code, out = _plan(project, *big, "model.partition_bytes=null")
    assert code == 0, out
    assert "/part_" not in out


def test_allreduce_over_the_limit_is_refused_before_anything_starts(project: Path) -> None:
    code, out = _plan(
        project, "cluster.ps=0", "algo=allreduce", "algo.replicated_table_limit_mb=0.01"
    )
    assert code != 0
    errors = [line for line in out.splitlines() if "algo.replicated_table_limit_mb=0.01" in line]
    assert len(errors) == 1 and "model/user_emb/embeddings" in errors[0], out
    assert not (project / ".tfplan" / "plan.json").exists()
