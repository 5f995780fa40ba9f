"""Read the run config (``run.yaml``) and ``TF_CONFIG`` into small typed values.

The recipes never import tfplan: this module re-reads the plain YAML that the launcher wrote
(see docs/contract.md), so any launcher that writes the same file and sets ``TF_CONFIG`` works.
Unknown keys are kept (``AlgoConf.extra``) so that a new algorithm can read its own options
without a change here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from recipes.errors import ConfigError

__all__ = [
    "AlgoConf",
    "ConfigError",
    "DataConf",
    "FeatureConf",
    "ModelConf",
    "RunConfig",
    "SnapshotConf",
    "TaskInfo",
    "TrainerConf",
    "data_conf",
    "load_run_config",
    "task_from_env",
]


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
    target: Optional[str] = None  # run.yaml's model._target_: the user's Keras model factory
    kwargs: dict[str, Any] = field(default_factory=dict)
    loss: str = "sparse_categorical_crossentropy"
    from_logits: bool = True
    metrics: tuple[str, ...] = ("accuracy",)
    # a trainable variable over this many bytes is split over the parameter servers (None: never)
    partition_bytes: Optional[int] = None
    # Embedding layers whose ids are raw (recipes/dynamic_table.py), and their settings
    dynamic: tuple[str, ...] = ()
    capacity: Optional[int] = None  # rows of each dynamic table; None: the layer's input_dim
    min_count: int = 1  # an id gets its own row once seen this many times
    ttl_steps: int = 10_000  # a row unseen for this many global steps is freed


@dataclass(frozen=True)
class FeatureConf:
    """One entry of ``data.features`` (the label is one of them, named by ``data.label``).

    ``None`` means "not given": float32 and a scalar for tfrecord/csv, what the file holds for npz.
    """

    dtype: Optional[str] = None  # float32 | int64 | string (csv also float64, int32)
    shape: Optional[tuple[int, ...]] = None  # without the batch dimension; () = scalar
    default: Any = None  # csv: the value of an empty field; tfrecord: of a missing feature


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
    # Your files (data.name = tfrecord | csv | npz); recipes/inputs.py reads them.
    train: tuple[str, ...] = ()  # paths or glob patterns; relative to $TFPLAN_DATA_ROOT or cwd
    eval: tuple[str, ...] = ()  # empty: the first eval_examples records of the train files
    eval_examples: int = 10000
    features: dict[str, FeatureConf] = field(default_factory=dict)
    label: str = "label"
    header: bool = True  # csv: the first line names the columns
    columns: tuple[str, ...] = ()  # csv without a header: the column names
    field_delim: str = ","
    compression: Optional[str] = None  # tfrecord/csv: None | GZIP | ZLIB
    shuffle_buffer: int = 10000  # examples; 0 = no shuffle
    shard: str = "auto"  # auto (by file when files >= workers, else by record) | file | record
    prefetch: int = -1  # batches; -1 = AUTOTUNE, 0 = none
    target: Optional[str] = None  # run.yaml's data._target_: the user's tf.data factory
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainerConf:
    max_steps: int = 1000
    checkpoint_steps: Optional[int] = 200
    checkpoint_secs: Optional[float] = None
    keep_checkpoints: int = 5  # the newest checkpoints kept in output_dir
    summary_steps: int = 50
    log_steps: int = 100
    eval_secs: float = 2.0
    seed: int = 0
    peer_wait_secs: float = 300.0
    export_model: bool = True  # output_dir/model.keras at the end, for a user's Keras model
    # a model larger than this is exported as parts (recipes/export_parts.py); None: half the
    # exporting host's available memory
    export_join_bytes: Optional[int] = None
    # an Embedding table larger than this is scored from the checkpoint's rows, not loaded
    # (recipes/checkpoint_rows.py); None: every table loaded whole
    score_rows_bytes: Optional[int] = 64 * 1024 * 1024
    trace_step: int = 0  # TF1: a worker logs its N-th step's traffic (recipes/traffic.py)


@dataclass(frozen=True)
class SnapshotConf:
    """run.yaml's ``snapshots`` (tfplan's lifecycle.snapshot_secs and snapshot_dir)."""

    secs: float = 1.0  # 0: none
    folder: str = "/dev/shm"  # on each ps's host
    copies: bool = True  # each ps's also on the next ps's host (with 2 or more ps)
    deltas: bool = True  # a ps's tables: only the rows changed since its last snapshot


@dataclass(frozen=True)
class RunConfig:
    output_dir: str
    algo: AlgoConf
    model: ModelConf
    data: DataConf
    trainer: TrainerConf
    experiment_id: str = "default"
    snapshots: SnapshotConf = field(default_factory=SnapshotConf)


@dataclass(frozen=True)
class TaskInfo:
    """This process's place in the cluster, from TF_CONFIG."""

    cluster: dict[str, list[str]]
    type: str
    index: int
    run_yaml: Optional[str] = None  # where this task's live.json is looked for (recipes.live)

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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    # a null is a value where the field may be None and is not by default (trainer.
    # score_rows_bytes=null: every table loaded); elsewhere it leaves the field at its default
    nullable = {
        name
        for name, f in fields.items()
        if "Optional[" in str(f.type)
        and f.default is not None
        and f.default is not dataclasses.MISSING
    }
    return {
        k: v
        for k, v in raw.items()
        if k in fields and (v is not None or k == "path" or k in nullable)
    }


