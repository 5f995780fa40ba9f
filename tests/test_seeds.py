"""Warm seeds (tfplan.backends.transports.seeds): which tasks a seed can start, and real tasks forked from a
real seed on this host, started, observed and stopped as the shell wrapper's tasks are."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from apply_helpers import alive, wait_until
from cgroup_helpers import memory_cgroup

import tfplan.backends.process.seeds as process_seeds
from tfplan.backends.api import Launched, LaunchRequest, TaskPhase
from tfplan.backends.process import ProcessBackend
from tfplan.backends.transports.scripts import fork_script
from tfplan.backends.transports.seeds import (
    WarmSeed,
    fork_request,
    forkable,
    kept_env,
    kept_key,
    seed_env,
    worth_a_seed,
)
from tfplan.errors import BackendError
from tfplan.planning.plan import BackendRef
from tfplan.planning.state import Allocation, TaskRecord, TaskStatus

PY = sys.executable
NAMES_TENSORFLOW = "# a stand-in for a tensorflow program\n"


def _seed(**env: str) -> WarmSeed:
    return WarmSeed("h", 10, 10, "/w/_seed", PY, env)


def test_a_seed_forks_its_own_python_running_a_module_or_a_script() -> None:
    seed = _seed()
    assert forkable(seed, (PY, "-m", "mypkg.train", "--config", "x"), {})
    assert forkable(seed, (PY, "/u/train.py", "a=1"), {})
    assert not forkable(seed, ("/usr/bin/python3.9", "-m", "recipes.train"), {})  # not its own
    assert not forkable(seed, (PY, "-c", "print(1)"), {})
    assert not forkable(seed, (PY, "-u", "train.py"), {})  # interpreter options: cold start
    assert not forkable(seed, ("/bin/sh", "run.sh"), {})
    assert not forkable(seed, (), {})


def test_a_seed_is_worth_it_only_for_a_program_that_may_import_tensorflow(tmp_path: Path) -> None:
    """A seed saves a task TensorFlow's import, nothing else: a program whose script and the
    .py files beside it never name TensorFlow or Keras starts cold (it would only wait)."""
    alone, beside, unreadable = tmp_path / "alone", tmp_path / "beside", tmp_path / "gone"
    for folder in (alone, beside):
        folder.mkdir()
        (folder / "probe.py").write_text("import json, os\nprint(os.environ['TF_CONFIG'])\n")
    assert not worth_a_seed((PY, str(alone / "probe.py")))
    (beside / "model.py").write_text("from tensorflow import keras\n")  # what probe may import
    assert worth_a_seed((PY, str(beside / "probe.py"), "lr=0.1"))
    assert worth_a_seed((PY, "probe.py"), workdir=str(beside))  # relative: the task's folder
    (alone / "probe.py").write_text("import keras\n")  # the answer follows the file's changes
    os.utime(alone / "probe.py", ns=(1, 1))
    assert worth_a_seed((PY, str(alone / "probe.py")))
    (alone / "probe.py").write_text("import tensorflow_probability_free_text = 1\n")
    os.utime(alone / "probe.py", ns=(2, 2))
    assert not worth_a_seed((PY, str(alone / "probe.py")))  # a longer word is not the name
    # not readable here (on another host only), a module: a training program is assumed
    assert worth_a_seed((PY, str(unreadable / "train.py")))
    assert worth_a_seed((PY, "-m", "mypkg.train"))
    assert worth_a_seed((PY, "-m", "recipes.train", "--config", "run.yaml"))
    # what a seed never forks
    assert not worth_a_seed((PY, "-c", "import tensorflow"))
    assert not worth_a_seed(("/bin/sh", str(beside / "probe.py")))
    assert not worth_a_seed(())


def test_values_read_at_import_must_match_the_seeds() -> None:
    seed = _seed(TF_USE_LEGACY_KERAS="1")
    assert forkable(seed, (PY, "t.py"), {"TF_USE_LEGACY_KERAS": "1", "LR": "0.1"})
    assert not forkable(seed, (PY, "t.py"), {})
    assert not forkable(seed, (PY, "t.py"), {"TF_USE_LEGACY_KERAS": "0"})


def test_the_seed_environment_leaves_out_what_is_per_task_and_adds_the_recipes_defaults() -> None:
    env = {"TF_CONFIG": "{}", "PYTHONPATH": "/w/0/_code", "A": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}
    env |= {"TFPLAN_TASK": "ps/0", "TFPLAN_RUN_CONFIG": "/w/0/ps-0/run.yaml"}
    assert seed_env((PY, "t.py"), env) == {"A": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}
    built_in = seed_env((PY, "-m", "recipes.train"), {"A": "1"})
    assert built_in == {"A": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
    # a seed for the built-in recipes forks them: same import-time values as their own defaults
    seed = _seed(**built_in)
    assert forkable(seed, (PY, "-m", "recipes.train"), {"A": "1"})


def test_a_kept_seed_is_kept_for_the_key_else_the_environments_seconds_else_not() -> None:
    keep = process_seeds.keep_secs
    assert keep(30, {"TFPLAN_WARM_KEEP_SECS": "300"}) == 30.0  # the key wins
    assert keep(0, {"TFPLAN_WARM_KEEP_SECS": "300"}) == 0.0
    assert keep(None, {"TFPLAN_WARM_KEEP_SECS": "300"}) == 300.0
    assert keep(None, {"TFPLAN_WARM_KEEP_SECS": " "}) == 0.0
    assert keep(None, {}) == 0.0  # the default: the seed is the run's
    for bad in ("soon", "-5", "nan"):
        with pytest.raises(BackendError, match=f"TFPLAN_WARM_KEEP_SECS='{bad}' is not a number"):
            keep(None, {"TFPLAN_WARM_KEEP_SECS": bad})


def test_a_kept_seed_holds_only_import_time_values_and_its_key_names_what_it_can_fork() -> None:
    # a run's own variables never reach the seed other runs fork from; tfplan's own import-time
    # values (a local host's tasks inherit them) do
    env = kept_env(
        (PY, "t.py"), {"LR": "0.1", "TF_USE_LEGACY_KERAS": "1"}, {"TF_CPP_MIN_LOG_LEVEL": "2"}
    )
    assert env == {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    key = kept_key("h", PY, env, True)
    assert key == kept_key("h", PY, dict(reversed(env.items())), True)
    others = [
        kept_key("other", PY, env, True),
        kept_key("h", "/opt/tf215/bin/python", env, True),
        kept_key("h", PY, {**env, "TF_USE_LEGACY_KERAS": "0"}, True),
        kept_key("h", PY, env, False),
    ]
    assert key not in others and len(set(others)) == 4


def test_warm_keep_secs_is_refused_below_zero_and_off_the_process_backend() -> None:
    from tfplan.config.compose import compose_config, to_config
    from tfplan.engine.plans import make_plan
    from tfplan.errors import ConfigError
    from tfplan.planning.context import PlanContext

    ctx = PlanContext(cwd="/home/user/project", local_python=PY, tf_version="2.21.0")
    conf = Path(__file__).resolve().parent.parent / "conf"

    def error(*overrides: str) -> str:
        with pytest.raises(ConfigError) as raised:
            make_plan(to_config(compose_config(list(overrides), conf)), None, ctx)
        return str(raised.value)

    assert error("cluster.warm_keep_secs=-1").startswith("cluster.warm_keep_secs: -1.0 < 0")
    said = error("cluster=k8s", "cluster.warm_keep_secs=60")
    assert said.startswith("cluster.warm_keep_secs: the kubernetes backend's warm seeds live")
    assert "set it to 0" in said and "\n" not in said
    plan = make_plan(to_config(compose_config(["cluster.warm_keep_secs=60"], conf)), None, ctx)
    assert plan.backend.config["warm_keep_secs"] == 60.0  # in the plan: the backend reads it


def test_a_fork_request_is_the_whole_task() -> None:
    data = json.loads(fork_request((PY, "t.py"), {"A": "1"}, "/w/t", "/w/t/log", "/w/t/exit"))
    assert data == {
        "argv": [PY, "t.py"],
        "env": {"A": "1"},
        "workdir": "/w/t",
        "log_path": "/w/t/log",
        "exit_file": "/w/t/exit",
    }
    assert WarmSeed.from_dict(json.loads(json.dumps(_seed(A="1").to_dict()))) == _seed(A="1")


# -- real seeds --------------------------------------------------------------------------

TASK = r"""
import gc, json, os, sys, time
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "pid": os.getpid(),
                  "sid": os.getsid(0), "pgid": os.getpgid(0), "who": os.environ.get("WHO"),
                  "tf_config": os.environ.get("TF_CONFIG"), "path0": sys.path[0],
                  "seeded": "json" in sys.modules, "frozen": gc.get_freeze_count()}), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(600)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ProcessBackend]:
    # the seed imports json only: what matters here is the fork, not TensorFlow's import time
    monkeypatch.setattr(process_seeds, "PRELOAD", ("json",))
    ref = BackendRef("process", {"hosts": [{"name": "localhost", "address": "127.0.0.1"}]})
    with ProcessBackend(ref, tmp_path / "scratch") as b:
        yield b
        for seed in STARTED:  # a test that failed half-way leaves its seed: stopped here
            try:
                b.stop_seed(seed)
            except Exception:  # noqa: BLE001, S110 - stopped already
                pass
        STARTED.clear()


