"""tfplan.backends.firewall: the generated rules, and the real thing in network namespaces.

The namespace tests build their own private network (see TESTBED.md for the recipe): a
"switch" namespace holding a bridge, and three hosts on it, each in its own namespace:

    A 10.78.0.11 / fd78::11   a cluster host; the listener (ports P1, P2 protected, Q not)
    B 10.78.0.12 / fd78::12   a cluster host
    C 10.78.0.13 / fd78::13   not in the cluster

Nothing is in the root namespace: no address, no route, no rule (the bridge lives in the
switch namespace, so not even bridged traffic passes the root namespace's netfilter hooks).
Every nft / iptables command runs inside A via ``ip netns exec``. Names carry the PID; the
module fixture deletes the namespaces and ends its processes by PID.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tfplan.backends.firewall import (
    BACKENDS,
    DETECT_MARK,
    INSTALLED_MARK,
    LOOPBACK,
    REMOVED_MARK,
    Backend,
    FirewallSupport,
    HostFirewall,
    cluster_firewalls,
    detect_script,
    firewall_name,
    install_script,
    parse_detect,
    remove_script,
)
from tfplan.errors import BackendError, ConfigError

# --- the generated rules (no root needed) -------------------------------------------------------


def test_name_is_sanitised_bounded_and_distinct() -> None:
    assert firewall_name("mnist") == firewall_name("mnist")
    assert re.fullmatch(r"tfplan_mnist_[0-9a-f]{8}", firewall_name("mnist"))
    weird = ["Mnist", "mnist!", "a" * 200, "ä/ö;rm -rf /", "$(reboot)", "x\ny", "---", "名前"]
    names = [firewall_name(e) for e in weird]
    for name in names:
        assert re.fullmatch(r"tfplan_[a-z0-9_]+", name), name
        assert len(name) <= 28, name  # iptables' chain-name limit
        assert "__" not in name
    # ids that sanitise (or truncate) alike still get their own table
    assert len({*names, firewall_name("mnist")}) == len(weird) + 1
    assert firewall_name("a" * 200) != firewall_name("a" * 199)


def test_host_firewall_normalises() -> None:
    fw = HostFirewall(
        "exp",
        "h1",
        ("10.0.0.12", "10.0.0.11", " fd00::0002 ", "::ffff:10.0.0.13", "10.0.0.11"),
        (2223, 2222, 2222),
    )
    assert fw.allowed == ("10.0.0.11", "10.0.0.12", "10.0.0.13", "127.0.0.1", "::1", "fd00::2")
    assert fw.allowed_v4 == ("10.0.0.11", "10.0.0.12", "10.0.0.13", "127.0.0.1")
    assert fw.allowed_v6 == ("::1", "fd00::2")
    assert fw.ports == (2222, 2223)
    assert set(LOOPBACK) <= set(fw.allowed)
    # normalised: two spellings of the same rules are equal (and hash alike)
    assert fw == HostFirewall("exp", "h1", fw.allowed, (2222, 2223))
    with pytest.raises(AttributeError):
        fw.ports = (1,)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("allowed", "ports", "needle"),
    [
        (["node2.lan"], [2222], "'node2.lan' is not an IP address"),
        (["10.0.0.300"], [2222], "not an IP address"),
        (["fe80::1%eth0"], [2222], "scoped IPv6"),
        (["0.0.0.0"], [2222], "not a host address"),
        (["224.0.0.1"], [2222], "not a host address"),
        ([10], [2222], "not an IP address"),
        (["10.0.0.1"], [0], "port 0 is not a TCP port"),
        (["10.0.0.1"], [65536], "port 65536"),
        (["10.0.0.1"], [True], "port True"),
        (["10.0.0.1"], ["2222"], "port '2222'"),
        ("10.0.0.1", [2222], "must be lists"),
    ],
)
def test_host_firewall_rejects_bad_input_in_one_line(
    allowed: Sequence[object], ports: Sequence[object], needle: str
) -> None:
    with pytest.raises(ConfigError) as err:
        HostFirewall("exp", "h1", allowed, ports)  # type: ignore[arg-type]
    message = str(err.value)
    assert needle in message and message.startswith("cluster.firewall: ")
    assert "\n" not in message


def test_empty_ids_are_refused() -> None:
    for experiment, host in (("", "h1"), ("  ", "h1"), ("exp", "")):
        with pytest.raises(ConfigError, match="empty"):
            HostFirewall(experiment, host, ("10.0.0.1",), (1,))


def test_describe_for_the_plan() -> None:
    fw = HostFirewall("exp", "h1", ("10.0.0.13", "10.0.0.11", "10.0.0.12"), (2222, 2223, 2230))
    assert fw.describe() == (
        f"host h1: admit 10.0.0.11, 10.0.0.12, 10.0.0.13 and loopback to tcp 2222-2223, 2230; "
        f"drop others ({fw.name})"
    )
    assert fw.describe("nft").endswith(f"(nft table inet {fw.name})")
    assert fw.describe("iptables").endswith(f"(iptables chain {fw.name})")
    assert "loopback only" in HostFirewall("exp", "h1", (), (1,)).describe()
    assert "no listening ports" in HostFirewall("exp", "h3", ("10.0.0.1",), ()).describe()


def test_cluster_firewalls_admit_every_host_and_keep_each_hosts_ports() -> None:
    tasks = [
        ("h1", "10.0.0.11", 2222),
        ("h1", "10.0.0.11", 2223),
        ("h2", "10.0.0.12", 2224),
        ("h3", "10.0.0.13", None),  # an evaluator: no port, but its host must be admitted
    ]
    rules = cluster_firewalls("exp", tasks)
    assert sorted(rules) == ["h1", "h2", "h3"]
    assert rules["h1"].ports == (2222, 2223) and rules["h2"].ports == (2224,)
    assert rules["h3"].ports == ()
    for fw in rules.values():
        assert fw.allowed_v4 == ("10.0.0.11", "10.0.0.12", "10.0.0.13", "127.0.0.1")


def test_nft_ruleset_only_ever_matches_the_ports() -> None:
    fw = HostFirewall("exp", "h1", ("10.0.0.11", "fd00::2"), (2222, 2230))
    text = fw.nft_ruleset()
    # replace atomically: the add/delete pair makes "delete" valid when the table is absent
    assert text.startswith(f"add table inet {fw.name}\ndelete table inet {fw.name}\n")
    assert "type filter hook input priority -10; policy accept;" in text
    assert "elements = { 2222, 2230 }" in text
    assert "elements = { 10.0.0.11, 127.0.0.1 }" in text
    assert "elements = { ::1, fd00::2 }" in text
    rules = [line.strip() for line in text.splitlines() if line.startswith("\t\t")][1:]
    assert rules[-1] == "tcp dport @ports counter drop"
    assert all("tcp dport @ports" in rule for rule in rules), rules  # other traffic untouched
    assert sum("drop" in rule for rule in rules) == 1
    with pytest.raises(ValueError):
        HostFirewall("exp", "h1", (), ()).nft_ruleset()


def test_iptables_rules_and_jumps() -> None:
    fw = HostFirewall("exp", "h1", ("10.0.0.11", "fd00::2"), (2222, 2223, 2230))
    v4 = fw.iptables_restore(4).splitlines()
    assert v4[:3] == ["*filter", f":{fw.name} - [0:0]", f"-A {fw.name} -i lo -j RETURN"]
    assert f"-A {fw.name} -s 10.0.0.11/32 -j RETURN" in v4
    assert not any("fd00" in line for line in v4)
    assert v4[-2:] == [f"-A {fw.name} -j DROP", "COMMIT"]
    v6 = fw.iptables_restore(6)
    assert "-s fd00::2/128 -j RETURN" in v6 and "10.0.0.11" not in v6
    assert fw.iptables_jumps() == ("2222:2223,2230",)
    # multiport takes 15 ports at most, a range counting two
    many = HostFirewall("exp", "h1", (), tuple(range(3000, 3040, 2)) + (4000, 4001))
    jumps = many.iptables_jumps()
    assert [len(j.split(",")) + j.count(":") for j in jumps] == [15, 7]
    assert jumps[-1].endswith(",4000:4001")
    split = HostFirewall("exp", "h1", (), tuple(range(3000, 3028, 2)) + (4000, 4001))
    assert [len(j.split(",")) for j in split.iptables_jumps()] == [14, 1]  # 14 + a range > 15
    assert {int(p) for j in jumps for part in j.split(",") for p in part.split(":")} == set(
        many.ports
    )


def test_scripts_are_posix_sh() -> None:
    fw = HostFirewall("my exp", "h1", ("10.0.0.11",), (2222,))
    scripts = [detect_script(), remove_script("my exp")]
    scripts += [install_script(fw, b) for b in ("nft", "iptables")]
    for script in scripts:
        for shell in ("sh", "dash", "bash"):
            if shutil.which(shell):
                done = subprocess.run([shell, "-n", "-c", script], capture_output=True, text=True)
                assert done.returncode == 0, (shell, done.stderr)
        assert "my exp" not in script  # only the sanitised name reaches the shell
    assert install_script(HostFirewall("my exp", "h1", (), ()), "nft") == remove_script("my exp")
    with pytest.raises(ConfigError, match="unknown firewall backend"):
        install_script(fw, "ufw")  # type: ignore[arg-type]


def _line(**kw: str) -> str:
    fields = dict(root="1", uid="0", nft="ok", iptables="ok", ip6tables="ok", ipv6="1") | kw
    return f"{DETECT_MARK} " + " ".join(f"{k}={v}" for k, v in fields.items())


@pytest.mark.parametrize(
    ("fields", "backend", "needle"),
    [
        ({}, "nft", None),
        ({"nft": "missing"}, "iptables", None),
        ({"nft": "unusable", "ip6tables": "missing", "ipv6": "0"}, "iptables", None),
        ({"nft": "missing", "ip6tables": "missing"}, None, "ip6tables is missing while IPv6"),
        ({"nft": "missing", "iptables": "missing"}, None, "nft is missing, iptables is missing"),
        ({"nft": "unusable", "iptables": "unusable"}, None, "nft is installed but cannot list"),
        ({"root": "0", "uid": "1000"}, None, "not root (uid 1000)"),
    ],
)
def test_parse_detect(fields: dict[str, str], backend: str | None, needle: str | None) -> None:
    support = parse_detect(f"motd noise\n{_line(**fields)}\n")
    assert support.backend == backend
    if needle is None:
        assert support.problem is None
    else:
        assert support.problem is not None and needle in support.problem
        assert "\n" not in support.problem and "cluster.firewall=false" in support.problem


@pytest.mark.parametrize(
    "output", ["", "hello\n", f"{DETECT_MARK} root=1\n", _line(nft="maybe"), _line(uid="x")]
)
def test_parse_detect_refuses_garbage(output: str) -> None:
    with pytest.raises(BackendError) as err:
        parse_detect(output)
    assert "\n" not in str(err.value)


# --- the real thing: namespaces, kernel rules ---------------------------------------------------

NETNS = pytest.mark.netns
P1, P2, Q = 2222, 2223, 2300  # P1, P2 protected; Q a port of A that the rules must not touch
HOSTS = {
    "a": ("10.78.0.11", "fd78::11"),
    "b": ("10.78.0.12", "fd78::12"),
    "c": ("10.78.0.13", "fd78::13"),
}
CONNECT_TIMEOUT = 1.0  # a handshake on a local bridge takes well under a millisecond

LISTENER = """
import socket, sys, threading
socks = []
for port in map(int, sys.argv[1:]):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # like gRPC: [::], IPv4 too
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::", port))
    s.listen(64)
    socks.append(s)
