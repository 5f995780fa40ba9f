"""Hydra's launcher for tfplan sweeps: each job Hydra's sweeper asks for is a whole cluster.

Hydra splits a multirun in two: a *sweeper* (basic: the product of ``a=1,2 b=x,y``; Optuna:
samples) decides which jobs to run, in batches, and a *launcher* runs each batch and returns one
:class:`~hydra.core.utils.JobReturn` per job. This launcher (``hydra/launcher=tfplan``, found by
Hydra through ``hydra_plugins/tfplan_launcher``) composes each job like Hydra's basic launcher, then
makes it a cluster of its own:

- ``experiment.id = <sweep id>-<job number>`` (its own state, lock and work folder);
- ``cluster.output_dir = <sweep dir>/<job number>`` (its checkpoints, summaries, results);
- ``cluster.workdir`` gets ``/<job number>`` appended unless it names ``${experiment.id}``;
- ``cluster.port_offset`` moves the job to its own window of ``cluster.port_range`` ports, taken
  from a pool of windows while it runs, least recently used first, so clusters running at once
  never share a port and a window is not reused right after a cluster has closed its sockets;

and runs up to ``concurrency`` jobs at once (threads: a job is mostly waiting on processes). The
task function gets the job's config (with its ``hydra`` node) and returns the point's metric.
"""

from __future__ import annotations

import copy
import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from tfplan.errors import ConfigError
from tfplan.sweeps import optuna_tap

__all__ = ["ClusterLauncher", "ClusterLauncherConf", "register_launcher", "MAX_PORT_WINDOWS"]

MAX_PORT_WINDOWS = 64  # windows in rotation; more only costs ports
STOP_WAIT_SECS = 600.0  # an interrupted point stops its tasks: grace periods, then kills

# Points composed in this process and not run yet, by (sweep id, sweep folder, the sweep's own
# overrides, the point's): ``tfplan apply -m`` plans every point first (the preview it asks
# approval for, in a scratch ``hydra.sweep.dir``), then runs them, and each point is composed
# once (a Hydra composition is about 0.3 s of CPU). Taken, not kept: a run composes afresh what
# no preview composed in this process (Optuna's trials are asked anew).
_PreviewKey = tuple[str, str, tuple[str, ...], tuple[str, ...]]
_previewed: dict[_PreviewKey, DictConfig] = {}
_previewed_lock = threading.Lock()


@dataclass
class ClusterLauncherConf:
    _target_: str = "hydra_plugins.tfplan_launcher.tfplan_launcher.TfplanLauncher"
    concurrency: int = 1
    sweep_id: str = "sweep"
    sweep_dir: str = "sweep"
    preview: bool = False  # a preview before a run: keeps each point's composition for it


def register_launcher() -> None:
    """Make ``hydra/launcher=tfplan`` known to Hydra's ConfigStore."""
    ConfigStore.instance().store(
        group="hydra/launcher", name="tfplan", node=ClusterLauncherConf, provider="tfplan"
    )


class _PortWindows:
    """Windows of ``cluster.port_range`` ports lent to running points, least recently used
    first."""

    def __init__(self, count: int) -> None:
        self._free = deque(range(count))
        self._ready = threading.Condition()

    def take(self) -> int:
        with self._ready:
            while not self._free:
                self._ready.wait()
            return self._free.popleft()

    def give_back(self, window: int) -> None:
        with self._ready:
            self._free.append(window)
            self._ready.notify()