def _request(tmp: Path, name: str, *args: str) -> LaunchRequest:
    script = tmp / "task.py"
    # a seed forks only programs that may import TensorFlow: this one names it (a comment is
    # enough) without importing it, since this test's seed preloads json only (an import here
    # would be seconds of CPU per task, for nothing)
    script.write_text(NAMES_TENSORFLOW + TASK)
    workdir = str(tmp / name.replace("/", "-"))
    return LaunchRequest(
        name=name,
        role="worker",
        index=0,
        host="localhost",
        command=(PY, str(script), *args),
        env={"WHO": name},
        workdir=workdir,
        log_path=f"{workdir}/task.log",
        devices=(),
        tf_config='{"task": {"type": "worker", "index": 0}}',
    )


def _record(request: LaunchRequest, handle: dict[str, object]) -> TaskRecord:
    return TaskRecord(
        name=request.name,
        role=request.role,
        index=request.index,
        planned_host=request.host,
        host=request.host,
        address="127.0.0.1",
        port=None,
        handle=handle,
        workdir=request.workdir,
        log_path=request.log_path,
        command=request.command,
        env=request.env,
        devices=(),
        is_chief=False,
        fingerprint="",
        config_digest="",
        cluster_digest="",
        started_at=time.time(),
        status=TaskStatus.RUNNING,
    )


