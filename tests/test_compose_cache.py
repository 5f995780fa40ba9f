"""Composed configs kept between runs (tfplan/config/compose_cache.py): a repeated composition
is read back, equal to Hydra's; any change to what it depends on composes again; what could
read the environment or the clock is never kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

import tfplan.config.compose as compose_module
from tfplan.config import compose_cache
from tfplan.config.compose import BUILTIN_CONF, compose_config, to_config
from tfplan.errors import ConfigError


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TFPLAN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TFPLAN_COMPOSE_CACHE", raising=False)
    return tmp_path / "cache" / "compose"


def _hydra_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object) -> DictConfig:
        raise AssertionError("composed by Hydra, not read from the cache")

    monkeypatch.setattr(compose_module, "_compose", refused)


def test_a_repeated_composition_is_read_back_equal_to_hydras(
    own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = ["algo=downpour", "cluster.ps=2", "experiment.id=cached"]
    first = compose_config(overrides)
    assert len(list(own_cache.glob("*.pickle"))) == 1
    _hydra_refused(monkeypatch)
    again = compose_config(overrides)
    assert OmegaConf.to_yaml(again) == OmegaConf.to_yaml(first)
    assert to_config(again) == to_config(first)
    assert type(to_config(again).algo).__name__ == "DownpourConfig"  # the node's own schema
    with pytest.raises(AssertionError, match="composed by Hydra"):
        compose_config([*overrides, "cluster.workers=3"])  # another composition: not kept


def test_a_changed_file_of_the_users_groups_composes_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    (conf / "cluster").mkdir(parents=True)
    shutil.copy(BUILTIN_CONF / "cluster" / "local.yaml", conf / "cluster" / "mine.yaml")
    assert compose_config(["cluster=mine"], conf).cluster.workers == 2
    text = (conf / "cluster" / "mine.yaml").read_text().replace("workers: 2", "workers: 3")
    (conf / "cluster" / "mine.yaml").write_text(text)
    assert compose_config(["cluster=mine"], conf).cluster.workers == 3
    _hydra_refused(monkeypatch)
    assert compose_config(["cluster=mine"], conf).cluster.workers == 3  # now kept


def test_what_may_read_the_environment_is_never_kept(tmp_path: Path) -> None:
    trees = [BUILTIN_CONF]
    assert compose_cache.cache_key(["algo=sync"], trees) is not None
    assert compose_cache.cache_key(["cluster.workdir=${oc.env:HOME}/w"], trees) is None
    assert compose_cache.cache_key(["experiment.id=${now:%H}"], trees) is None
    assert compose_cache.cache_key(["cluster.output_dir=out/${experiment.id}"], trees)
    conf = tmp_path / "conf"
    (conf / "cluster").mkdir(parents=True)
    (conf / "cluster" / "mine.yaml").write_text("workdir: ${oc.env:SCRATCH,/tmp}/w\n")
    assert compose_cache.cache_key(["cluster=mine"], [conf, BUILTIN_CONF]) is None


def test_it_can_be_turned_off(own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFPLAN_COMPOSE_CACHE", "0")
    assert compose_cache.cache_key(["algo=sync"], [BUILTIN_CONF]) is None
    compose_config(["algo=sync"])
    assert not own_cache.exists()


def test_a_file_that_cannot_be_read_back_is_a_miss(own_cache: Path) -> None:
    first = compose_config(["algo=hogwild"])
    (kept,) = own_cache.glob("*.pickle")
    kept.write_bytes(b"not a pickle")
    assert OmegaConf.to_yaml(compose_config(["algo=hogwild"])) == OmegaConf.to_yaml(first)
    assert kept.read_bytes() != b"not a pickle"  # written again


def test_errors_are_not_kept_and_the_oldest_compositions_go_first(
    own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(2):
        with pytest.raises(ConfigError, match="cluster.typo: no such key"):
            compose_config(["+cluster.typo=1"])
    assert not list(own_cache.glob("*.pickle"))
    monkeypatch.setattr(compose_cache, "KEPT", 2)
    for workers in (1, 2, 3):
        compose_config([f"cluster.workers={workers}"])
    assert len(list(own_cache.glob("*.pickle"))) == 2
    _hydra_refused(monkeypatch)
    assert compose_config(["cluster.workers=3"]).cluster.workers == 3  # the newest stays
    with pytest.raises(AssertionError, match="composed by Hydra"):
        compose_config(["cluster.workers=1"])  # the oldest went
