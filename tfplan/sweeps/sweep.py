"""Sweeps where every point is a whole cluster, driven by Hydra's own multirun machinery.

    run_sweep(spec)                           tfplan apply -m ... / tfplan plan -m ... (dry run)
      └─ Hydra.multirun(config, task, ...)    composes, instantiates hydra/sweeper
           └─ sweeper: basic | optuna | ...   a=1,2 b=x,y, range(), choice(), glob(); or samples
                └─ ClusterLauncher            hydra/launcher=tfplan: id, folder, ports, concurrency
                     └─ PointTask(cfg)        plan + apply + supervise one cluster (ExperimentRun)
                                              returns its held-out accuracy, which an optimising
                                              sweeper maximises (0.0 for a failed point)

A failed point (bad value, preflight, training failure) is recorded with its reason and the
others go on. Everything lands in the sweep folder (``cluster.output_dir`` of the sweep id,
by default ``outputs/<sweep id>``)::

    <sweep dir>/
      multirun.yaml           Hydra's record of the sweep
      sweep.json              every point: overrides, experiment id, status, reason, times
      results.csv, results.json, accuracy.png   (tfplan.sweeps.results; `tfplan report DIR` redoes them)
      <n>/                    point n's experiment folder (tfplan.engine.experiment)
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tfplan.engine.lognoise import HIDDEN_HINT, NoiseFilter, shows_tf_noise
from tfplan.engine.workspace import Workspace
from tfplan.errors import ConfigError, TfplanError
from tfplan.files import read_json_object, write_atomic
from tfplan.sweeps import optuna_tap
from tfplan.sweeps.pruning import Curves, PruneRule, eval_score, median_verdict
from tfplan.sweeps.warm import SweepSeeds

__all__ = ["PointRecord", "SweepSpec", "SweepRecord", "run_sweep", "sweep_spec", "SweepOutput"]

Say = Callable[[str], None]

# What a failed point returns to the sweeper: the worst accuracy. Not NaN and not an exception:
# Optuna's sweeper stops the whole sweep on either (a failed trial beyond max_failure_rate=0),
# and one failed point must not stop the others; a point with no accuracy should also steer an
# optimiser away. The table and files show it as failed, with its reason, all the same.
FAILED_METRIC = 0.0


@dataclass(frozen=True)
class SweepSpec:
    """A sweep as the user asked for it, before Hydra expands it."""

    sweep_id: str
    sweep_dir: str  # absolute
    overrides: tuple[str, ...]  # what Hydra gets (experiment.id taken out: it names the sweep)
    fixed_keys: tuple[str, ...]  # keys that are not swept: left out of each point's label
    concurrency: int
    config_dir: Path
    sweeper: str  # "basic" unless hydra/sweeper=... was given
    prune: PruneRule = field(default_factory=PruneRule)
    pruner: dict[str, Any] = field(default_factory=dict)  # an Optuna pruner (optuna sweeper)

    @property
    def optuna(self) -> bool:
        return self.sweeper.startswith("optuna")


@dataclass(frozen=True)
class PointRecord:
    """One point of a sweep: what it was, and how it went."""

    num: int
    experiment_id: str
    overrides: tuple[str, ...]  # the swept values of this point
    output_dir: str
    status: str  # planned | running | succeeded | failed | pruned | interrupted
    reason: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    last_step: int | None = None
    port_offset: int | None = None
    ports: tuple[int, int] | None = None  # first and last port its tasks use
    tasks: int | None = None
    resumed_from: int | None = None

    @property
    def label(self) -> str:
        return " ".join(self.overrides) or "(defaults)"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["overrides"] = list(self.overrides)
        data["ports"] = list(self.ports) if self.ports else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PointRecord:
        ports = data.get("ports")
        fields: dict[str, Any] = {k: data.get(k) for k in cls.__dataclass_fields__}
        fields.update(
            overrides=tuple(data.get("overrides") or ()),
            ports=(int(ports[0]), int(ports[1])) if ports else None,
        )
        return cls(**fields)


@dataclass
class SweepRecord:
    """``sweep.json``: rewritten (atomically) each time a point starts or ends."""

    path: Path
    header: dict[str, Any]
    points: dict[int, PointRecord] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def put(self, point: PointRecord) -> None:
        with self._lock:
            self.points[point.num] = point
            data = {**self.header, "points": [p.to_dict() for _, p in sorted(self.points.items())]}
            write_atomic(self.path, json.dumps(data, indent=2) + "\n")

    @staticmethod
    def load(sweep_dir: Path) -> tuple[dict[str, Any], list[PointRecord]]:
        """(header, points) of a sweep folder.

        Raises:
            TfplanError: no readable sweep.json there.
        """
        path = Path(sweep_dir) / "sweep.json"
        try:
            data = json.loads(path.read_text())
            points = [PointRecord.from_dict(p) for p in data.pop("points")]
        except FileNotFoundError:
            raise TfplanError(
                f"{sweep_dir} is not a sweep folder (no sweep.json): give the folder "
                "`tfplan apply -m` printed"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise TfplanError(f"cannot read {path}: {error}") from None
        return data, points


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def sweep_spec(
    overrides: list[str], config_dir: str | Path | None, concurrency: int, now: float | None = None
) -> SweepSpec:
    """Read the sweep's id and folder from the overrides, and check the fixed ones compose.

    The sweep id is ``experiment.id`` when given (applying it again resumes every point from its
    checkpoints), else ``sweep-<date>-<time>`` (a fresh sweep).

    Raises:
        ConfigError: experiment.id is swept, hydra/launcher is set, or a fixed override is wrong.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from tfplan.config.compose import compose_config, conf_dir, instantiate_overrides

    # model.units=16,64 means model.kwargs.units as in plan and apply (and model._target_
    # selects model=keras): the same rewrite, before Hydra sees the sweep
    overrides = instantiate_overrides(list(overrides))
    if concurrency < 1:
        raise ConfigError("--concurrency", f"{concurrency} < 1", "run at least one cluster at once")
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as error:
        raise ConfigError(
            "overrides",
            str(error).strip().splitlines()[0],
            "see Hydra's override grammar: a=1,2 b=range(1,4)",
        ) from None
    sweep_id, rest, fixed, sweeper = None, [], [], "basic"
    for text, override in zip(overrides, parsed, strict=True):
        key = override.get_key_element()
        if key == "experiment.id":
            if override.is_sweep_override():
                raise ConfigError(
                    "experiment.id",
                    "cannot be swept: it names the sweep",
                    "name it with experiment.id=NAME (points: NAME-0, NAME-1, ...)",
                )
            sweep_id = override.get_value_element_as_str()
            continue
        if key in ("hydra/launcher", "hydra.launcher") or key.startswith("hydra.launcher."):
            raise ConfigError(
                key,
                "tfplan runs the points with its own launcher",
                "use --concurrency N to run N clusters at once",
            )
        if key == "hydra/sweeper":
            sweeper = override.get_value_element_as_str()
        rest.append(text)
        if not override.is_sweep_override() and not key.startswith("hydra"):
            fixed.append(text)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    sweep_id = sweep_id or f"sweep-{stamp}"
    directory = conf_dir(config_dir)
    base = compose_config([*fixed, f"experiment.id={sweep_id}"], directory)
    sweep_dir = os.path.abspath(str(base.cluster.output_dir))
    rule = PruneRule.of(base.sweep)
    pruner = {str(k): v for k, v in dict(base.sweep.pruner or {}).items()}
    if pruner and not sweeper.startswith("optuna"):
        raise ConfigError(
            "sweep.pruner",
            "an Optuna pruner needs Optuna's study",
            "add hydra/sweeper=optuna, or use sweep.prune=median with any sweeper",
        )
    scored = bool(base.cluster.evaluator) or str(base.recipe.kind) == "command"
    if (rule.kind != "none" or pruner) and not scored:
        raise ConfigError(
            "sweep.prune",
            "pruning compares the evaluator's held-out accuracy during training, and the "
            "cluster has no evaluator",
            "add cluster.evaluator=true",
        )
    return SweepSpec(
        sweep_id,
        sweep_dir,
        tuple(rest),
        tuple(_key(f) for f in fixed),
        concurrency,
        directory,
        sweeper,
        rule,
        pruner,
    )


