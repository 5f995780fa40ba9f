"""`cluster.firewall=true` end to end: a cluster on two namespace hosts, a third host outside it.

While the cluster runs, the outsider cannot connect to a ps port (dropped) and a member can;
the plan shows the rules; after `tfplan destroy` the rules are gone and the outsider connects
again. The tasks are a small program that serves its TF_CONFIG port until a stop file appears
(shared by the namespaces), so the test decides when the job ends: no race with training time.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    base_overrides,
    free_port_base,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
    wait_until,
)
from test_apply_ssh import _conf_with_cluster, _host
from testbed import NetnsTestbed

pytestmark = [pytest.mark.netns, pytest.mark.cluster]

SERVE = r"""
import json, os, pathlib, socket, sys, time
cfg = json.loads(os.environ["TF_CONFIG"])
task = cfg["task"]
stop = pathlib.Path(sys.argv[1])
port = int(cfg["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", port))
server.listen()
server.settimeout(0.2)
print(f"{task['type']}/{task['index']} serving on {port}", flush=True)
beat = 0
while not stop.exists():
    try:
        conn, _ = server.accept()
        conn.close()
    except socket.timeout:
        pass
    beat += 1
    if beat % 10 == 0:
        print(f"step={beat}", flush=True)
print("stop file seen", flush=True)
"""


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def _connect(namespace: str, address: str, port: int) -> bool:
    """Whether a TCP connection from inside ``namespace`` to address:port succeeds in 2 s."""
    code = (
        "import socket, sys\n"
        f"try:\n    socket.create_connection(({address!r}, {port}), timeout=2).close()\n"
        "except OSError:\n    sys.exit(1)\n"
    )
    done = subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-c", code], capture_output=True
    )
    return done.returncode == 0


def _rules(namespace: str) -> str:
    done = subprocess.run(
        ["ip", "netns", "exec", namespace, "nft", "list", "tables"], capture_output=True, text=True
    )
    return done.stdout


def test_only_the_clusters_own_hosts_reach_its_ports(ws: Path, netns_testbed: NetnsTestbed) -> None:
    h1, h2, _ = netns_testbed.targets()
    ns1, ns2, ns3 = netns_testbed.namespaces
    shared = netns_testbed.shared_dir
    stop = shared / f"stop-{ws.name}"
    program = shared / f"serve-{ws.name}.py"
    program.write_text(SERVE)
    env = _conf_with_cluster(
        ws,
        "walled",
        {
            "hosts": [_host(h1), _host(h2)],
            "ps": 1,
            "workers": 2,
            "firewall": True,
            "ssh_known_hosts": str(netns_testbed.known_hosts),
            "workdir": str(ws / "work"),
            "output_dir": str(shared / f"out-{ws.name}"),
        },
    )
    port = free_port_base()
    args = [
        "cluster=walled",
        *base_overrides(ws, port)[:3],  # id and ports; the folders come from the cluster
        "recipe=command",
        f"recipe.command={h1.python} {program} {stop}",
    ]
    planned = tfplan(ws, "plan", *args, env=env, check=True)
    assert f"firewall: host h1: admit {h1.address}, {h2.address} and loopback to tcp" in (
        planned.stdout
    )
    assert "no authentication" not in planned.stdout  # the warning gives way to the rules
    tfplan(ws, "apply", "--auto-approve", "--detach", *args, env=env, check=True)
    try:
        ps = next(t for t in state_of(ws)["tasks"] if t["name"] == "ps/0")
        assert ps["host"] == "h1"
        wait_until(lambda: _connect(ns2, h1.address, ps["port"]), 60, "ps/0 to serve its port")
        assert "tfplan_" in _rules(ns1)
        assert not _connect(ns3, h1.address, ps["port"]), "an outsider reached the ps port"
        assert _connect(ns2, h1.address, ps["port"])  # a member still does
    finally:
        stop.write_text("")
    destroyed = tfplan(ws, "destroy", "--auto-approve", env=env)
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert "tfplan_" not in _rules(ns1) and "tfplan_" not in _rules(ns2)
    # nothing serves the port now: the outsider gets a refusal, not a silent drop; prove it can
    # connect again by serving the port ourselves
    listener = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns1,
            sys.executable,
            "-c",
            "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, "
            f"socket.SO_REUSEADDR, 1)\ns.bind(('0.0.0.0', {ps['port']}))\ns.listen()\n"
            "s.accept()[0].close()\n",
        ]
    )
    try:
        wait_until(lambda: _connect(ns3, h1.address, ps["port"]), 30, "the outsider to connect")
    finally:
        listener.kill()
        listener.wait(10)
