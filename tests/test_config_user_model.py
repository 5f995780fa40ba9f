"""Config for the user's own model and data (Hydra's instantiate convention on the command line)."""

from __future__ import annotations

from tfplan.config.compose import compose_config, instantiate_overrides, to_config


def test_target_selects_the_group_option_and_unknown_keys_become_keyword_arguments() -> None:
    assert instantiate_overrides(
        ["model._target_=p.build", "model.units=64", "model.loss=mse"]
    ) == [
        "model=keras",
        "model._target_=p.build",
        "++model.kwargs.units=64",
        "model.loss=mse",
    ]
    # a group chosen explicitly stays chosen; other groups pass unchanged
    assert instantiate_overrides(["model=mine", "model._target_=p.b", "algo.lr=0.1"]) == [
        "model=mine",
        "model._target_=p.b",
        "algo.lr=0.1",
    ]


def test_composed_user_model_and_file_data() -> None:
    cfg = to_config(
        compose_config(
            [
                "model._target_=my_pkg.models.build",
                "model.units=64",
                "model.loss=binary_crossentropy",
                "data=tfrecord",
                "data.train=shards/*.tfrecord",
                "data.features={x: {shape: [8]}, label: {dtype: int64}}",
            ]
        )
    )
    assert cfg.model.name == "keras" and cfg.model._target_ == "my_pkg.models.build"
    assert cfg.model.kwargs == {"units": 64} and cfg.model.loss == "binary_crossentropy"
    assert cfg.data.train == "shards/*.tfrecord"
    assert cfg.data.features["x"].shape == [8] and cfg.data.features["label"].dtype == "int64"
    factory = to_config(compose_config(["data._target_=my_pkg.data.make", "data.rows=9"]))
    assert (factory.data.name, factory.data.kwargs) == ("factory", {"rows": 9})
