"""Shared pytest fixtures. Real servers: see tests/testbed.py.

- ``sshd_server`` (session): a :class:`~testbed.LoopbackSshd` (real sshd on 127.0.0.1).
- ``sshd_target`` (session): a HostTarget (kind="ssh") for it, with key and known_hosts.
- ``netns_testbed`` (session): a :class:`~testbed.NetnsTestbed`, three namespaces.
- ``netns_hosts`` (session): its three HostTargets (h1, h2, h3).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from testbed import LoopbackSshd, NetnsTestbed  # tests/ is on sys.path (no __init__.py)

from tfplan.backends.transports.specs import HostTarget


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSshd]:
    if shutil.which("sshd") is None and not os.path.exists("/usr/sbin/sshd"):
        pytest.fail("sshd is not installed: apt-get install -y openssh-server (CI does)")
    server = LoopbackSshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sshd_target(sshd_server: LoopbackSshd) -> HostTarget:
    return sshd_server.target()


@pytest.fixture(scope="session")
def netns_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsTestbed]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    testbed = NetnsTestbed(tmp_path_factory.mktemp("netns"))
    try:
        try:
            testbed.setup()
        except Exception as exc:  # noqa: BLE001 - we are root: this must fail, loudly
            pytest.fail(f"could not build the 3-host netns testbed as root: {exc}")
        yield testbed
    finally:
        problems = testbed.teardown()
        if problems:
            print("netns teardown problems:", "; ".join(problems))


@pytest.fixture(scope="session")
def netns_hosts(netns_testbed: NetnsTestbed) -> list[HostTarget]:
    return netns_testbed.targets()
