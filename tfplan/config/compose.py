"""Compose the experiment config with Hydra, and turn Hydra's errors into one-line ConfigErrors."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tfplan.config import compose_cache
from tfplan.config.algorithms import ALGORITHMS
from tfplan.config.schema import (
    AlgoConfig,
    ClusterConfig,
    Config,
    DataConfig,
    ModelConfig,
    RecipeConfig,
)
from tfplan.config.step_cap import cap_from_env  # TFPLAN_MAX_STEPS_CAP: docs/planning.md
from tfplan.errors import ConfigError

if TYPE_CHECKING:
    from hydra.errors import MissingConfigException

__all__ = [
    "BUILTIN_CONF",
    "conf_dir",
    "compose_config",
    "config_from_dict",
    "groups_over",
    "instantiate_overrides",
    "one_line_error",
    "register_configs",
    "to_config",
]

# Groups whose option may be a user's callable (Hydra's instantiate convention): `_target_` set on
# the command line selects the group option that takes one, and every other key of the group
# that its schema does not know is a keyword argument of the callable.
_TARGET_GROUPS = {"model": "keras", "data": "factory"}


# tfplan's own config tree: config.yaml and every group's built-in options.
BUILTIN_CONF = (Path(__file__).resolve().parents[2] / "conf").resolve()


def conf_dir(given: str | Path | None = None) -> Path:
    """The config tree: ``given`` (``--config-dir``), else ``$TFPLAN_CONF``, else ``./conf`` when
    it is there, else tfplan's own ``conf/`` next to the package.

    A folder without a config.yaml holds only the user's own group options (``cluster/mine.yaml``
    for ``cluster=mine``): Hydra searches tfplan's own tree after it (:func:`groups_over`), so a
    user's file wins over tfplan's of the same name, and the user need not copy config.yaml."""
    if given:
        return Path(given).absolute()
    env = os.environ.get("TFPLAN_CONF")
    if env:
        return Path(env).resolve()
    here = Path.cwd() / "conf"
    if here.is_dir():
        return here.resolve()
    return BUILTIN_CONF


def groups_over(main: str | None) -> Path | None:
    """The tree to search after Hydra's primary config folder ``main``: tfplan's own when
    ``main`` holds only the user's groups (no config.yaml), else None (a whole tree, or none).
    hydra_plugins/tfplan_searchpath asks it, for every compose (a sweep's points included)."""
    if not main:
        return None
    folder = Path(main.removeprefix("file://"))
    if not folder.is_dir() or (folder / "config.yaml").is_file() or folder == BUILTIN_CONF:
        return None
    return BUILTIN_CONF


def register_configs() -> None:
    """Register the top-level schema and one schema per group option with Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="schema_config", node=Config)
    groups: dict[str, dict[str, Any]] = {
        "cluster": {"schema_cluster": ClusterConfig},
        "algo": {f"schema_{a.name}": a.schema for a in ALGORITHMS.values()},
        "model": {"schema_model": ModelConfig},
        "data": {"schema_data": DataConfig},
        "recipe": {"schema_recipe": RecipeConfig},
    }
    for group, schemas in groups.items():
        for name, node in schemas.items():
            cs.store(group=group, name=name, node=node)


def compose_config(overrides: list[str], config_dir: str | Path | None = None) -> DictConfig:
    """Compose ``config.yaml`` with Hydra's override grammar (the user's own groups of a
    ``conf/`` without config.yaml over tfplan's: :func:`conf_dir`).

    Raises:
        ConfigError: an unknown group option, key or wrongly typed value, in one line.
    """
    overrides = instantiate_overrides(overrides)
    directory = conf_dir(config_dir)
    if not directory.is_dir():
        raise ConfigError(
            "--config-dir",
            f"no folder {directory}",
            "give the folder of your own config groups (e.g. conf/ holding cluster/mine.yaml)",
        )
    # Kept from an earlier run of the same composition (tfplan/config/compose_cache.py): Hydra,
    # and its import, are skipped
    searched = groups_over(str(directory))
    key = compose_cache.cache_key(overrides, [directory, *([searched] if searched else [])])
    kept = compose_cache.load(key) if key else None
    if isinstance(kept, DictConfig):
        return kept
    cfg = _compose(overrides, directory)
    if key:
        compose_cache.store(key, cfg)
    return cfg


def _compose(overrides: list[str], directory: Path) -> DictConfig:
    """Hydra's composition of ``overrides`` over ``directory``, resolved and checked."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(directory), version_base=None):
            cfg = compose(config_name="config", overrides=list(overrides))
            OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as error:
        raise one_line_error(error) from error
    finally:
        GlobalHydra.instance().clear()
    for key in _keys_outside_the_schema(cfg):
        raise ConfigError(
            key,
            "no such key (a + adds keys only to mappings such as recipe.env or model.kwargs)",
            "check the spelling (tfplan plan --cfg job shows every key)",
        )
    return cfg


def _keys_outside_the_schema(cfg: DictConfig, path: str = "") -> Iterator[str]:
    """Keys a ``+`` override added to a node with a schema (``+cluster.typo=1``): Hydra lets
    them in and the typed config would drop them without a word."""
    schema = OmegaConf.get_type(cfg)
    names = {f.name for f in fields(schema)} if is_dataclass(schema) else None
    for key in cfg:
        name = str(key)
        if names is not None and name not in names:
            yield f"{path}{name}"
        node = cfg._get_node(name)
        if isinstance(node, DictConfig):
            yield from _keys_outside_the_schema(node, f"{path}{name}.")


def instantiate_overrides(overrides: list[str]) -> list[str]:
    """Hydra's instantiate convention on the command line, for the model and data groups.

    ``model._target_=my_pkg.build`` without a ``model=`` choice selects ``model=keras`` (and
    ``data._target_=`` selects ``data=factory``); ``model.units=64``, a key the group's schema
    does not have, becomes the keyword argument ``model.kwargs.units`` (added or replaced).
    Everything else passes unchanged.
    """

    known = {
        "model": {f.name for f in fields(ModelConfig)},
        "data": {f.name for f in fields(DataConfig)},
    }
    chosen = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    out: list[str] = []
    for override in overrides:
        key, sep, value = override.partition("=")
        bare = key.lstrip("+~")
        group, dot, rest = bare.partition(".")
        if not sep or group not in _TARGET_GROUPS or not dot:
            out.append(override)
            continue
        head = rest.split(".", 1)[0]
        if head == "_target_" and group not in chosen:
            out.append(f"{group}={_TARGET_GROUPS[group]}")
            chosen.add(group)
        if head in ("features", "kwargs") and rest == head and not key.startswith(("+", "~")):
            out.append(f"++{bare}={value}")  # a whole mapping: its keys are new to the schema
        elif head in known[group] or key.startswith("~"):
            out.append(override)
        else:
            out.append(f"++{group}.kwargs.{rest}={value}")
    return out


def to_config(cfg: DictConfig) -> Config:
    """The typed config; a value that is still ``???`` is a one-line error naming its key."""
    try:
        return cap_from_env(cast(Config, OmegaConf.to_object(cfg)))
    except OmegaConfBaseException as error:
        raise one_line_error(error) from error


def one_line_error(error: BaseException) -> ConfigError:
    """Hydra/OmegaConf messages span many lines; keep the key, the problem and the options."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(error, MissingConfigException):
        return _missing_option(error)
    if isinstance(error, OverrideParseException):
        override = str(getattr(error, "override", "") or "")
        key = override.split("=", 1)[0].lstrip("+~") or "overrides"
        problem = str(error).strip().splitlines()[0]
        return ConfigError(
            key,
            f"Hydra cannot read {override!r} ({problem})",
            f"quote a value holding spaces, '=' or braces: \"{key}='...'\"",
        )
    cause: BaseException = error
    while cause.__cause__ is not None and isinstance(cause.__cause__, OmegaConfBaseException):
        cause = cause.__cause__
    text = str(cause)
    key = getattr(cause, "full_key", None) or _key_from(str(error)) or "config"
    first = text.strip().splitlines()[0] if text.strip() else type(cause).__name__
    if "Could not override" in str(error):
        match = re.search(r"Could not override '([^']+)'", str(error))
        key = match.group(1) if match else key
        if _in_a_schema(key):
            return ConfigError(
                key, "no such key", "check the spelling (tfplan plan --cfg job shows every key)"
            )
        return ConfigError(
            key, "no such key", f"check the spelling, or add a new key with +{key}=VALUE"
        )
    if "Missing mandatory value" in first:
        return ConfigError(key, "is required but has no value", f"set it, e.g. {key}=VALUE")
    if "not in" in first and "Key" in first:
        return ConfigError(
            key, "no such key", "check the spelling (tfplan plan --cfg job shows every key)"
        )
    return ConfigError(
        key, first.rstrip("."), "fix the value (tfplan plan --cfg job shows every key)"
    )


def _in_a_schema(key: str) -> bool:
    """Whether ``key``'s parent is a node with a schema (``cluster``), where ``+`` cannot add
    keys, rather than a mapping (``recipe.env``)."""
    schema: Any = Config
    for part in key.split(".")[:-1]:
        if not is_dataclass(schema):
            return False
        schema = (
            AlgoConfig if schema is Config and part == "algo" else get_type_hints(schema).get(part)
        )
    return is_dataclass(schema)


def _key_from(message: str) -> str | None:
    match = re.search(r"override ([\w.\[\]]+)=", message)
    return match.group(1) if match else None


def _missing_option(error: MissingConfigException) -> ConfigError:
    message = str(error)
    group_match = re.search(r"Could not find '([\w/]+)/([\w.-]+)'", message)
    options_match = re.search(r"Available options in '[\w/]+':\s*\n((?:\t.*\n?)+)", message)
    if group_match:
        group, option = group_match.groups()
        options = []
        if options_match:
            options = [o.strip() for o in options_match.group(1).splitlines() if o.strip()]
        options = [o for o in options if not o.startswith("schema_")]
        return ConfigError(
            group, f"no option {option!r}", f"available options: {', '.join(options)}"
        )
    return ConfigError("config", message.strip().splitlines()[0], "check the config name")


def resolved_yaml(cfg: Any) -> str:
    return OmegaConf.to_yaml(cfg)


def config_from_dict(data: dict[str, Any]) -> Config:
    """A typed Config from the plain data a plan carries (``Plan.source_config["config"]``).

    Raises:
        ConfigError: the data no longer fits the schemas (e.g. written by another version).
    """
    known = ALGORITHMS.get(str(data.get("algo", {}).get("name")))
    algo_schema = known.schema if known is not None else AlgoConfig
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(Config), {"algo": OmegaConf.structured(algo_schema)}, data
        )
        return cast(Config, OmegaConf.to_object(merged))
    except OmegaConfBaseException as error:
        raise one_line_error(error) from error