STARTED: list[WarmSeed] = []


def _started_seed(backend: ProcessBackend, tmp: Path) -> WarmSeed:
    seed = backend.start_seed("localhost", str(tmp / "_seed"), PY, {})
    STARTED.append(seed)
    wait_until(lambda: backend.seed_ready(seed), 60, "the seed to be ready")
    backend.use_seeds([seed])
    return seed


def _first_line(path: str) -> dict[str, object]:
    """The task's own first line (TensorFlow's C++ runtime may print its notices before it:
    the seed imported TensorFlow without the recipes' quiet log level)."""
    log = Path(path)

    def report() -> list[str]:
        text = log.read_text() if log.exists() else ""
        return [line for line in text.splitlines() if line.startswith("{")]

    wait_until(report, 30, f"the task's line in {path}")
    data: dict[str, object] = json.loads(report()[0])
    return data


def test_a_forked_task_is_the_task_its_exit_recorded_and_the_seed_stops_alone(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    seed = _started_seed(backend, tmp_path)
    request = _request(tmp_path, "worker/0", "7")
    launched = backend.launch(request, Allocation())
    assert launched.handle["forked"] is True
    pid = int(launched.handle["pid"])  # type: ignore[call-overload]
    seen = _first_line(request.log_path)
    # its own session and group, its workdir, its argv and environment, TF_CONFIG included
    assert seen["pid"] == seen["sid"] == seen["pgid"] == pid != seed.pid
    assert seen["cwd"] == request.workdir and seen["who"] == "worker/0"
    assert seen["argv"] == [request.command[1], "7"]
    assert seen["path0"] == str(tmp_path)  # a script's folder first, as python would put it
    assert seen["tf_config"] == request.tf_config and seen["seeded"] is True
    # what the seed imported is out of the collector's reach (gc.freeze): a collection in the
    # task does not copy the inherited pages it would otherwise write to
    assert int(seen["frozen"]) > 1000, seen  # type: ignore[call-overload]
    record = _record(request, launched.handle)
    wait_until(lambda: backend.describe([record])["worker/0"].phase.ended, 30, "the task's end")
    info = backend.describe([record])["worker/0"]
    assert (info.phase, info.exit_code) == (TaskPhase.FAILED, 7)
    # stopped by its own group, a task forked from the seed records 128+15 like any other
    request = _request(tmp_path, "worker/1", "sleep")
    sleeper = _record(request, backend.launch(request, Allocation()).handle)
    _first_line(request.log_path)
    assert backend.cancel([sleeper], 5.0)["worker/1"].outcome == "terminated"  # type: ignore[union-attr]
    wait_until(
        lambda: backend.describe([sleeper])["worker/1"].exit_code == 143, 30, "exit 143 recorded"
    )
    # the seed goes alone: the tasks it forked have groups of their own
    request = _request(tmp_path, "worker/2", "sleep")
    survivor = _record(request, backend.launch(request, Allocation()).handle)
    _first_line(request.log_path)
    backend.stop_seed(seed)
    assert not alive(seed.pid)
    survivor_pid = int(survivor.handle["pid"])  # type: ignore[call-overload]
    assert alive(survivor_pid)
    backend.cancel([survivor], 5.0)
    assert not alive(survivor_pid)


def test_without_a_ready_seed_tasks_start_the_usual_way(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    seed = _started_seed(backend, tmp_path)
    request = _request(tmp_path, "worker/0", "0")
    shell = replace(request, command=("/bin/sh", "-c", "exit 0"))
    assert "forked" not in backend.launch(shell, Allocation()).handle  # not Python: cold
    backend.stop_seed(seed)
    launched = backend.launch(request, Allocation())  # the seed is gone: cold, and it runs
    assert "forked" not in launched.handle
    record = _record(request, launched.handle)
    wait_until(lambda: backend.describe([record])["worker/0"].phase.ended, 60, "the task's end")
    assert backend.describe([record])["worker/0"].exit_code == 0
    assert os.path.exists(request.log_path)


GATE = """
import os, time
while not os.path.exists(os.environ["GATE_FILE"]):
    time.sleep(0.02)
"""


@pytest.mark.full  # the fork and the cold fallback run in the fast tier (tests above)
def test_a_seed_started_where_an_earlier_one_ran_is_ready_only_once_it_has_imported(
    backend: ProcessBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed folder is the experiment's: every apply of it starts its seed there. The first
    seed's ``ready`` must not pass the next one for ready (a request then signalled the seed
    mid-import and waited 30 s for an answer that never came, and the task started cold)."""
    first = _started_seed(backend, tmp_path)
    backend.stop_seed(first)
    # the next seed imports a module that waits for a file: it is not ready until the test says
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "gate.py").write_text(GATE)
    gate = tmp_path / "open"
    monkeypatch.setattr(process_seeds, "PRELOAD", ("json", "gate"))
    env = {"PYTHONPATH": str(tmp_path / "mods"), "GATE_FILE": str(gate)}
    second = backend.start_seed("localhost", str(tmp_path / "_seed"), PY, env)
    STARTED.append(second)
    assert not backend.seed_ready(second)  # the first seed's ready is gone
    backend.use_seeds([second])
    request = _request(tmp_path, "worker/0", "0")
    threading.Timer(1.0, gate.touch).start()  # opened while the request waits for ready
    launched = backend.launch(request, Allocation())
    assert launched.handle.get("forked") is True, launched.handle
    assert backend.seed_ready(second) and alive(second.pid)
    record = _record(request, launched.handle)
    wait_until(lambda: backend.describe([record])["worker/0"].phase.ended, 30, "the task's end")
    assert backend.describe([record])["worker/0"].exit_code == 0


@pytest.mark.full  # the fork and the cold fallback run in the fast tier (tests above)
def test_a_seed_that_dies_after_ready_is_not_waited_for(
    backend: ProcessBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request sees the seed's group gone and the task starts cold, instead of waiting
    out the answer's deadline (made an hour here: the launch ends long before it)."""
    monkeypatch.setattr(process_seeds, "FORK_WAIT_SECS", 3600.0)
    seed = _started_seed(backend, tmp_path)
    os.killpg(seed.pgid, signal.SIGKILL)
    wait_until(lambda: not alive(seed.pid), 30, "the seed's end")
    request = _request(tmp_path, "worker/0", "0")
    done: list[Launched] = []
    threading.Thread(
        target=lambda: done.append(backend.launch(request, Allocation())), daemon=True
    ).start()
    wait_until(lambda: done, 120, "the launch (started cold)")
    launched = done[0]
    assert "forked" not in launched.handle
    record = _record(request, launched.handle)
    wait_until(lambda: backend.describe([record])["worker/0"].phase.ended, 60, "the task's end")
    assert backend.describe([record])["worker/0"].exit_code == 0


EXITS_BY_ITSELF = r"""
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print("leaving", flush=True)
os._exit(5)  # as the built-in recipes end: no interpreter teardown
"""


def test_a_forked_task_records_its_exit_itself_before_its_seed_reaps_it(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    """The watcher sees a task gone before the seed has reaped it: the status must already be
    there (seen with two points at once: a chief that finished read as failed, restarted)."""
    seed = _started_seed(backend, tmp_path)
    script = tmp_path / "exits.py"
    script.write_text(EXITS_BY_ITSELF)
    go = tmp_path / "go"
    request = replace(_request(tmp_path, "worker/0"), command=(PY, str(script), str(go)))
    record = _record(request, backend.launch(request, Allocation()).handle)
    assert record.handle["forked"] is True
    os.killpg(seed.pgid, signal.SIGSTOP)  # the seed reaps nothing now
    try:
        go.touch()
        wait_until(lambda: backend.describe([record])["worker/0"].phase.ended, 30, "the end")
        info = backend.describe([record])["worker/0"]
        assert (info.phase, info.exit_code) == (TaskPhase.FAILED, 5)
        assert Path(request.log_path).read_text() == "leaving\n"
    finally:
        os.killpg(seed.pgid, signal.SIGCONT)
    backend.stop_seed(seed)


HOG = """\
import os, sys
with open(sys.argv[1], "w") as procs:  # the task enters its own memory cgroup
    procs.write(str(os.getpid()))
print("allocating", flush=True)
block = bytearray(400 * 2**20)
print("never here", len(block))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a memory cgroup needs root (CI runs as root)")
def test_a_forked_task_gets_a_memory_limit_of_its_own(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    """A forked task is a process of its own: it enters a memory cgroup of its own (here by
    itself, as a launcher or the user's wrapper would put it there), the kernel holds it to that
    limit and kills it alone; the seed records 137 for it and forks the next task."""
    seed = _started_seed(backend, tmp_path)
    script = tmp_path / "hog.py"
    script.write_text(NAMES_TENSORFLOW + HOG)
    with memory_cgroup(64 * 2**20) as procs:
        request = replace(_request(tmp_path, "worker/0"), command=(PY, str(script), str(procs)))
        record = _record(request, backend.launch(request, Allocation()).handle)
        assert record.handle["forked"] is True
        wait_until(lambda: backend.describe([record])["worker/0"].phase.ended, 60, "the kill")
        info = backend.describe([record])["worker/0"]
        assert (info.phase, info.exit_code) == (TaskPhase.FAILED, 137), info
        assert "never here" not in Path(request.log_path).read_text()
    assert alive(seed.pid)  # the limit was the task's alone
    request = _request(tmp_path, "worker/1", "0")
    after = _record(request, backend.launch(request, Allocation()).handle)
    wait_until(lambda: backend.describe([after])["worker/1"].exit_code == 0, 30, "the next task")


def test_a_forked_task_leads_its_own_group_when_its_launch_returns(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    """The seed answers once the child has called setsid: a watcher told of the PID at once
    must find it leading its own group (found in the seed's, it took the task for another
    process and ended its log stream at once: under load, a restarted evaluator's lines were
    never shown)."""
    seed = _started_seed(backend, tmp_path)
    launched = []
    for i in range(8):
        request = _request(tmp_path, f"worker/{i}", "sleep")
        handle = backend.launch(request, Allocation()).handle
        pid = int(handle["pid"])  # type: ignore[call-overload]
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert (handle["forked"], int(stat[2]), int(stat[3])) == (True, pid, pid), stat
        launched.append(_record(request, handle))
    backend.cancel(launched, 5.0)
    backend.stop_seed(seed)


# A library that pulls a heavy package in on import and lets an ImportError pass, as
# TensorFlow's __init__ does with Keras 3 (``importlib.import_module("keras.src.optimizers")``).
LIGHT = """
import importlib
try:
    importlib.import_module("heavy.sub")
except ImportError:
    pass
"""
DEFERRED_TASK = r"""
import json, sys
before = sorted(m for m in sys.modules if m.split(".")[0] == "heavy")
import heavy.sub
print(json.dumps({"light": "light" in sys.modules, "heavy_before": before,
                  "heavy_after": heavy.sub.VALUE}), flush=True)
"""


def test_a_seed_without_keras_defers_it_and_a_task_that_wants_it_imports_it(
    backend: ProcessBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``keras=False`` (the built-in recipes on a built-in model): the seed imports what it
    preloads without the package deferred (TensorFlow without Keras 3, 1.5 s of its 6 s here,
    docs/backends.md); nothing of it is left half-imported, and a forked task that imports it
    gets it whole."""
    lib = tmp_path / "lib"
    (lib / "heavy").mkdir(parents=True)
    (lib / "heavy" / "__init__.py").write_text("")
    (lib / "heavy" / "sub.py").write_text("VALUE = 42\n")
    (lib / "light.py").write_text(LIGHT)
    monkeypatch.setattr(process_seeds, "PRELOAD", ("light",))
    monkeypatch.setattr(process_seeds, "WITHOUT_KERAS", ("--defer", "heavy"))
    folder = str(tmp_path / "_seed")
    seed = process_seeds.start_seed(
        backend.pool, "localhost", folder, PY, {"PYTHONPATH": str(lib)}, keras=False
    )
    STARTED.append(seed)
    assert seed.keras is False and WarmSeed.from_dict(seed.to_dict()) == seed
    wait_until(lambda: backend.seed_ready(seed), 60, "the seed to be ready")
    assert "(light imported without heavy)" in Path(seed.log_path).read_text()
    backend.use_seeds([seed])
    script = tmp_path / "wants_heavy.py"
    script.write_text("# stands for a tensorflow program: a seed forks those\n" + DEFERRED_TASK)
    request = replace(
        _request(tmp_path, "worker/0"),
        command=(PY, str(script)),
        env={"PYTHONPATH": str(lib)},
    )
    launched = backend.launch(request, Allocation())
    assert launched.handle["forked"] is True
    seen = _first_line(request.log_path)
    assert seen == {"light": True, "heavy_before": [], "heavy_after": 42}
    backend.stop_seed(seed)


# A library that imports pyplot at its own import for helpers it may never call, as Keras 3 does
# (``keras.src.visualization``); pyplot says when its body runs.
PLOTS = """
try:
    import matplotlib.pyplot as plt
except ImportError:
    plt = None
"""
PYPLOT = """
import matplotlib
matplotlib.PYPLOT_RAN = True
def figure():
    return "a figure"
"""
PLOTTING_TASK = r"""
import json, sys
import matplotlib
before = getattr(matplotlib, "PYPLOT_RAN", False)
import matplotlib.pyplot as plt
imported = getattr(matplotlib, "PYPLOT_RAN", False)
print(json.dumps({"loaded": "matplotlib.pyplot" in sys.modules, "ran_before": before,
                  "ran_at_import": imported, "figure": plt.figure(),
                  "ran_at_use": matplotlib.PYPLOT_RAN}), flush=True)
"""


def test_pyplot_that_the_seeds_imports_pull_in_loads_when_a_task_first_uses_it(
    backend: ProcessBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keras 3 imports matplotlib.pyplot at its own import (0.6 s of a seed's 4.4 s of CPU):
    the seed leaves it unloaded, and a forked task that imports it gets all of it then (an
    import of a module already in sys.modules reads its ``__spec__``, which loads it)."""
    lib = tmp_path / "lib"
    (lib / "matplotlib").mkdir(parents=True)
    (lib / "matplotlib" / "__init__.py").write_text("")
    (lib / "matplotlib" / "pyplot.py").write_text(PYPLOT)
    (lib / "plots.py").write_text(PLOTS)
    monkeypatch.setattr(process_seeds, "PRELOAD", ("plots",))
    folder = str(tmp_path / "_seed")
    seed = process_seeds.start_seed(
        backend.pool, "localhost", folder, PY, {"PYTHONPATH": str(lib)}, keras=True
    )
    STARTED.append(seed)
    wait_until(lambda: backend.seed_ready(seed), 60, "the seed to be ready")
    backend.use_seeds([seed])
    script = tmp_path / "plots_something.py"
    script.write_text("# stands for a tensorflow program: a seed forks those\n" + PLOTTING_TASK)
    request = replace(
        _request(tmp_path, "worker/0"), command=(PY, str(script)), env={"PYTHONPATH": str(lib)}
    )
    assert backend.launch(request, Allocation()).handle["forked"] is True
    seen = _first_line(request.log_path)
    assert seen == {
        "loaded": True,  # the seed imported it, lazily: its body had not run
        "ran_before": False,
        "ran_at_import": True,
        "figure": "a figure",
        "ran_at_use": True,
    }
    backend.stop_seed(seed)


def _ask(tmp_path: Path, pgid: int, wait_secs: float, taken_secs: float) -> tuple[int, str, str]:
    requests = tmp_path / "requests"
    requests.mkdir(exist_ok=True)
    (tmp_path / "ready").write_text("1")
    script = fork_script(str(requests), "w", pgid, wait_secs, 5.0, taken_secs)
    done = subprocess.run(
        ["sh", "-c", script], input=b"{}", capture_output=True, timeout=120, check=False
    )
    return done.returncode, done.stdout.decode().strip(), done.stderr.decode().strip()


@pytest.fixture
def stand_in_seed() -> Iterator[int]:
    """A process group that takes SIGUSR1 (the seed's wake-up) and does nothing."""
    proc = subprocess.Popen(
        ["sh", "-c", "trap '' USR1; while :; do sleep 1; done"], start_new_session=True
    )
    try:
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_request_never_taken_is_withdrawn_for_a_cold_start(
    tmp_path: Path, stand_in_seed: int
) -> None:
    code, out, err = _ask(tmp_path, stand_in_seed, 0.5, 30.0)
    assert (code, out) == (4, "") and "did not answer within" in err
    assert not list((tmp_path / "requests").iterdir())  # withdrawn: the seed will not fork it


def test_a_request_the_seed_took_is_answered_even_past_the_wait(
    tmp_path: Path, stand_in_seed: int
) -> None:
    """A seed that took the request (it removes it first) is forking the task: a cold start
    beside it would run the task twice, the forked one untracked (seen: its port held after
    destroy). The answer is waited for, past the wait for a ready seed to take it."""
    requests = tmp_path / "requests"
    requests.mkdir()

    def take_late() -> None:
        request = requests / "w.json"
        wait_until(request.exists, 60, "the request")
        request.unlink()  # taken: what the seed does before it forks
        time.sleep(1.5)  # the fork, past the requester's wait of 0.5 s
        (requests / "w.pid").write_text("4242\n")

    taker = threading.Thread(target=take_late, daemon=True)
    taker.start()
    code, out, err = _ask(tmp_path, stand_in_seed, 0.5, 30.0)
    taker.join()
    assert (code, out) == (0, "4242"), err
