"""The Slurm test bed itself works: 3 idle nodes, one address each, TCP between nodes, and a
teardown that leaves nothing behind. Real slurmctld/slurmd/munge (tests/slurm_testbed.py)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from slurm_testbed import SlurmTestbed, alive, slurm_missing

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.full]


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The first stdout line of ``proc``, waiting at most ``timeout`` seconds."""
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()  # type: ignore[union-attr]
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no line from {proc.args!r} in {timeout}s") from None
    assert line, f"{proc.args!r} exited {proc.wait()} before a line"
    return line.strip()


def _wait_for_task(bed: SlurmTestbed, argv: list[str], nodes: list[str]) -> None:
    deadline = time.monotonic() + 30
    while not all(
        any(_cmdline(p)[: len(argv)] == argv for p in bed.netns_pids(node)) for node in nodes
    ):
        assert time.monotonic() < deadline, f"{argv} did not start on {nodes}"
        time.sleep(0.1)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def test_sinfo_shows_three_idle_nodes(slurm_cluster: SlurmTestbed) -> None:
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %T %o %c").stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert rows == [
        [name, "idle", slurm_cluster.addresses[name], str(slurm_cluster.cpus)]
        for name in ("n1", "n2", "n3")
    ]


def test_srun_one_task_per_node_each_with_its_own_address(slurm_cluster: SlurmTestbed) -> None:
    script = 'echo "$SLURM_PROCID $SLURMD_NODENAME $(ip -4 -o addr show eth0 | cut -d" " -f7)"'
    out = slurm_cluster.run("srun", "-N3", "-n3", "sh", "-c", script, timeout=60).stdout
    rows = sorted(line.split() for line in out.splitlines())
    nodes = {node: addr.split("/")[0] for _, node, addr in rows}
    assert [r[0] for r in rows] == ["0", "1", "2"]
    assert nodes == slurm_cluster.addresses


SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen()
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.sendall(b"hello from " + sys.argv[1].encode()); c.close()
"""
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
print(c.recv(100).decode())
"""


def test_tcp_from_a_task_on_n2_to_a_server_on_n1(slurm_cluster: SlurmTestbed) -> None:
    n1 = slurm_cluster.addresses["n1"]
    server = slurm_cluster.popen(
        "srun", "-N1", "-n1", "-w", "n1", "-J", "tcp-server", sys.executable, "-c", SERVER, n1
    )
    try:
        port = _first_line(server, timeout=30)
        client = slurm_cluster.run(
            "srun", "-N1", "-n1", "-w", "n2", sys.executable, "-c", CLIENT, n1, port, timeout=60
        )
        assert client.stdout.strip() == f"hello from {n1}"
        assert server.wait(30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_attach_runs_clients_on_a_running_bed_and_stops_only_them(
    slurm_cluster: SlurmTestbed,
) -> None:
    bed = SlurmTestbed.attach(slurm_cluster.conf)
    assert bed.addresses == slurm_cluster.addresses and bed.partition == slurm_cluster.partition
    assert bed.jobcomp_log == slurm_cluster.jobcomp_log
    client = bed.popen("srun", "-N1", "-n1", "-w", "n2", "sh", "-c", "echo up; exec sleep 302")
    assert _first_line(client, 60) == "up"
    assert bed.stop() == []  # its own client, SIGTERMed: srun cancels its job
    assert client.poll() is not None
    deadline = time.monotonic() + 30
    while slurm_cluster.run("squeue", "-h").stdout.strip():
        assert time.monotonic() < deadline, "the client's job is still queued"
        time.sleep(0.1)
    test_sinfo_shows_three_idle_nodes(slurm_cluster)  # the owner's daemons run on


def test_teardown_leaves_no_process_namespace_or_link(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the Slurm test bed needs root for network namespaces (CI runs as root)")
    assert not slurm_missing(), "run scripts/setup.sh"
    bed = SlurmTestbed(tmp_path, nodes=2)
    with bed:
        # a step left running: its slurmstepd and task outlive slurmd unless teardown ends them
        job = bed.run("sbatch", "--parsable", "-N2", "--wrap", "srun sleep 300").stdout.strip()
        _wait_for_task(bed, ["/usr/bin/sleep", "300"], bed.node_names)
        # and an srun client of the test's own, still running at teardown: stop() ends it
        client = bed.popen(
            "srun", "-N1", "-n1", "-w", "n1", "--overlap", f"--jobid={job}", "sleep", "301"
        )
        _wait_for_task(bed, ["/usr/bin/sleep", "301"], ["n1"])
        pids = bed.pids()
        munge_dir = bed.munge_dir
        assert (tmp_path / "work" / f"slurm-{job}.out").exists()
    assert client.poll() is not None
    assert [p for p in pids if alive(p)] == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in bed.namespaces)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert bed.bridge not in links and not any(v in links for v in bed.veths)
    assert munge_dir is not None and not munge_dir.exists()
