"""TF_CONFIG of any size (tfplan.backends.delivery): the decision, the launcher's parsing of a
Python command line, and real processes started through the process backend with a 200 KB
TF_CONFIG (over Linux's 128 KiB limit for one environment variable), locally and over SSH."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from tfplan.backends.api import LaunchRequest
from tfplan.backends.delivery import LAUNCHER, TF_CONFIG_FILE, deliver, launcher_command
from tfplan.backends.process import ProcessBackend
from tfplan.backends.transports.specs import HostTarget
from tfplan.planning.plan import BackendRef
from tfplan.planning.state import Allocation
from tfplan.planning.tf_config import ENV_VALUE_LIMIT, MAX_ARG_STRLEN, tf_config_json

PY = sys.executable


def big_tf_config(task_type: str = "worker", index: int = 3, size: int = 200_000) -> str:
    """A real TF_CONFIG of ``size`` bytes, give or take 30 (200 KB: ~11,000 workers)."""
    workers = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:2222" for i in range(size // 20)]
    text = tf_config_json({"ps": ["10.9.9.9:2222"], "worker": workers}, task_type, index)
    while len(text) < size - 30:
        i = len(workers)
        workers.append(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:2222")
        text = tf_config_json({"ps": ["10.9.9.9:2222"], "worker": workers}, task_type, index)
    return text


def request(
    tmp: Path, command: tuple[str, ...], tf_config: str, name: str = "worker/3"
) -> LaunchRequest:
    workdir = tmp / name.replace("/", "-")
    return LaunchRequest(
        name=name,
        role=name.split("/")[0],
        index=int(name.split("/")[1]),
        host="local",
        command=command,
        env={"TFPLAN_TASK": name, "PYTHONPATH": str(tmp / "_code")},
        workdir=str(workdir),
        log_path=str(workdir / "task.log"),
        tf_config=tf_config,
    )


# --- the decision, pure ---------------------------------------------------------------------


def test_a_tf_config_that_fits_goes_in_the_environment_and_nothing_else_changes(
    tmp_path: Path,
) -> None:
    small = tf_config_json({"ps": ["h:1"], "worker": ["h:2"]}, "worker", 0)
    req = request(tmp_path, (PY, "train.py"), small)
    delivery = deliver(req)
    assert delivery.how == "env" and delivery.files == {}
    assert delivery.command == req.command
    assert delivery.env == {**req.env, "TF_CONFIG": small}
    # exactly at Linux's limit it still fits; one byte more does not
    limit = "x" * ENV_VALUE_LIMIT
    assert deliver(request(tmp_path, (PY, "t.py"), limit)).how == "env"
    assert deliver(request(tmp_path, (PY, "t.py"), limit + "x")).how == "python"
    assert deliver(request(tmp_path, (PY, "t.py"), "")).how == "none"


def test_a_large_tf_config_goes_in_a_file_next_to_the_task(tmp_path: Path) -> None:
    text = big_tf_config()
    assert len(text) > MAX_ARG_STRLEN
    req = request(tmp_path, (PY, "-u", "train.py", "--lr", "0.1"), text)
    delivery = deliver(req)
    path = f"{req.workdir}/{TF_CONFIG_FILE}"
    assert delivery.how == "python" and delivery.files == {path: text}
    assert "TF_CONFIG" not in delivery.env and delivery.env["TF_CONFIG_FILE"] == path
    assert delivery.command == (PY, "-u", "-c", LAUNCHER, "script", "train.py", "--lr", "0.1")
    assert all(len(word) < 2048 for word in delivery.command)  # the command line stays small
    shell = deliver(request(tmp_path, ("/bin/sh", "run.sh"), text))
    assert shell.how == "file" and shell.command[-2:] == ("/bin/sh", "run.sh")


def test_the_overhead_of_a_transport_counts_against_the_limit(tmp_path: Path) -> None:
    text = "x" * (ENV_VALUE_LIMIT - 100)
    req = request(tmp_path, (PY, "t.py"), text)
    assert deliver(req).how == "env"
    assert deliver(req, overhead=1000).how == "python"  # SSH: exports + argv in one string


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python3", "t.py", "-m"], ["python3", "-c", "L", "script", "t.py", "-m"]),
        (
            ["/usr/bin/python3.11", "-m", "recipes.train", "--config", "r.yaml"],
            ["/usr/bin/python3.11", "-c", "L", "-m", "recipes.train", "--config", "r.yaml"],
        ),
        (["python", "-um", "mod", "a"], ["python", "-u", "-c", "L", "-m", "mod", "a"]),
        (
            ["python", "-W", "ignore", "-X", "dev", "t.py"],
            ["python", "-W", "ignore", "-X", "dev", "-c", "L", "script", "t.py"],
        ),
        (["python", "-Wignore", "t.py"], ["python", "-W", "ignore", "-c", "L", "script", "t.py"]),
        (["python3", "-c", "print(1)", "a"], ["python3", "-c", "L", "-c", "print(1)", "a"]),
        (["python3", "-cprint(1)"], ["python3", "-c", "L", "-c", "print(1)"]),
        (["python3"], None),
        (["python3", "-"], None),
        (["python3", "-m"], None),
        (["bash", "train.sh"], None),
        (["./train.py"], None),
    ],
)
def test_the_launcher_runs_python_command_lines_as_python_would(
    command: list[str], expected: list[str] | None
) -> None:
    wrapped = launcher_command(command)
    shown = None if wrapped is None else ["L" if w == LAUNCHER else w for w in wrapped]
    assert shown == expected


# --- real processes ---------------------------------------------------------------------------

PROBE = textwrap.dedent(
    """
    import json, os, subprocess, sys
    config = json.loads(os.environ["TF_CONFIG"])
    child = subprocess.run(
        [sys.executable, "-c",
         "import os; print(int('TF_CONFIG' in os.environ), os.environ.get('TF_CONFIG_FILE', ''))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    print(json.dumps({
        "argv": sys.argv, "name": __name__, "size": len(os.environ["TF_CONFIG"]),
        "task": config["task"], "workers": len(config["cluster"]["worker"]),
        "file": os.environ.get("TF_CONFIG_FILE"), "child": child, "path0": sys.path[0],
    }))
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
    """
)


def _backend(tmp: Path, target: HostTarget) -> ProcessBackend:
    return ProcessBackend(BackendRef("process", {"hosts": [asdict(target)]}), tmp / "scratch")


def _local() -> HostTarget:
    return HostTarget(name="local", address="127.0.0.1", python=PY, kind="local")


def _run(backend: ProcessBackend, req: LaunchRequest, timeout: float = 60) -> tuple[int, str]:
    """Start ``req``, wait for its exit code; (exit code, log)."""
    backend.launch(req, Allocation())
    exit_file = Path(req.workdir) / "exit_code"
    deadline = time.monotonic() + timeout
    while not exit_file.exists():
        assert time.monotonic() < deadline, Path(req.log_path).read_text()[-2000:]
        time.sleep(0.05)
    return int(exit_file.read_text()), Path(req.log_path).read_text()


def _report(log: str) -> dict[str, object]:
    line = next(x for x in log.splitlines() if x.startswith("{"))
    report: dict[str, object] = json.loads(line)
    return report


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    (tmp_path / "_code").mkdir()
    (tmp_path / "_code" / "tfprobe.py").write_text(PROBE)  # on PYTHONPATH, like the recipes
    script = tmp_path / "scripts" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    return script


@pytest.mark.parametrize("form", ["script", "module", "code"])
def test_a_python_task_gets_a_200_kb_tf_config_in_its_own_environment(
    form: str, tmp_path: Path, probe: Path
) -> None:
    text = big_tf_config()
    command = {
        "script": (PY, "-u", str(probe), "--lr", "0.1"),
        "module": (PY, "-m", "tfprobe", "--config", "run.yaml"),  # python -m recipes.train ...
        "code": (PY, "-c", PROBE, "--lr", "0.1"),
    }[form]
    req = request(tmp_path, command, text)
    code, log = _run(_backend(tmp_path, _local()), req)
    assert code == 0, log
    report = _report(log)
    assert report["size"] == len(text) > 199_900
    assert report["task"] == {"type": "worker", "index": 3}
    assert report["name"] == "__main__"
    assert report["file"] == f"{req.workdir}/{TF_CONFIG_FILE}"
    # a program the task starts cannot take TF_CONFIG (it could not start): it gets the file
    assert report["child"] == ["0", report["file"]]
    argv = report["argv"]
    assert isinstance(argv, list)
    if form == "script":
        assert argv == [str(probe), "--lr", "0.1"] and report["path0"] == str(probe.parent)
    elif form == "module":
        assert argv[0].endswith("tfprobe.py") and argv[1:] == ["--config", "run.yaml"]
    else:
        assert argv == ["-c", "--lr", "0.1"]


def test_the_exit_code_and_a_small_tf_config_pass_through_unchanged(
    tmp_path: Path, probe: Path
) -> None:
    small = tf_config_json({"ps": ["h:1"], "worker": ["h:2"] * 4}, "worker", 3)
    req = request(tmp_path, (PY, str(probe)), small)
    req = replace(req, env={**req.env, "PROBE_EXIT": "3"})
    code, log = _run(_backend(tmp_path, _local()), req)
    assert code == 3
    report = _report(log)
    assert report["size"] == len(small) and report["file"] is None
    assert report["child"] == ["1"]  # in the environment: inherited as usual
    assert not (Path(req.workdir) / TF_CONFIG_FILE).exists()


def test_a_task_that_is_not_python_gets_the_file_and_a_one_line_warning(tmp_path: Path) -> None:
    text = big_tf_config()
    script = tmp_path / "run.sh"
    script.write_text('echo "set=${TF_CONFIG+yes} size=$(wc -c < "$TF_CONFIG_FILE") args=$*"\n')
    req = request(tmp_path, ("/bin/sh", str(script), "a b"), text)
    code, log = _run(_backend(tmp_path, _local()), req)
    assert code == 0, log
    warning, output = log.strip().splitlines()
    assert warning.startswith("tfplan: TF_CONFIG is over Linux's 128 KiB limit")
    assert f"TF_CONFIG_FILE={req.workdir}/{TF_CONFIG_FILE}" in warning
    assert output == f"set= size={len(text)} args=a b"


def test_without_the_launcher_linux_refuses_such_a_task(tmp_path: Path) -> None:
    """Why the file exists: the same TF_CONFIG in the environment cannot even start."""
    import subprocess

    with pytest.raises(OSError) as error:
        subprocess.run([PY, "-c", "pass"], env={**os.environ, "TF_CONFIG": big_tf_config()})
    assert error.value.errno == 7  # E2BIG: Argument list too long


@pytest.mark.ssh
def test_over_ssh_a_large_tf_config_reaches_the_task_too(
    tmp_path: Path, probe: Path, sshd_target: HostTarget
) -> None:
    backend = _backend(tmp_path, HostTarget(**{**asdict(sshd_target), "name": "local"}))
    try:
        # the second fits in one variable, but not in the `sh -c` start script SSH sends
        for size in (200_000, ENV_VALUE_LIMIT - 40):
            text = big_tf_config(size=size)
            req = request(tmp_path / str(size), (PY, str(probe)), text)
            assert deliver(req).how == ("python" if size > ENV_VALUE_LIMIT else "env")
            code, log = _run(backend, req)
            assert code == 0, log
            assert _report(log)["size"] == len(text)
    finally:
        backend.close()
