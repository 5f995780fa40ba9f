"""The chief's checkpoints as the plan counts them (tfplan.planning.footprint.py): the
variables and the optimizer's slots, times the checkpoints kept, and the one line that refuses an
output disk without room for them."""

from __future__ import annotations

from tfplan.planning.footprint import checkpoint_size, ps_bytes, room_problem
from tfplan.planning.plan import ShardingPreview, ShardPlacement, VariableSpec

PREVIEW = ShardingPreview(
    variables=(
        VariableSpec("global_step", (), 8),
        VariableSpec("model/emb/embeddings", (1000, 16), 64_000),
        VariableSpec("model/dense/kernel", (16, 1), 64),
    ),
    placements=(),
)


def test_a_checkpoint_holds_the_variables_and_the_optimizers_slots_beside_the_models() -> None:
    sgd = checkpoint_size(PREVIEW, "sgd", 5)
    assert sgd is not None and (sgd.each, sgd.total) == (64_072, 320_360)
    adam = checkpoint_size(PREVIEW, "Adam", 2)  # two slots per model variable, not the step
    assert adam is not None and (adam.each, adam.kept) == (64_072 + 2 * 64_064, 2)
    assert checkpoint_size(ShardingPreview(variables=(), placements=()), "sgd", 5) is None


def test_a_disk_without_room_is_one_line_naming_the_keys_and_the_fixes() -> None:
    size = checkpoint_size(PREVIEW, "adagrad", 5)
    assert size is not None and size.each == 128_136
    assert room_problem(size, size.total, "/out", "h1") is None  # exactly enough
    line = room_problem(size, 3 * size.each, "/out", "h1")
    assert line == (
        "cluster.output_dir: 5 checkpoint(s) of at least 125.1 KiB each "
        "(trainer.keep_checkpoints=5) need 625.7 KiB, but /out on h1 has 375.4 KiB free: free "
        "space there, set cluster.output_dir to a larger disk, or keep fewer "
        "(trainer.keep_checkpoints=3)"
    )
    # not even one: keeping fewer is no fix
    assert (line := room_problem(size, 100, "/out", "h1")) is not None
    assert line.endswith("or shrink the model") and "keep fewer" not in line


def test_a_ps_holds_its_variables_and_the_slots_of_its_model_variables() -> None:
    placed = ShardPlacement(
        "round_robin",
        {"global_step": 0, "model/emb/embeddings": 1, "model/dense/kernel": 0},
        (72, 64_000),
    )
    preview = ShardingPreview(variables=PREVIEW.variables, placements=(placed,))
    assert ps_bytes(preview, "sgd") == (72, 64_000)
    assert ps_bytes(preview, "adam") == (72 + 2 * 64, 3 * 64_000)  # not the step's
    assert ps_bytes(PREVIEW, "adam") == ()  # no parameter servers
