"""cluster.output_mode without hosts: the decision from the markers, placement of the evaluator,
bad combinations as one-line errors, and the file moves on a local host (no TensorFlow)."""

from __future__ import annotations

import copy
import io
import tarfile
from functools import cache
from pathlib import Path

import pytest

from tfplan.backends.process import FETCH_MAX_KIB, FETCH_SKIP, unpack_tree
from tfplan.backends.transports.local import LocalTransport
from tfplan.backends.transports.preflight import output_sharing
from tfplan.backends.transports.specs import HostTarget
from tfplan.config.compose import compose_config, to_config
from tfplan.config.schema import Config, HostConfig
from tfplan.engine.plans import make_plan
from tfplan.errors import ConfigError, PlanError, PreflightError
from tfplan.planning.context import PlanContext
from tfplan.planning.plan import Plan

CONF = Path(__file__).resolve().parent.parent / "conf"
CTX = PlanContext(cwd="/home/user/project", local_python="/usr/bin/python3", tf_version="2.21.0")


@cache
def _composed(overrides: tuple[str, ...]) -> Config:
    return to_config(compose_config(list(overrides), CONF))


def _plan(*overrides: str, slots: int = 4) -> Plan:
    cfg = copy.deepcopy(_composed(("cluster=3node", "cluster.evaluator=true", *overrides)))
    cfg.cluster.hosts = [
        HostConfig(address=f"10.0.0.{i}", name=f"node{i}", cpu_slots=slots) for i in (1, 2, 3)
    ]
    return make_plan(cfg, None, CTX)


def _hosts(plan: Plan) -> dict[str, str]:
    return {t.name: t.host for t in plan.tasks}


# ---- the decision ----------------------------------------------------------------------------
def test_one_marker_for_all_is_shared_and_the_launcher_sees_it_when_it_reads_it_too() -> None:
    same = {"h1": "h1 a", "h2": "h1 a", "h3": "h1 a"}
    found = output_sharing("auto", "/out", same, "h1 a")
    assert (found.per_host, found.launcher_sees) == (False, True)
    assert found.detail == "output_dir /out is shared by h1, h2 and h3 and this machine"
    hidden = output_sharing("shared", "/out", same, None)
    assert (hidden.per_host, hidden.launcher_sees) == (False, False)
    assert hidden.detail.endswith("(not this machine)")


def test_one_host_only_says_whether_this_machine_sees_its_folder() -> None:
    found = output_sharing("auto", "/out", {"h1": "h1 a"}, None)
    assert (found.per_host, found.launcher_sees) == (False, False)
    assert found.detail == "output_dir /out on h1: this machine does not see it"
    assert output_sharing("shared", "/out", {"h1": "h1 a"}, "h1 a").launcher_sees


def test_auto_with_every_host_on_its_own_folder_is_per_host() -> None:
    found = output_sharing("auto", "/out", {"h1": "h1 a", "h2": "h2 b", "h3": "h3 c"}, None)
    assert (found.per_host, found.launcher_sees) == (True, False)
    assert "h1, h2 and h3 each have their own (per-host output)" in found.detail


def test_a_host_that_forgot_the_mount_is_refused_naming_it() -> None:
    markers = {"h1": "h1 a", "h2": "h1 a", "h3": "h3 c"}
    with pytest.raises(PreflightError) as auto:
        output_sharing("auto", "/out", markers, None)
    assert list(auto.value.failures) == ["h3"]
    assert str(auto.value) == (
        "preflight failed on 1 host(s): h3: sees its own /out, not the one h1 and h2 share: "
        "mount it here too, or set cluster.output_mode=per_host (then each host keeps its own)"
    )
    with pytest.raises(PreflightError) as shared:
        output_sharing("shared", "/out", {"h1": "h1 a", "h2": "h2 b", "h3": "h3 c"}, None)
    assert sorted(shared.value.failures) == ["h2", "h3"]
    assert "or set cluster.output_mode=per_host" in str(shared.value)
    assert "\n" not in str(shared.value)


