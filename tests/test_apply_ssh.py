"""`tfplan apply` over SSH: a real sshd on loopback, and three hosts in network namespaces."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from apply_helpers import (
    CONF,
    alive,
    base_overrides,
    example_with_data,
    fake_overrides,
    free_port_base,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
)
from testbed import LoopbackSshd, NetnsTestbed

from tfplan.backends.transports.specs import HostTarget


def _conf_with_cluster(tmp: Path, name: str, cluster: dict[str, object]) -> dict[str, str]:
    """A copy of conf/ with one more cluster option; returns the env that selects it."""
    conf = tmp / "conf"
    shutil.copytree(CONF, conf)
    body = {"defaults": ["schema_cluster", "_self_"], "name": name, **cluster}
    (conf / "cluster" / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return {"TFPLAN_CONF": str(conf)}


def _host(target: HostTarget, **extra: object) -> dict[str, object]:
    host: dict[str, object] = {
        "address": target.address,
        "name": target.name,
        "ssh_user": target.ssh_user,
        "ssh_key": target.ssh_key,
        "python": target.python,
        "executor": "ssh",
        "cpu_slots": 4,
    }
    if target.ssh_port is not None:
        host["ssh_port"] = target.ssh_port
    host.update(extra)
    return host


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


@pytest.mark.ssh
def test_apply_over_ssh_runs_and_tears_down(ws: Path, sshd_server: LoopbackSshd) -> None:
    target = sshd_server.target()
    env = _conf_with_cluster(
        ws,
        "viassh",
        {
            "hosts": [_host(target)],
            "ps": 1,
            "workers": 2,
            "ssh_known_hosts": str(sshd_server.known_hosts),
        },
    )
    port = free_port_base()
    args = ["cluster=viassh", *base_overrides(ws, port), *fake_overrides(ws, steps="4")]
    proc = tfplan(ws, "apply", "--auto-approve", *args, env=env, check=True)
    assert "ps/0: started on sshd" in proc.stdout
    assert "worker/0     | step=4" in proc.stdout
    assert "Training complete" in proc.stdout
    state = state_of(ws)
    assert {t["host"] for t in state["tasks"]} == {"sshd"}
    assert not [t for t in state["tasks"] if alive(t["handle"]["pid"])]


@pytest.mark.ssh
@pytest.mark.parametrize("problem", ["bad_key", "unknown_host_key", "host_down"])
def test_ssh_problems_are_one_line_errors_and_start_nothing(
    ws: Path, sshd_server: LoopbackSshd, problem: str
) -> None:
    target = sshd_server.target()
    host = _host(target)
    known_hosts = str(sshd_server.known_hosts)
    if problem == "bad_key":
        wrong = ws / "wrong_key"
        from testbed import make_key

        host["ssh_key"] = str(make_key(wrong))
    elif problem == "unknown_host_key":
        empty = ws / "known_hosts_empty"
        empty.write_text("")
        known_hosts = str(empty)
    else:
        from testbed import free_port

        host["ssh_port"] = free_port()  # nothing listens there
    env = _conf_with_cluster(
        ws,
        "viassh",
        {
            "hosts": [host],
            "ps": 1,
            "workers": 1,
            "ssh_known_hosts": known_hosts,
        },
    )
    args = ["cluster=viassh", *base_overrides(ws, free_port_base()), *fake_overrides(ws)]
    proc = tfplan(ws, "apply", "--auto-approve", *args, env=env)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: preflight failed on 1 host(s): sshd:")
    assert proc.stderr.count("\n") == 1, proc.stderr
    expected = {"bad_key": "auth", "unknown_host_key": "known", "host_down": "connect"}[problem]
    assert expected in proc.stderr.lower()
    state_file = ws / ".tfplan" / "t" / "state.json"
    assert not state_file.exists() or json.loads(state_file.read_text())["tasks"] == []
    if problem == "unknown_host_key":
        # Accepting new host keys on purpose makes the same apply work.
        ok = tfplan(
            ws,
            "apply",
            "--auto-approve",
            *args,
            "cluster.ssh_accept_new_host_keys=true",
            env=env,
            check=True,
        )
        assert "Training complete" in ok.stdout


@pytest.mark.netns
@pytest.mark.cluster
@pytest.mark.full  # apply across namespace hosts stays in the fast tier through the firewall
# and per-host-output tests
def test_downpour_across_three_namespaced_hosts(ws: Path, netns_testbed: NetnsTestbed) -> None:
    hosts = [_host(t, port_base=2300) for t in netns_testbed.targets()]
    env = _conf_with_cluster(
        ws,
        "three",
        {
            "hosts": hosts,
            "ps": "per_host",
            "workers": 2,
            "ssh_known_hosts": str(netns_testbed.known_hosts),
            "workdir": str(ws / "work"),
            "output_dir": str(netns_testbed.shared_dir / "run"),
        },
    )
    args = [
        "cluster=three",
        "algo=downpour",
        "algo.window=4",
        "trainer.max_steps=80",
        "trainer.log_steps=20",
        "trainer.checkpoint_steps=40",
        "experiment.id=t",
        "lifecycle.ps_grace_secs=2",
    ]
    planned = tfplan(ws, "plan", *args, env=env, check=True)
    assert "Plan: 5 to add, 0 to change, 0 to destroy." in planned.stdout
    addresses = [h["address"] for h in hosts]
    for address in addresses:
        assert f"{address}:2300" in planned.stdout
    applied = tfplan(ws, "apply", env=env, timeout=300)
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr
    assert "Training complete" in applied.stdout
    result = json.loads((netns_testbed.shared_dir / "run" / "result.json").read_text())
    assert result["global_step"] >= 80
    state = state_of(ws)
    assert {t["host"] for t in state["tasks"]} == {"h1", "h2", "h3"}
    assert not [t for t in state["tasks"] if alive(t["handle"]["pid"])]


@pytest.mark.full
@pytest.mark.netns
@pytest.mark.cluster
def test_the_users_keras_model_trains_across_three_namespaced_hosts(
    ws: Path, netns_testbed: NetnsTestbed
) -> None:
    """examples/tabular from its own folder, over SSH: its package reaches every host through
    the SSH transport (one tar per host) and the shards are read by path on each."""
    project = example_with_data("tabular", ws / "project")
    hosts = [_host(t, port_base=2400) for t in netns_testbed.targets()]
    env = _conf_with_cluster(
        ws,
        "three",
        {
            "hosts": hosts,
            "ps": 1,
            "workers": 2,
            "ssh_known_hosts": str(netns_testbed.known_hosts),
            "workdir": str(ws / "work"),
            "output_dir": str(netns_testbed.shared_dir / "user"),
        },
    )
    args = [
        "cluster=three",
        "algo=easgd",
        "model._target_=tabular.models.build",
        "model.units=16",
        "data=tfrecord",
        "data.train=data/train-*.tfrecord",
        "data.eval=data/eval.tfrecord",
        "trainer.max_steps=60",
        "trainer.checkpoint_steps=60",
        "experiment.id=t",
        "lifecycle.ps_grace_secs=2",
    ]
    try:
        applied = tfplan(project, "apply", "--auto-approve", *args, env=env, timeout=300)
        assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr
        result = json.loads((netns_testbed.shared_dir / "user" / "result.json").read_text())
        assert result["status"] == "succeeded" and result["global_step"] >= 60
        assert (ws / "work" / "_code" / "tabular" / "models.py").is_file()
        state = state_of(project)
        assert len({t["host"] for t in state["tasks"]}) == 3
        assert not [t for t in state["tasks"] if alive(t["handle"]["pid"])]
    finally:
        kill_groups(recorded_groups(project))


@pytest.mark.ssh
def test_a_sweep_over_ssh_forks_its_tasks_from_the_hosts_warm_seed(
    ws: Path, sshd_server: LoopbackSshd
) -> None:
    """The seed over SSH: its agent written there, started, asked for each task through the
    SSH connection (fork_script), stopped at the end; nothing of it left on the host."""
    from sweep_helpers import command, result_task, sweep_overrides

    target = sshd_server.target()
    env = _conf_with_cluster(
        ws,
        "viassh",
        {
            "hosts": [_host(target)],
            "ps": 1,
            "workers": 2,
            "ssh_known_hosts": str(sshd_server.known_hosts),
        },
    )
    script = result_task(ws, tensorflow=True)
    run = command(script, steps="3")  # the host's python is this one (sshd on loopback)
    proc = tfplan(
        ws,
        "apply",
        "-m",
        "--auto-approve",
        "cluster=viassh",
        *sweep_overrides(ws, free_port_base(30)),
        "recipe=command",
        f"recipe.command={run}",
        "algo.lr=0.03,0.06",
        env=env,
        check=True,
    )
    assert "sweep tfplan | warm seed on sshd ready in" in proc.stdout, proc.stdout
    assert "Sweep complete! 2 succeeded, 0 failed." in proc.stdout
    for experiment in ("s-0", "s-1"):
        state = state_of(ws, experiment)
        assert all(t["handle"].get("forked") is True for t in state["tasks"]), state["tasks"]
        assert {t["host"] for t in state["tasks"]} == {"sshd"}
    results = json.loads((ws / "out" / "results.json").read_text())["points"]
    assert [round(p["accuracy"], 6) for p in results] == [0.98, 0.99]
    assert not (ws / "out" / "seeds.json").exists()
    assert not [g for g in recorded_groups(ws) if alive(g)]