class SweepOutput:
    """What a sweep prints: ``#n | line`` for tfplan's events; every task's log when verbose,
    less TensorFlow's start-up noise unless ``show_all`` (or the point's
    ``recipe.show_tf_noise``), as ``tfplan apply`` shows it."""

    def __init__(
        self, print_line: Callable[[str], None], verbose: bool = False, show_all: bool = False
    ) -> None:
        self._print = print_line
        self._lock = threading.Lock()
        self.verbose = verbose
        self.show_all = show_all
        self._hinted = False

    def say(self, num: int | None) -> Say:
        """tfplan's lines about point ``num`` (``#n tfplan | ...``), or the sweep's (None)."""
        prefix = "sweep" if num is None else f"#{num}"
        return lambda line: self.line(f"{prefix} tfplan | {line}")

    def emit(self, num: int, show_all: bool = False) -> Callable[[str, str], None]:
        noise = NoiseFilter(self.show_all or show_all)

        def emit(task: str, line: str) -> None:
            if task == "tfplan":
                self.line(f"#{num} tfplan | {line}")
            elif not self.verbose:
                return
            elif noise.keeps(task, line):
                self.line(f"#{num} {task} | {line}")
            elif noise.hint_due and self._first_hint():
                self.line(f"#{num} tfplan | {HIDDEN_HINT}")

        return emit

    def _first_hint(self) -> bool:
        """Whether the hint that noise is hidden is due: once per sweep, not per point."""
        with self._lock:
            due, self._hinted = not self._hinted, True
            return due

    def line(self, text: str) -> None:
        with self._lock:
            self._print(text)