class ClusterLauncher(Launcher):
    """See the module docstring. Subclassed in ``hydra_plugins`` so that Hydra accepts it."""

    def __init__(
        self,
        concurrency: int = 1,
        sweep_id: str = "sweep",
        sweep_dir: str = "sweep",
        preview: bool = False,
    ) -> None:
        super().__init__()
        if concurrency < 1:
            raise ConfigError("--concurrency", f"{concurrency} < 1", "run at least one cluster")
        self.concurrency = concurrency
        self.sweep_id = sweep_id
        self.sweep_dir = sweep_dir
        self.preview = preview
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self._windows: _PortWindows | None = None
        self._running: dict[int, int] = {}  # job number -> thread id (for messages)
        self._lock = threading.Lock()

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        jobs = [self._compose(list(o), initial_job_idx + i) for i, o in enumerate(job_overrides)]
        tap = optuna_tap.current()  # Optuna's sweeper: job i of the batch is the i-th trial asked
        if tap is not None:
            tap.bind(initial_job_idx, len(jobs))
        if self.concurrency == 1 or len(jobs) == 1:
            return [self._run(job) for job in jobs]  # in this thread: Ctrl-C acts as in apply
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="tfplan-point") as pool:
            futures = [pool.submit(self._run, job) for job in jobs]
            try:
                return [f.result() for f in futures]
            except KeyboardInterrupt:
                self._interrupt(futures)
                raise

    def _compose(self, overrides: list[str], num: int) -> DictConfig:
        assert self.hydra_context is not None and self.config is not None
        key = (
            self.sweep_id,
            self.sweep_dir,
            tuple(self.config.hydra.overrides.task),
            tuple(overrides),
        )
        if self.preview:
            cfg = self._composed(overrides, num)
            with _previewed_lock:
                _previewed[key] = copy.deepcopy(cfg)  # as composed: the preview changes its own
        else:
            with _previewed_lock:
                kept = _previewed.pop(key) if key in _previewed else None
            if kept is not None and kept.hydra.job.num == num:
                cfg = kept
                with open_dict(cfg):  # the preview's was its scratch folder
                    cfg.hydra.sweep.dir = self.config.hydra.sweep.dir
            else:
                cfg = self._composed(overrides, num)
        if self._windows is None:
            self._windows = _PortWindows(self._window_count(cfg))
        return cfg

    def _composed(self, overrides: list[str], num: int) -> DictConfig:
        assert self.hydra_context is not None and self.config is not None
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        cluster = OmegaConf.to_container(cfg.cluster, resolve=False)
        assert isinstance(cluster, dict)
        raw_workdir = str(cluster["workdir"])
        with open_dict(cfg):
            cfg.hydra.job.id = str(num)
            cfg.hydra.job.num = num
            cfg.experiment.id = f"{self.sweep_id}-{num}"
            cfg.cluster.output_dir = os.path.join(self.sweep_dir, str(num))
            if "${experiment.id}" not in raw_workdir:
                cfg.cluster.workdir = raw_workdir.rstrip("/") + f"/{num}"
        return cfg

    def _window_count(self, cfg: DictConfig) -> int:
        """How many port windows fit between the highest port base and 65535."""
        cluster = cfg.cluster
        bases = [int(cluster.port_base)] + [
            int(h.port_base) for h in cluster.hosts if h.get("port_base") is not None
        ]
        first = max(bases) + int(cluster.port_offset)
        span = max(int(cluster.port_range), 1)
        fit = max((65536 - first) // span, 0)
        if fit < self.concurrency:
            raise ConfigError(
                "cluster.port_range",
                f"{self.concurrency} clusters at once need {self.concurrency} windows of {span} "
                f"ports above {first}, and only {fit} fit",
                "lower --concurrency, cluster.port_range or cluster.port_base",
            )
        return min(fit, max(self.concurrency, MAX_PORT_WINDOWS))

    def _run(self, cfg: DictConfig) -> JobReturn:
        assert self._windows is not None and self.task_function is not None
        assert self.hydra_context is not None
        num = int(cfg.hydra.job.num)
        window = self._windows.take()
        with self._lock:
            self._running[num] = threading.get_ident()
        try:
            with open_dict(cfg):
                cfg.cluster.port_offset = int(cfg.cluster.port_offset) + window * int(
                    cfg.cluster.port_range
                )
            callbacks = self.hydra_context.callbacks
            callbacks.on_job_start(config=cfg, task_function=self.task_function)
            ret = JobReturn(
                overrides=list(cfg.hydra.overrides.task),
                cfg=cfg,
                hydra_cfg=cfg.hydra,
                working_dir=os.getcwd(),
                task_name=str(cfg.hydra.job.name),
            )
            try:
                ret.return_value = self.task_function(cfg)
                ret.status = JobStatus.COMPLETED
            except Exception as error:  # noqa: BLE001 - Hydra's JobReturn carries it to the sweeper
                ret.return_value = error
                ret.status = JobStatus.FAILED
            callbacks.on_job_end(config=cfg, job_return=ret)
            return ret
        finally:
            with self._lock:
                self._running.pop(num, None)
            self._windows.give_back(window)

    def _interrupt(self, futures: list[Future[Any]]) -> None:
        """Ctrl-C reaches only the main thread: cancel the points not started, and ask the
        running ones to stop (the task function's ``interrupt()``: their supervisors stop their
        tasks at the next tick and record them as stopped, exactly as an interrupted
        ``tfplan apply`` does); wait for them, and name any that did not end."""
        for future in futures:
            future.cancel()
        interrupt = getattr(self.task_function, "interrupt", None)
        if callable(interrupt):
            interrupt()
        stuck = []
        for future in futures:
            if future.cancelled():
                continue
            try:
                future.result(timeout=STOP_WAIT_SECS)
            except TimeoutError:
                stuck.append(future)
            except BaseException:  # noqa: BLE001, S110 - interrupted points end this way
                pass
        if stuck:
            with self._lock:
                running = sorted(self._running)
            print(
                f"tfplan: {len(stuck)} point(s) did not stop within {STOP_WAIT_SECS:.0f}s "
                f"(job numbers {running}): run `tfplan destroy -e {self.sweep_id}-<n>` for each",
                flush=True,
            )