# ---- plan time -------------------------------------------------------------------------------
def test_the_evaluator_goes_beside_the_chief_unless_the_folder_is_shared() -> None:
    # ps/0..2 one per host, worker/0 (the chief) on node1, worker/1 on node2
    auto = _plan("cluster.workers=2")
    assert auto.output_mode == "auto"
    assert _hosts(auto)["evaluator/0"] == _hosts(auto)["worker/0"] == "node1"
    shared = _plan("cluster.workers=2", "cluster.output_mode=shared")
    assert _hosts(shared)["evaluator/0"] == "node3"  # the least used host, as before
    assert Plan.from_json(auto.to_json()).output_mode == "auto"
    legacy = auto.to_dict()
    del legacy["output_mode"]
    assert Plan.from_dict(legacy).output_mode == "shared"


def test_a_full_chief_host_moves_the_evaluator_in_auto_and_refuses_per_host() -> None:
    # 3 slots a host: node1 holds ps/0, worker/0 and worker/3
    auto = _plan("cluster.workers=4", slots=3)
    assert _hosts(auto)["worker/0"] == "node1" and _hosts(auto)["evaluator/0"] != "node1"
    with pytest.raises(PlanError) as err:
        _plan("cluster.workers=4", "cluster.output_mode=per_host", slots=3)
    assert str(err.value) == (
        "cluster.hosts[0].cpu_slots: no free slot for evaluator/0 on node1, the chief's host: "
        "with cluster.output_mode=per_host the evaluator reads the chief's checkpoints there; "
        "give node1 one more slot"
    )


def test_bad_modes_and_backends_without_per_host_output_are_one_line_errors() -> None:
    with pytest.raises(ConfigError) as unknown:
        _plan("cluster.output_mode=nfs")
    assert str(unknown.value).startswith("cluster.output_mode: unknown mode 'nfs'")
    for cluster in ("slurm", "k8s"):
        cfg = copy.deepcopy(_composed((f"cluster={cluster}", "cluster.output_mode=per_host")))
        with pytest.raises(ConfigError) as err:
            make_plan(cfg, None, CTX)
        message = str(err.value)
        assert message.startswith("cluster.output_mode: per_host, but the ") and "\n" not in message


# ---- moving files ----------------------------------------------------------------------------
def _local() -> LocalTransport:
    return LocalTransport(HostTarget(name="here", address="127.0.0.1", kind="local"))


def test_markers_keep_the_first_writers_content(tmp_path: Path) -> None:
    with _local() as host:
        first = host.shared_marker(str(tmp_path / "out"), "tok")
        second = host.shared_marker(str(tmp_path / "out"), "tok")
    assert first == second and first.startswith("here ")
    assert (tmp_path / "out" / ".tfplan-shared-tok").read_text() == first


def test_fetch_leaves_checkpoints_markers_and_the_record_behind(tmp_path: Path) -> None:
    out = tmp_path / "out"
    keep = ["result.json", "eval/metrics.jsonl", "eval/events.out.tfevents.1.h", "events.x"]
    leave = [
        "checkpoint",
        "model.ckpt-40.index",
        "model.ckpt-40.data-00000-of-00001",
        "model.ckpt-40.meta",
        "ckpt-3.index",
        ".tfplan-shared-abc",
        "result.json.tmp.99",
        "tfplan/experiment.json",
    ]
    for name in keep + leave:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(name)
    with _local() as host:
        assert host.get_tree(str(tmp_path / "missing"), FETCH_SKIP, ("tfplan",)) is None
        data = host.get_tree(str(out), FETCH_SKIP, ("tfplan",), FETCH_MAX_KIB)
        big = host.get_tree(str(out), FETCH_SKIP, ("tfplan",), max_kib=0)
    assert data is not None and big is not None
    dest = tmp_path / "dest"
    assert unpack_tree(data, dest) == len(keep)
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == sorted(keep)
    assert (dest / "eval" / "metrics.jsonl").read_text() == "eval/metrics.jsonl"
    assert unpack_tree(big, tmp_path / "none") == 0  # every file is over a 0 KiB limit


def test_unpack_writes_nothing_outside_its_folder(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in ("../evil", "ok/fine", "/abs"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        link = tarfile.TarInfo("ok/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    dest = tmp_path / "d" / "dest"
    assert unpack_tree(buffer.getvalue(), dest) == 1
    assert (dest / "ok" / "fine").read_bytes() == b"x"
    assert not (tmp_path / "d" / "evil").exists() and not (dest / "ok" / "link").exists()