def _paths(raw: Any, key: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, (str, os.PathLike)):
        return (os.fspath(raw),)
    if isinstance(raw, (list, tuple)) and all(isinstance(p, (str, os.PathLike)) for p in raw):
        return tuple(os.fspath(p) for p in raw)
    raise ConfigError(f"run config: data.{key} must be a path, a glob or a list of them")


def _feature(name: str, raw: Any) -> FeatureConf:
    if isinstance(raw, FeatureConf):
        return raw
    if raw is None:
        return FeatureConf()
    if isinstance(raw, str):  # shorthand: ``x: int64``
        return FeatureConf(dtype=raw)
    if not isinstance(raw, dict):
        raise ConfigError(
            f"run config: data.features.{name} must be a mapping {{dtype, shape, default}}"
        )
    shape = raw.get("shape")
    if shape is not None:
        if isinstance(shape, int):
            shape = [shape]
        try:
            shape = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise ConfigError(
                f"run config: data.features.{name}.shape must be a list of ints, got {shape!r}"
            ) from None
    dtype = raw.get("dtype")
    return FeatureConf(
        dtype=None if dtype is None else str(dtype), shape=shape, default=raw.get("default")
    )


def data_conf(raw: Any) -> DataConf:
    """The ``data`` section of run.yaml as a DataConf.

    Raises:
        ConfigError: a malformed value (paths, features).
    """
    raw = dict(raw or {}) if isinstance(raw, dict) or raw is None else raw
    if isinstance(raw, dict) and raw.get("_target_"):
        raw["target"] = raw["_target_"]
    data = _pick(DataConf, raw, "data")
    for key in ("train", "eval"):
        if key in data:
            data[key] = _paths(data[key], key)
    if "columns" in data:
        data["columns"] = tuple(str(c) for c in data["columns"])
    features = data.get("features") or {}
    if isinstance(features, (list, tuple)):  # names only: ``features: [x, y]``
        features = {str(n): None for n in features}
    if not isinstance(features, dict):
        raise ConfigError("run config: data.features must be a mapping name -> {dtype, shape}")
    data["features"] = {str(n): _feature(str(n), f) for n, f in features.items()}
    data["kwargs"] = dict(data.get("kwargs") or {})
    return DataConf(**data)


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
    model_raw = dict(raw.get("model") or {})
    if model_raw.get("_target_"):
        model_raw["target"] = model_raw["_target_"]
    model = _pick(ModelConf, model_raw, "model")
    if "dynamic" in model:
        model["dynamic"] = tuple(str(name) for name in model["dynamic"] or ())
    for key in ("hidden", "conv_channels"):
        if key in model:
            model[key] = tuple(int(v) for v in model[key])
    if "metrics" in model:
        model["metrics"] = tuple(str(m) for m in model["metrics"])
    model["kwargs"] = dict(model.get("kwargs") or {})
    return RunConfig(
        output_dir=os.path.abspath(os.path.expanduser(str(raw["output_dir"]))),
        algo=AlgoConf(**base, extra=algo_raw),
        model=ModelConf(**model),
        data=data_conf(raw.get("data")),
        trainer=TrainerConf(**_pick(TrainerConf, raw.get("trainer"), "trainer")),
        experiment_id=str((raw.get("experiment") or {}).get("id", "default")),
        snapshots=SnapshotConf(**_pick(SnapshotConf, raw.get("snapshots"), "snapshots")),
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