def serve(s):
    while True:
        conn, _ = s.accept()
        conn.close()
for s in socks:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()  # until the test closes stdin (or ends us by PID)
"""

PROBE = """
import json, socket, sys, threading
timeout = float(sys.argv[1])
result = {}
def probe(target):
    host, port = target.rsplit(",", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
        result[target] = "ok"
    except socket.timeout:
        result[target] = "timeout"
    except ConnectionRefusedError:
        result[target] = "refused"
    except OSError as exc:
        result[target] = "error:%s" % exc.errno
threads = [threading.Thread(target=probe, args=(t,)) for t in sys.argv[2:]]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(result))
"""


def _run(
    argv: Sequence[str], timeout: float = 30, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env) if env is not None else None,
    )


@dataclass
class Bed:
    """The namespaces of one test module run; ``ns[x]`` for x in s (switch), a, b, c."""

    ns: dict[str, str]
    tmp: Path
    listener: subprocess.Popen[str] | None = None

    def sh(
        self, host: str, script: str, env: Mapping[str, str] | None = None, wrap: Sequence[str] = ()
    ) -> subprocess.CompletedProcess[str]:
        """Run ``sh -c script`` in a host's namespace (``wrap``: argv put before ``sh``)."""
        return _run(
            ["ip", "netns", "exec", self.ns[host], *wrap, "sh", "-c", script],
            env=env,
        )

    def ok(self, host: str, script: str, env: Mapping[str, str] | None = None) -> str:
        done = self.sh(host, script, env)
        assert done.returncode == 0, f"rc={done.returncode} stdout={done.stdout} {done.stderr}"
        return done.stdout

    def probe(self, targets: Mapping[str, Sequence[tuple[str, int]]]) -> dict[str, str]:
        """Connect from each namespace to its targets, all at once: {"b->10.78.0.11:2222": ...}."""
        procs = {
            src: subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.ns[src],
                    sys.executable,
                    "-c",
                    PROBE,
                    str(CONNECT_TIMEOUT),
                    *(f"{h},{p}" for h, p in dests),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for src, dests in targets.items()
        }
        out: dict[str, str] = {}
        for src, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=30)
            assert proc.returncode == 0, stderr
            for target, result in json.loads(stdout).items():
                host, port = target.rsplit(",", 1)
                out[f"{src}->{host}:{port}"] = result
        return out

    def ruleset(self, host: str = "a") -> str:
        """Every rule in the namespace: nftables (iptables-nft's included) and legacy tables,
        without counters and comments, for before/after comparisons."""
        text = self.ok(host, "nft -s list ruleset")
        for tool in ("iptables-legacy-save", "ip6tables-legacy-save"):
            if shutil.which(tool):
                text += self.ok(host, tool)
        lines = [re.sub(r"\[\d+:\d+\]", "", ln) for ln in text.splitlines()]
        return "\n".join(ln for ln in lines if ln.strip() and not ln.startswith("#"))

    def reset(self, host: str = "a") -> None:
        """Empty the namespace's firewall (ours alone: the namespace is this run's)."""
        script = "nft flush ruleset"
        for tool in ("iptables-legacy", "ip6tables-legacy"):
            if shutil.which(tool):
                script += f" && {tool} -w -F && {tool} -w -X"
        self.ok(host, script)