def _scores(output_dir: Path) -> list[tuple[int, float]]:
    """A point's held-out scores from its evaluator's ``eval/metrics.jsonl`` (steps rising)."""
    scores: list[tuple[int, float]] = []
    try:
        lines = (output_dir / "eval" / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return scores
    for line in lines:
        try:
            entry = json.loads(line)
            step, value = int(entry["global_step"]), float(entry["accuracy"])
        except (ValueError, KeyError, TypeError):
            continue
        if value == value and (not scores or step > scores[-1][0]):
            scores.append((step, value))
    return scores


def _job_config(cfg: Any) -> Any:
    """The point's config without Hydra's node, resolved (what compose_config returns). With
    ``sweep.warm=false`` every task of the point starts cold (no seed of its own either)."""
    from omegaconf import OmegaConf, open_dict, read_write

    task_cfg = copy.deepcopy(cfg)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
        if not task_cfg.sweep.warm:
            task_cfg.cluster.warm = False
    OmegaConf.resolve(task_cfg)
    return task_cfg


class PointTask:
    """The task function Hydra's launcher calls with each point's config (see module docstring)."""

    def __init__(
        self,
        spec: SweepSpec,
        workspace: Workspace,
        output: SweepOutput,
        record: SweepRecord | None,
        seeds: SweepSeeds | None = None,
        earlier: dict[int, PointRecord] | None = None,
    ) -> None:
        self.spec = spec
        self.earlier = earlier or {}  # the points of an earlier run of this sweep (resume)
        self.seeds = seeds  # None: every task starts from nothing (sweep.warm=false, dry run)
        self.workspace = workspace
        self.output = output
        self.record = record  # None: a dry run, which records nothing
        self.planned: list[PointRecord] = []
        self.curves = Curves()  # every point's held-out accuracy while it trains
        self._lock = threading.Lock()
        self._interrupted = threading.Event()
        self._stops: dict[int, threading.Event] = {}  # running point -> its stop
        self._pruned: dict[int, tuple[int, str]] = {}  # point -> (step, why)

    def interrupt(self) -> None:
        """Ctrl-C reached the main thread: every point stops its tasks at its next tick (its
        supervisor raises KeyboardInterrupt there, exactly as an interrupted apply)."""
        self._interrupted.set()
        with self._lock:
            for stop in self._stops.values():
                stop.set()

    def _scored(self, num: int, line: str, stop: threading.Event, say: Say) -> None:
        """A line of point ``num``'s tasks: when it is a held-out score, record it (and report
        it to the Optuna trial), then stop the point if the pruner says so."""
        score = eval_score(line)
        if score is None or stop.is_set() or not self.curves.add(num, *score):
            return
        step, value = score
        tap = optuna_tap.current()
        trial = tap.trial(num) if tap is not None else None
        if tap is not None and trial is not None:
            trial.report(value, step)
            why = (
                f"pruned at step {step} by Optuna's {type(tap.pruner).__name__}: "
                f"accuracy {value:.4f}"
                if trial.should_prune()
                else None
            )
            if why is not None:
                tap.prune(num)
        else:
            why = median_verdict(self.spec.prune, step, value, self.curves.finished(but=num))
        if why is None:
            return
        with self._lock:
            self._pruned[num] = (step, why)
        say(why)
        stop.set()

    def __call__(self, cfg: Any) -> float:
        if self._interrupted.is_set():
            raise KeyboardInterrupt()
        num = int(cfg.hydra.job.num)
        label = tuple(o for o in cfg.hydra.overrides.task if _key(o) not in self.spec.fixed_keys)
        point = PointRecord(
            num,
            str(cfg.experiment.id),
            label,
            str(cfg.cluster.output_dir),
            "planned",
            port_offset=int(cfg.cluster.port_offset),
        )
        if self.record is None:
            return self._plan_only(point, cfg)
        kept = self._kept(point)
        if kept is not None:
            return kept
        return self._run(point, cfg)

    def _kept(self, point: PointRecord) -> float | None:
        """Resume: a point that succeeded or was pruned in an earlier run of this sweep is not
        run again (its record, scores and result stay; its metric goes to the sweeper as it
        did); one that ran other overrides under this number fails without starting. None: run
        the point (a failed or interrupted one resumes from its checkpoints)."""
        assert self.record is not None
        before = self.earlier.get(point.num)
        if before is None or before.status not in ("succeeded", "pruned"):
            return None
        say = self.output.say(point.num)
        if before.overrides != point.overrides:
            why = (
                f"this sweep's point {point.num} ran {before.label} before, and is {point.label} "
                "now: its folder holds the other point's checkpoints; use a new experiment.id "
                "for another sweep"
            )
            self._end(replace(point, status="failed", reason=why), say)
            return FAILED_METRIC
        curve = _scores(Path(before.output_dir))
        for step, value in curve:
            self.curves.add(point.num, step, value)
        self.record.put(before)
        say(f"{before.status} in an earlier run of this sweep ({before.reason}): kept")
        if before.status == "succeeded":
            self.curves.finish(point.num)
            result = read_json_object(Path(before.output_dir) / "result.json") or {}
            accuracy = result.get("accuracy")
            return float(accuracy) if isinstance(accuracy, (int, float)) else FAILED_METRIC
        tap = optuna_tap.current()
        if tap is not None:
            tap.prune(point.num)
        return curve[-1][1] if curve else FAILED_METRIC

    def _plan(self, point: PointRecord, cfg: Any) -> tuple[Any, str, PointRecord]:
        from omegaconf import OmegaConf

        from tfplan.config.compose import one_line_error, to_config
        from tfplan.engine.plans import make_plan
        from tfplan.engine.refresh import refreshed_state

        try:
            job_cfg = _job_config(cfg)
        except Exception as error:  # noqa: BLE001 - OmegaConf's errors, made one line
            raise one_line_error(error) from error
        state = refreshed_state(self.workspace.store(point.experiment_id))
        plan = make_plan(to_config(job_cfg), state)
        ports = [t.port for t in plan.tasks if t.port is not None]
        point = replace(
            point, tasks=len(plan.tasks), ports=(min(ports), max(ports)) if ports else None
        )
        return plan, OmegaConf.to_yaml(job_cfg), point

    def _plan_only(self, point: PointRecord, cfg: Any) -> float:
        try:
            _, _, point = self._plan(point, cfg)
        except TfplanError as error:
            point = replace(point, status="failed", reason=str(error))
        with self._lock:
            self.planned.append(point)
        return FAILED_METRIC

    def _run(self, point: PointRecord, cfg: Any) -> float:
        from tfplan.engine.runner import ExperimentRun

        assert self.record is not None
        say = self.output.say(point.num)
        point = replace(point, status="running", started_at=round(time.time(), 3))
        self.record.put(point)
        say(f"{point.label} -> experiment {point.experiment_id}, {point.output_dir}")
        result: dict[str, Any] | None = None
        stop = threading.Event()
        with self._lock:
            self._stops[point.num] = stop
            if self._interrupted.is_set():  # Ctrl-C came between __call__'s look and here
                stop.set()
        try:
            plan, config_yaml, point = self._plan(point, cfg)
            self.record.put(point)
            warm = self.seeds is not None and bool(cfg.sweep.warm)
            seeds = self.seeds.for_plan(plan) if warm and self.seeds is not None else ()
            with ExperimentRun(plan, self.workspace, say, config_yaml, seeds) as run:
                point = replace(point, resumed_from=run.resumed_from)
                applied = run.apply()
                if applied.state.running:
                    shown = self.output.emit(point.num, shows_tf_noise(plan.source_config))
                    num = point.num

                    def emit(task: str, line: str) -> None:
                        shown(task, line)
                        if task != "tfplan":
                            self._scored(num, line, stop, say)
                            if num in self._pruned and run.stopped_because is None:
                                run.stopped_because = ("pruned", self._pruned[num][1])

                    outcome = run.supervise(emit, interrupt=stop)
                    point = replace(
                        point,
                        last_step=outcome.last_step,
                        reason=outcome.reason,
                        status="succeeded" if outcome.succeeded else "failed",
                    )
                else:
                    point = replace(point, status="succeeded", reason="nothing left to run")
                result = run.result
        except KeyboardInterrupt:
            pruned = self._pruned.get(point.num)
            if pruned is None or self._interrupted.is_set():
                self._end(replace(point, status="interrupted", reason="interrupted (Ctrl-C)"), say)
                raise
            step, why = pruned
            point = replace(point, status="pruned", reason=why, last_step=step)
        except TfplanError as error:
            point = replace(point, status="failed", reason=str(error))
        except Exception as error:  # noqa: BLE001 - one broken point must not end the sweep
            point = replace(point, status="failed", reason=f"{type(error).__name__}: {error}")
        finally:
            with self._lock:
                self._stops.pop(point.num, None)
        self._end(point, say)
        if point.status == "succeeded":
            self.curves.finish(point.num)
        if point.status == "pruned":  # its last score (Optuna records the trial as PRUNED)
            last = self.curves.last(point.num)
            return last[1] if last is not None else FAILED_METRIC
        accuracy = (result or {}).get("accuracy") if point.status == "succeeded" else None
        return float(accuracy) if isinstance(accuracy, (int, float)) else FAILED_METRIC

    def _end(self, point: PointRecord, say: Say) -> None:
        assert self.record is not None
        point = replace(point, ended_at=round(time.time(), 3))
        self.record.put(point)
        say(f"{point.status}: {point.reason}")


def _run_hydra(
    spec: SweepSpec, task: PointTask, hydra_sweep_dir: str, preview: bool = False
) -> None:
    """Hydra's multirun, as ``@hydra.main`` with ``--multirun`` would do it, with tfplan's
    launcher (``preview``: the points' compositions are kept for the run that follows).
    Errors (a bad override, an unknown sweeper) become one-line ConfigErrors."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from tfplan.config.compose import one_line_error, register_configs
    from tfplan.sweeps.launcher import register_launcher

    register_configs()
    register_launcher()
    overrides = [
        *spec.overrides,
        "hydra/launcher=tfplan",
        f"hydra.launcher.concurrency={spec.concurrency}",
        f"hydra.launcher.sweep_id={spec.sweep_id}",
        f"hydra.launcher.sweep_dir='{spec.sweep_dir}'",
        f"hydra.sweep.dir='{hydra_sweep_dir}'",
        f"hydra.launcher.preview={preview}",
    ]
    GlobalHydra.instance().clear()
    tap = ExitStack()
    tap.enter_context(_batches_composed_once())
    try:
        if spec.optuna:
            pruner = optuna_tap.make_pruner(
                spec.prune.kind, spec.prune.startup_points, spec.prune.warmup_steps, spec.pruner
            )
            trials = tap.enter_context(optuna_tap.tapped(pruner))
            tap.callback(_write_trials, trials, Path(spec.sweep_dir) / "optuna.json")
        with initialize_config_dir(config_dir=str(spec.config_dir), version_base=None):
            hydra = GlobalHydra.instance().hydra
            assert hydra is not None
            hydra.multirun(
                config_name="config",
                task_function=task,
                overrides=overrides,
                with_log_configuration=False,
            )
    except (HydraException, OmegaConfBaseException) as error:
        raise one_line_error(error) from error
    except ImportError as error:  # a sweeper plugin that is not installed
        first = str(error).strip().splitlines()[0]
        raise ConfigError(
            "hydra/sweeper", first, "install its plugin, e.g. pip install hydra-optuna-sweeper"
        ) from None
    finally:
        tap.close()
        GlobalHydra.instance().clear()


@contextmanager
def _batches_composed_once() -> Iterator[None]:
    """Hydra's basic sweeper composes every point of a batch to validate it, then hands the
    batch to the launcher, which composes each again: tfplan's launcher composes (and so
    validates) every point of the batch before it runs any, in this process, so the sweeper's
    own pass is skipped (half of a sweep's composing, about 0.3 s of CPU per point)."""
    from hydra.plugins.sweeper import Sweeper

    validate = Sweeper.__dict__["validate_batch_is_legal"]
    Sweeper.validate_batch_is_legal = lambda self, batch: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Sweeper.validate_batch_is_legal = validate  # type: ignore[method-assign]


def _write_trials(tap: optuna_tap.OptunaTap, path: Path) -> None:
    trials = tap.trials()
    if trials and path.parent.is_dir():
        write_atomic(path, json.dumps({"trials": trials}, indent=2) + "\n")


def preview_sweep(
    spec: SweepSpec, workspace: Workspace, for_run: bool = False
) -> list[PointRecord]:
    """Every point the sweeper would run, planned but not applied (nothing is written);
    ``for_run``: :func:`run_sweep` follows in this process and takes the points' compositions."""
    task = PointTask(spec, workspace, SweepOutput(lambda line: None), record=None)
    with tempfile.TemporaryDirectory(prefix="tfplan-sweep-plan-") as scratch:
        _run_hydra(spec, task, scratch, preview=for_run)
    return sorted(task.planned, key=lambda p: p.num)


def run_sweep(spec: SweepSpec, workspace: Workspace, output: SweepOutput) -> list[PointRecord]:
    """Run every point of the sweep; returns their records (also in ``<sweep dir>/sweep.json``).

    Raises:
        ConfigError: the sweep itself cannot start (bad override, unknown sweeper or option).
        KeyboardInterrupt: after every running point has stopped its tasks.
    """
    from tfplan.engine.experiment import index_output

    sweep_dir = Path(spec.sweep_dir)
    header = {
        "sweep_id": spec.sweep_id,
        "sweep_dir": spec.sweep_dir,
        "overrides": list(spec.overrides),
        "sweeper": spec.sweeper,
        "concurrency": spec.concurrency,
        "started_at": round(time.time(), 3),
        "command": " ".join(sys.argv),
    }
    earlier: dict[int, PointRecord] = {}
    if (sweep_dir / "sweep.json").exists():
        try:
            earlier = {p.num: p for p in SweepRecord.load(sweep_dir)[1]}
        except TfplanError as error:
            output.say(None)(f"the earlier run's record is unreadable ({error}): every point runs")
    record = SweepRecord(sweep_dir / "sweep.json", header)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    index_output(workspace, spec.sweep_id, spec.sweep_dir, "sweep")
    seeds = SweepSeeds(
        spec.sweep_id, sweep_dir, workspace.store(spec.sweep_id).scratch, output.say(None)
    )
    try:
        task = PointTask(spec, workspace, output, record, seeds, earlier)
        _run_hydra(spec, task, spec.sweep_dir)
    finally:  # again, so that the sweep, not its last point, is the latest thing applied here
        seeds.close()
        index_output(workspace, spec.sweep_id, spec.sweep_dir, "sweep")
    return sorted(record.points.values(), key=lambda p: p.num)
