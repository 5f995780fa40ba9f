"""Large clusters of idle tasks, for the scale tests and bench/bench_scale.py.

Each task is a program that waits for a signal (``sleep``: SIGTERM ends it), started and
supervised by the real CLI: on this machine (one local host with N slots) or on namespace hosts
over SSH (:class:`testbed.NetnsTestbed`). The helpers start a run detached, wait for every task
to run, and read what the machine and tfplan's own processes cost meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from apply_helpers import CONF, free_port_base, kill_groups, recorded_groups
from test_apply_ssh import _host

__all__ = [
    "IDLE_PROGRAM",
    "ScaleRun",
    "conf_with",
    "group_sizes",
    "Usage",
    "local_cluster",
    "machine_busy",
    "netns_cluster",
    "processes_on_machine",
    "tree_usage",
]

IDLE_PROGRAM = "sleep 100000"  # waits for a signal: SIGTERM (a stop) ends it


@dataclass(frozen=True)
class Usage:
    """One process tree's footprint: RSS (bytes), threads, processes, CPU seconds so far (its
    processes' own and their reaped children's)."""

    rss: int
    threads: int
    processes: int
    cpu_secs: float


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def processes_on_machine() -> int:
    """Live (not zombie) processes on this machine."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            count += fields is not None and fields[0] != "Z"
    return count


def group_sizes(groups: list[int]) -> dict[int, int]:
    """Live (not zombie) processes per process group, from /proc."""
    wanted = set(groups)
    sizes = dict.fromkeys(wanted, 0)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[0] != "Z" and int(fields[2]) in wanted:
                sizes[int(fields[2])] += 1
    return sizes


def tree_usage(root: int) -> Usage:
    """``root`` and its descendants (tfplan and its host watchers, SSH and all)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    rss = threads = processes = 0
    cpu = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    todo = [root]
    while todo:
        pid = todo.pop()
        fields = _stat(pid)
        if fields is None or fields[0] == "Z":
            continue
        processes += 1
        threads += int(fields[17])
        rss += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        # its own time and its reaped children's (a shell loop's `ps` and `sleep`)
        cpu += sum(int(fields[i]) for i in (11, 12, 13, 14)) / ticks
        todo.extend(children.get(pid, []))
    return Usage(rss, threads, processes, cpu)


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])
    return total - idle, total


def machine_busy(seconds: float) -> float:
    """The fraction of the whole machine (all cores) busy over the next ``seconds``."""
    busy0, total0 = _cpu_times()
    time.sleep(seconds)
    busy1, total1 = _cpu_times()
    return (busy1 - busy0) / max(1, total1 - total0)


def conf_with(tmp: Path, cluster: dict[str, object], tfplan_conf: Path = CONF) -> dict[str, str]:
    """A copy of conf/ whose ``cluster=scale`` is ``cluster``; the environment selecting it."""
    conf = tmp / "conf"
    shutil.copytree(tfplan_conf, conf)
    body = {"defaults": ["schema_cluster", "_self_"], "name": "scale", **cluster}
    (conf / "cluster" / "scale.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return {"TFPLAN_CONF": str(conf)}


def local_cluster(tmp: Path, tasks: int, tfplan_conf: Path = CONF) -> dict[str, str]:
    """A conf/ whose ``cluster=scale`` is ``tasks`` workers on this machine (no ps)."""
    base = free_port_base(tasks + 1)
    host = {"address": "127.0.0.1", "name": "localhost", "cpu_slots": tasks}
    return conf_with(
        tmp,
        {
            "hosts": [host],
            "ps": 0,
            "workers": tasks,
            "chief": "worker0",
            "evaluator": False,
            "port_base": base,
            "port_range": tasks + 1,
            "workdir": str(tmp / "work"),
            "output_dir": str(tmp / "out"),
        },
        tfplan_conf,
    )


def netns_cluster(tmp: Path, testbed: object, per_host: int) -> dict[str, str]:
    """A conf/ whose ``cluster=scale`` is ``per_host`` workers on each namespace host."""
    hosts = [_host(t, cpu_slots=per_host) for t in testbed.targets()]  # type: ignore[attr-defined]
    return conf_with(
        tmp,
        {
            "hosts": hosts,
            "ps": 0,
            "workers": per_host * len(hosts),
            "chief": "worker0",
            "evaluator": False,
            "port_base": 3000,
            "port_range": per_host + 1,
            "ssh_known_hosts": str(testbed.known_hosts),  # type: ignore[attr-defined]
            "workdir": str(tmp / "work"),
            "output_dir": str(testbed.shared_dir / "scale"),  # type: ignore[attr-defined]
        },
    )


class ScaleRun:
    """A detached run of idle tasks in ``cwd``: apply, status, destroy through the CLI.

    ``python_path``: an older checkout to run instead of this one (a benchmark's baseline).
    """

    ARGS = ("cluster=scale", "recipe=command", f"recipe.command='{IDLE_PROGRAM}'")

    def __init__(self, cwd: Path, env: dict[str, str], python_path: Path | None = None) -> None:
        self.cwd = cwd
        self.env = {**os.environ, **env}
        self.env.pop("TFPLAN_DEBUG", None)
        if python_path is not None:
            self.env["PYTHONPATH"] = str(python_path)
        self.args = [*self.ARGS, "experiment.id=scale", "lifecycle.stop_grace_secs=5"]

    def tfplan(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tfplan", *args],
            cwd=self.cwd,
            env=self.env,
            text=True,
            capture_output=True,
            timeout=timeout,
        )

    def apply(self) -> float:
        """``tfplan apply --detach``; the seconds until it returned (every task started).

        Raises:
            AssertionError: the apply failed.
        """
        began = time.monotonic()
        done = self.tfplan("apply", "--auto-approve", "--detach", *self.args)
        if done.returncode != 0:
            raise AssertionError(f"apply failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return time.monotonic() - began

    def state(self) -> dict[str, object]:
        data: dict[str, object] = json.loads(
            (self.cwd / ".tfplan" / "scale" / "state.json").read_text()
        )
        return data

    def supervisor_pid(self) -> int | None:
        """The background supervisor the state records."""
        try:
            record = self.state().get("supervisor") or {}
        except OSError:
            return None
        pid = record.get("pid") if isinstance(record, dict) else None
        return int(pid) if pid is not None else None

    def status(self) -> tuple[float, dict[str, object]]:
        """(seconds, parsed ``status --json``)."""
        began = time.monotonic()
        done = self.tfplan("status", "--json")
        took = time.monotonic() - began
        if done.returncode != 0:
            raise AssertionError(f"status failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        return took, json.loads(done.stdout)

    def destroy(self) -> float:
        began = time.monotonic()
        done = self.tfplan("destroy", "--auto-approve")
        if done.returncode != 0:
            raise AssertionError(f"destroy failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        return time.monotonic() - began

    def groups(self) -> list[int]:
        return recorded_groups(self.cwd)

    def cleanup(self) -> None:
        """Whatever a failed run left: its recorded groups, and its background supervisor."""
        kill_groups(self.groups())
        pid = self.supervisor_pid()
        if pid is not None and _stat(pid) is not None:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
