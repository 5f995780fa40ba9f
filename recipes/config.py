"""Read the run config (``run.yaml``) and ``TF_CONFIG`` into small typed values.

The recipes never import tfplan: this module re-reads the plain YAML that the launcher wrote
(see docs/contract.md), so any launcher that writes the same file and sets ``TF_CONFIG`` works.
Unknown keys are kept (``AlgoConf.extra``) so that a new algorithm can read its own options
without a change here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

__all__ = [
    "AlgoConf",
    "ConfigError",
    "DataConf",
    "ModelConf",
    "RunConfig",
    "TaskInfo",
    "TrainerConf",
    "load_run_config",
    "task_from_env",
]


class ConfigError(Exception):
    """The run config or TF_CONFIG is missing or malformed; the message says what to fix."""


@dataclass(frozen=True)
class AlgoConf:
    name: str = "hogwild"
    lr: float = 0.05
    optimizer: str = "sgd"
    sync: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # algorithm-specific keys (window, ...)

    def get(self, key: str, default: Any = None) -> Any:
        """An algorithm-specific option, or ``default`` when absent or null."""
        value = self.extra.get(key)
        return default if value is None else value


@dataclass(frozen=True)
class ModelConf:
    name: str = "mlp"
    hidden: tuple[int, ...] = (128,)
    conv_channels: tuple[int, ...] = ()
    dense: int = 64


@dataclass(frozen=True)
class DataConf:
    name: str = "digits"
    path: Optional[str] = None
    image_size: int = 8
    channels: int = 1
    num_classes: int = 10
    batch_size: int = 64
    eval_fraction: float = 0.2
    synthetic_examples: int = 10000
    seed: int = 0


@dataclass(frozen=True)
class TrainerConf:
    max_steps: int = 1000
    checkpoint_steps: Optional[int] = 200
    checkpoint_secs: Optional[float] = None
    summary_steps: int = 50
    log_steps: int = 100
    eval_secs: float = 2.0
    seed: int = 0


@dataclass(frozen=True)
class RunConfig:
    output_dir: str
    algo: AlgoConf
    model: ModelConf
    data: DataConf
    trainer: TrainerConf
    experiment_id: str = "default"


@dataclass(frozen=True)
class TaskInfo:
    """This process's place in the cluster, from TF_CONFIG."""

    cluster: dict[str, list[str]]
    type: str
    index: int

    @property
    def has_chief_job(self) -> bool:
        return bool(self.cluster.get("chief"))

    @property
    def n_ps(self) -> int:
        return len(self.cluster.get("ps", []))

    @property
    def n_replicas(self) -> int:
        """Training replicas: every worker plus the separate chief, when there is one."""
        return len(self.cluster.get("worker", [])) + len(self.cluster.get("chief", []))

    @property
    def is_chief(self) -> bool:
        if self.has_chief_job:
            return self.type == "chief"
        return self.type == "worker" and self.index == 0

    @property
    def replica_index(self) -> int:
        """0..n_replicas-1; the chief is always replica 0."""
        if self.type == "chief":
            return 0
        return self.index + (1 if self.has_chief_job else 0)

    @property
    def device(self) -> str:
        return f"/job:{self.type}/task:{self.index}"


def _pick(cls: type, raw: Any, section: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"run config: '{section}' must be a mapping, got {type(raw).__name__}")
    known = set(cls.__dataclass_fields__)
    return {k: v for k, v in raw.items() if k in known and (v is not None or k == "path")}


def load_run_config(path: str) -> RunConfig:
    """Parse run.yaml.

    Raises:
        ConfigError: the file is missing, is not YAML, or lacks ``output_dir``.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"run config not found: {path} (pass --config <task workdir>/run.yaml)")
    with open(path, encoding="utf-8") as f:
        try:
            raw = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"run config {path} is not valid YAML: {e}") from None
    if not raw.get("output_dir"):
        raise ConfigError(f"run config {path} has no output_dir")
    algo_raw = dict(raw.get("algo") or {})
    base = {k: algo_raw.pop(k) for k in ("name", "lr", "optimizer", "sync") if k in algo_raw}
    model = _pick(ModelConf, raw.get("model"), "model")
    for key in ("hidden", "conv_channels"):
        if key in model:
            model[key] = tuple(int(v) for v in model[key])
    return RunConfig(
        output_dir=os.path.abspath(os.path.expanduser(str(raw["output_dir"]))),
        algo=AlgoConf(**base, extra=algo_raw),
        model=ModelConf(**model),
        data=DataConf(**_pick(DataConf, raw.get("data"), "data")),
        trainer=TrainerConf(**_pick(TrainerConf, raw.get("trainer"), "trainer")),
        experiment_id=str((raw.get("experiment") or {}).get("id", "default")),
    )


def task_from_env(environ: Optional[dict[str, str]] = None) -> TaskInfo:
    """Parse TF_CONFIG.

    Raises:
        ConfigError: TF_CONFIG is unset or lacks ``task.type``.
    """
    env = os.environ if environ is None else environ
    text = env.get("TF_CONFIG")
    if not text:
        raise ConfigError("TF_CONFIG is not set (it names the cluster and this task's role)")
    try:
        tf_config = json.loads(text)
        task = tf_config["task"]
        return TaskInfo(
            cluster={k: list(v) for k, v in (tf_config.get("cluster") or {}).items()},
            type=str(task["type"]),
            index=int(task.get("index", 0)),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"TF_CONFIG is malformed ({e}); expected "
            '{"cluster": {...}, "task": {"type": ..., "index": ...}}'
        ) from None