def _make_bed(tmp: Path) -> tuple[Bed, list[str]]:
    prefix = f"tfpfw{os.getpid()}"
    bed = Bed(ns={x: f"{prefix}{x}" for x in "sabc"}, tmp=tmp)
    made: list[str] = []

    def ip(*args: str) -> None:
        done = _run(["ip", *args])
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    try:
        for ns in bed.ns.values():
            ip("netns", "add", ns)
            made.append(ns)
        sw = bed.ns["s"]
        ip("-n", sw, "link", "add", "br0", "type", "bridge")
        ip("-n", sw, "link", "set", "br0", "up")
        for host, (v4, v6) in HOSTS.items():
            ns = bed.ns[host]
            ip(
                "-n",
                sw,
                "link",
                "add",
                f"v{host}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            ip("-n", sw, "link", "set", f"v{host}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{v4}/24", "dev", "eth0")
            ip("-n", ns, "addr", "add", f"{v6}/64", "dev", "eth0", "nodad")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
    except BaseException:
        _teardown(bed, made)
        raise
    return bed, made


def _teardown(bed: Bed, made: list[str]) -> None:
    if bed.listener is not None and bed.listener.poll() is None:
        bed.listener.kill()
        bed.listener.wait(10)
    for ns in reversed(made):
        # anything a test left running in the namespace would keep it alive: end it by PID
        for pid in _run(["ip", "netns", "pids", ns]).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _run(["ip", "netns", "del", ns])


def _wait_ready(proc: subprocess.Popen[str], what: str, deadline_s: float) -> None:
    """Wait for the process to print "ready" (the event), or fail at the deadline."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + deadline_s
        while (left := deadline - time.monotonic()) > 0:
            if sel.select(left):
                line = proc.stdout.readline()
                if line.strip() == "ready":
                    return
                if line == "":
                    break
    proc.kill()
    _, err = proc.communicate(timeout=10)
    raise RuntimeError(f"{what} did not get ready in {deadline_s}s: rc={proc.returncode} {err}")


@pytest.fixture(scope="module")
def fwbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces and firewall rules need root (CI runs as root)")
    missing = [t for t in ("ip", "nft", "iptables") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run scripts/setup.sh (installs them)")
    run_netns = Path("/run/netns")
    made_run_netns = not run_netns.exists()
    made: list[str] = []
    bed: Bed | None = None
    try:
        try:
            bed, made = _make_bed(tmp_path_factory.mktemp("fw"))
        except Exception as exc:  # noqa: BLE001 - we are root: this must fail, loudly
            pytest.fail(f"could not build the firewall test namespaces as root: {exc}")
        bed.listener = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                bed.ns["a"],
                sys.executable,
                "-u",
                "-c",
                LISTENER,
                str(P1),
                str(P2),
                str(Q),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_ready(bed.listener, "the listener in A", 30)
        # the links come up asynchronously: wait (with a deadline) until B and C reach A
        deadline = time.monotonic() + 20
        while True:
            got = bed.probe(
                {"b": [(HOSTS["a"][0], Q), (HOSTS["a"][1], Q)], "c": [(HOSTS["a"][0], Q)]}
            )
            if set(got.values()) == {"ok"}:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"the test network does not work: {got}")
            time.sleep(0.1)
        yield bed
    finally:
        if bed is not None:
            _teardown(bed, made)
        if made_run_netns and run_netns.exists() and not any(run_netns.iterdir()):
            _run(["umount", str(run_netns)])
            try:
                run_netns.rmdir()
            except OSError:
                pass


@pytest.fixture
def bed(fwbed: Bed) -> Iterator[Bed]:
    fwbed.reset()
    try:
        yield fwbed
    finally:
        fwbed.reset()


# Which tools a variant's scripts find first on PATH (the scripts append the sbin folders, so a
# folder put before them wins). "nft" uses the machine's own tools.
VARIANTS = {
    "nft": None,
    "iptables-nft": "xtables-nft-multi",
    "iptables-legacy": "xtables-legacy-multi",
}
IPT_TOOLS = (
    "iptables",
    "ip6tables",
    "iptables-restore",
    "ip6tables-restore",
    "iptables-save",
    "ip6tables-save",
)


def _variant_env(variant: str, tmp: Path) -> dict[str, str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    multi = VARIANTS[variant]
    if multi is None:
        return env
    real = shutil.which(multi) or next(
        (p for p in (f"/usr/sbin/{multi}", f"/sbin/{multi}") if os.path.exists(p)), None
    )
    if real is None:
        pytest.skip(f"{multi} is not installed: the {variant} variant cannot be tested here")
    tools = tmp / f"tools-{variant}"
    tools.mkdir(exist_ok=True)
    for name in IPT_TOOLS:
        link = tools / name
        if not link.exists():
            link.symlink_to(real)  # the multi binary picks its mode from argv[0]'s name
    env["PATH"] = f"{tools}:{env['PATH']}"
    return env


def _backend(variant: str) -> Backend:
    return "nft" if variant == "nft" else "iptables"


A4, A6 = HOSTS["a"]
B4, B6 = HOSTS["b"]
C4, C6 = HOSTS["c"]
MATRIX = {
    "b": [(A4, P1), (A6, P1), (A4, P2), (A4, Q)],
    "c": [(A4, P1), (A6, P1), (A4, P2), (A4, Q)],
    "a": [("127.0.0.1", P1), ("::1", P1), (A4, P1), (A6, P2)],
}
OPEN = {f"{src}->{h}:{p}": "ok" for src, dests in MATRIX.items() for h, p in dests}
GUARDED = OPEN | {f"c->{h}:{p}": "timeout" for h, p in [(A4, P1), (A6, P1), (A4, P2)]}


def _cluster(experiment: str = "fw test", ports: Sequence[int] = (P1, P2)) -> HostFirewall:
    """A's rules for a cluster of A and B (both families); C is the outsider."""
    return HostFirewall(experiment, "a", (A4, A6, B4, B6), tuple(ports))


@NETNS
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_outsider_is_dropped_cluster_and_loopback_pass_until_removed(
    bed: Bed, variant: str, tmp_path: Path
) -> None:
    env = _variant_env(variant, tmp_path)
    fw = _cluster()
    if variant != "nft":
        # iptables-nft keeps the filter table and INPUT chain it makes: make them beforehand,
        # so that "as before" below means exactly the same rules
        bed.ok("a", "iptables -w -P INPUT ACCEPT && ip6tables -w -P INPUT ACCEPT", env)
    empty = bed.ruleset()
    assert bed.probe(MATRIX) == OPEN  # the control: without rules C gets through

    out = bed.ok("a", install_script(fw, _backend(variant)), env)
    assert out.strip() == (
        f"{INSTALLED_MARK} backend={_backend(variant)} name={fw.name} ports=2222-2223 ipv6=1"
    )
    installed = bed.ruleset()
    assert fw.name in installed
    assert bed.probe(MATRIX) == GUARDED

    # idempotent: a second install leaves exactly the same rules, still in force
    bed.ok("a", install_script(fw, _backend(variant)), env)
    assert bed.ruleset() == installed
    assert bed.probe({"c": [(A4, P1)], "b": [(A4, P1)]}) == {
        f"c->{A4}:{P1}": "timeout",
        f"b->{A4}:{P1}": "ok",
    }

    out = bed.ok("a", remove_script(fw.experiment), env)
    gone = "removed" if variant == "nft" else "absent"
    kept = "absent" if variant == "nft" else "removed"
    assert out.strip() == (
        f"{REMOVED_MARK} name={fw.name} nft={gone} iptables={kept} ip6tables={kept}"
    )
    assert bed.ruleset() == empty
    assert bed.probe(MATRIX) == OPEN

    # removing what is not there is fine, and says so
    out = bed.ok("a", remove_script(fw.experiment), env)
    assert "nft=absent iptables=absent ip6tables=absent" in out


@NETNS
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_host_firewall_that_accepts_everything_does_not_let_outsiders_in(
    bed: Bed, variant: str, tmp_path: Path
) -> None:
    env = _variant_env(variant, tmp_path)
    if variant == "nft":
        host_rules = (
            "nft -f - <<'EOF'\ntable inet host {\n chain input {\n"
            "  type filter hook input priority 0; policy accept;\n"
            f"  tcp dport {P1} accept\n  accept\n }}\n}}\nEOF\n"
            # and legacy iptables rules beside it (both run on one kernel)
            f"iptables-legacy -w -I INPUT -p tcp --dport {P1} -j ACCEPT"
        )
    else:
        host_rules = (
            f"iptables -w -A INPUT -p tcp --dport {P1} -j ACCEPT && iptables -w -A INPUT -j ACCEPT"
            f" && ip6tables -w -A INPUT -p tcp --dport {P1} -j ACCEPT"
        )
    bed.ok("a", host_rules, env)
    before = bed.ruleset()
    fw = _cluster()
    bed.ok("a", install_script(fw, _backend(variant)), env)
    assert bed.probe({"c": [(A4, P1), (A6, P1)], "b": [(A4, P1)]}) == {
        f"c->{A4}:{P1}": "timeout",
        f"c->{A6}:{P1}": "timeout",
        f"b->{A4}:{P1}": "ok",
    }
    bed.ok("a", remove_script(fw.experiment), env)
    assert bed.ruleset() == before  # the host's own rules are as they were
    assert bed.probe({"c": [(A4, P1)]}) == {f"c->{A4}:{P1}": "ok"}


@NETNS
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_reinstall_with_other_ports_moves_the_rules(bed: Bed, variant: str, tmp_path: Path) -> None:
    env = _variant_env(variant, tmp_path)
    backend = _backend(variant)
    bed.ok("a", install_script(_cluster(ports=(P1, P2)), backend), env)
    bed.ok("a", install_script(_cluster(ports=(Q,)), backend), env)
    assert bed.probe({"c": [(A4, P1), (A4, P2), (A4, Q)]}) == {
        f"c->{A4}:{P1}": "ok",
        f"c->{A4}:{P2}": "ok",
        f"c->{A4}:{Q}": "timeout",
    }
    if backend == "iptables":
        name = _cluster().name
        for tool in ("iptables", "ip6tables"):
            jumps = [r for r in bed.ok("a", f"{tool} -w -S INPUT", env).splitlines() if name in r]
            assert jumps == [f"-A INPUT -p tcp -m multiport --dports {Q} -j {name}"], jumps
    # a host left without ports keeps no rules
    bed.ok("a", install_script(_cluster(ports=()), backend), env)
    assert _cluster().name not in bed.ruleset()
    assert bed.probe({"c": [(A4, Q)]}) == {f"c->{A4}:{Q}": "ok"}


@NETNS
def test_switching_backend_leaves_only_the_new_rules(bed: Bed, tmp_path: Path) -> None:
    env = _variant_env("iptables-nft", tmp_path)
    fw = _cluster()
    bed.ok("a", install_script(fw, "iptables"), env)
    out = bed.ok("a", install_script(fw, "nft"), env)
    assert INSTALLED_MARK in out
    rules = bed.ok("a", "nft -s list ruleset")
    assert f"table inet {fw.name}" in rules and f"jump {fw.name}" not in rules
    assert bed.probe({"c": [(A4, P1)], "b": [(A4, P1)]}) == {
        f"c->{A4}:{P1}": "timeout",
        f"b->{A4}:{P1}": "ok",
    }
    bed.ok("a", install_script(fw, "iptables"), env)
    rules = bed.ok("a", "nft -s list ruleset")
    assert f"table inet {fw.name}" not in rules and f"jump {fw.name}" in rules
    assert bed.probe({"c": [(A4, P1)]}) == {f"c->{A4}:{P1}": "timeout"}


@NETNS
def test_two_experiments_on_one_host_are_independent(bed: Bed) -> None:
    one, two = _cluster("exp one", (P1,)), _cluster("exp two", (Q,))
    bed.ok("a", install_script(one, "nft"))
    bed.ok("a", install_script(two, "nft"))
    assert bed.probe({"c": [(A4, P1), (A4, Q), (A4, P2)]}) == {
        f"c->{A4}:{P1}": "timeout",
        f"c->{A4}:{Q}": "timeout",
        f"c->{A4}:{P2}": "ok",
    }
    bed.ok("a", remove_script(one.experiment))
    assert bed.probe({"c": [(A4, P1), (A4, Q)]}) == {
        f"c->{A4}:{P1}": "ok",
        f"c->{A4}:{Q}": "timeout",
    }


# --- detection: what the host can do ------------------------------------------------------------

# Runs the script with /usr/sbin (and /usr/local/sbin) replaced by a folder holding only the
# named tools, in a private mount namespace: a host where the rest is not installed.
MASK = """
set -e
real=$1; script=$2; shift 2
mount --bind /usr/sbin "$real"
mount -t tmpfs tfplan-test /usr/sbin
mount -t tmpfs tfplan-test /usr/local/sbin
for tool in "$@"; do ln -s "$real/${tool#*=}" "/usr/sbin/${tool%%=*}"; done
exec sh -c "$script"
"""


def _masked(
    bed: Bed, tmp: Path, script: str, tools: Sequence[str]
) -> subprocess.CompletedProcess[str]:
    real = tmp / "real-sbin"
    real.mkdir(exist_ok=True)
    return _run(
        [
            "ip",
            "netns",
            "exec",
            bed.ns["a"],
            "unshare",
            "-m",
            "--",
            "sh",
            "-c",
            MASK,
            "mask",
            str(real),
            script,
            *tools,
        ],
        env={"PATH": "/usr/bin:/bin"},
    )


def _support(done: subprocess.CompletedProcess[str]) -> FirewallSupport:
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1, done.stdout  # one parseable line
    return parse_detect(done.stdout)


NFT_MULTI = [f"{t}=xtables-nft-multi" for t in IPT_TOOLS]


@NETNS
def test_detect_as_root_with_every_tool(bed: Bed) -> None:
    before = bed.ruleset()
    support = _support(bed.sh("a", detect_script(), env={"PATH": "/usr/bin:/bin"}))
    assert support == FirewallSupport(
        root=True, uid=0, nft="ok", iptables="ok", ip6tables="ok", ipv6=True
    )
    assert support.backend == "nft" and support.problem is None
    assert bed.ruleset() == before  # detection changed nothing


@NETNS
def test_detect_without_any_tool_and_the_scripts_then(bed: Bed, tmp_path: Path) -> None:
    support = _support(_masked(bed, tmp_path, detect_script(), []))
    assert (support.nft, support.iptables, support.ip6tables) == ("missing",) * 3
    assert support.backend is None
    assert support.problem is not None and "nft is missing, iptables is missing" in support.problem
    fw = _cluster()
    for backend in BACKENDS:
        done = _masked(bed, tmp_path, install_script(fw, backend), [])
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("tfplan-firewall: error:")
        assert "not found" in done.stderr
    done = _masked(bed, tmp_path, remove_script(fw.experiment), [])
    assert done.returncode == 0, done.stderr
    assert "nft=missing iptables=missing ip6tables=missing" in done.stdout


@NETNS
def test_a_host_with_only_iptables_gets_the_iptables_backend(bed: Bed, tmp_path: Path) -> None:
    support = _support(_masked(bed, tmp_path, detect_script(), NFT_MULTI))
    assert (support.nft, support.iptables, support.ip6tables) == ("missing", "ok", "ok")
    assert support.backend == "iptables"
    fw = _cluster()
    done = _masked(bed, tmp_path, install_script(fw, "iptables"), NFT_MULTI)
    assert done.returncode == 0, done.stderr
    assert bed.probe({"c": [(A4, P1), (A6, P1)], "b": [(A6, P1)]}) == {
        f"c->{A4}:{P1}": "timeout",
        f"c->{A6}:{P1}": "timeout",
        f"b->{A6}:{P1}": "ok",
    }
    done = _masked(bed, tmp_path, remove_script(fw.experiment), NFT_MULTI)
    assert done.returncode == 0 and "nft=missing iptables=removed ip6tables=removed" in done.stdout
    # without ip6tables, IPv6 would stay open: detection and install refuse
    v4_only = [t for t in NFT_MULTI if not t.startswith("ip6")]
    support = _support(_masked(bed, tmp_path, detect_script(), v4_only))
    assert support.backend is None and support.problem is not None
    assert "ip6tables is missing while IPv6 is on" in support.problem
    done = _masked(bed, tmp_path, install_script(fw, "iptables"), v4_only)
    assert done.returncode == 1 and "IPv6 is on but ip6tables is missing" in done.stderr


@NETNS
def test_detect_and_install_as_a_plain_user(bed: Bed) -> None:
    user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    env = {"PATH": "/usr/bin:/bin"}
    support = _support(bed.sh("a", detect_script(), env, wrap=user))
    assert not support.root and support.uid == 65534 and support.backend is None
    assert support.problem is not None and support.problem.startswith("not root (uid 65534)")
    for script in (install_script(_cluster(), "nft"), remove_script("fw test")):
        done = bed.sh("a", script, env, wrap=user)
        assert done.returncode == 1 and done.stderr.startswith("tfplan-firewall: error: not root")


@NETNS
def test_detect_as_root_of_a_user_namespace_finds_the_tools_unusable(bed: Bed) -> None:
    # uid 0 without CAP_NET_ADMIN over the network namespace, as in a rootless container
    support = _support(
        bed.sh("a", detect_script(), {"PATH": "/usr/bin:/bin"}, wrap=["unshare", "-r"])
    )
    assert support.root and support.uid == 0
    assert support.nft == "unusable" and support.iptables == "unusable"
    assert support.problem is not None and "cannot list rules" in support.problem


# --- a real TensorFlow ps task ------------------------------------------------------------------

TF_PS = """
import sys
import tensorflow as tf
spec = tf.train.ClusterSpec({"ps": [sys.argv[1]], "worker": [sys.argv[2]]})
server = tf.distribute.Server(spec, job_name="ps", task_index=0, protocol="grpc", start=True)
print("ready", flush=True)
sys.stdin.read()
"""

TF_WORKER = """
import sys
import tensorflow as tf
spec = tf.train.ClusterSpec({"ps": [sys.argv[1]], "worker": [sys.argv[2]]})
tf.config.experimental_connect_to_cluster(spec, job_name="worker", task_index=0)
with tf.device("/job:ps/task:0"):
    v = tf.Variable(41.0)
v.assign_add(1.0)
print("value", float(v.numpy()), flush=True)
"""


@pytest.mark.full  # the fast tier: test_firewall_apply.py's apply story
@NETNS
@pytest.mark.cluster
def test_a_real_ps_task_serves_the_cluster_but_not_an_outsider(bed: Bed) -> None:
    ps_port, worker_port = 2400, 2401
    ps, worker = f"{A4}:{ps_port}", f"{B4}:{worker_port}"
    fw = cluster_firewalls("tf test", [("a", A4, ps_port), ("b", B4, worker_port)])
    bed.ok("a", install_script(fw["a"], "nft"))
    server = subprocess.Popen(
        ["ip", "netns", "exec", bed.ns["a"], sys.executable, "-u", "-c", TF_PS, ps, worker],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_ready(server, "the TensorFlow ps task in A", 180)
        assert bed.probe({"c": [(A4, ps_port)], "b": [(A4, ps_port)]}) == {
            f"c->{A4}:{ps_port}": "timeout",
            f"b->{A4}:{ps_port}": "ok",
        }
        # a real worker in B runs ops on the ps through the rules
        done = _run(
            ["ip", "netns", "exec", bed.ns["b"], sys.executable, "-c", TF_WORKER, ps, worker],
            timeout=180,
        )
        assert done.returncode == 0 and "value 42.0" in done.stdout, done.stderr[-3000:]
        bed.ok("a", remove_script("tf test"))
        assert bed.probe({"c": [(A4, ps_port)]}) == {f"c->{A4}:{ps_port}": "ok"}
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate(timeout=30)
