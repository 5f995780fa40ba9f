"""Host firewall rules that admit only the cluster's own addresses to the planned ports.

TensorFlow's gRPC servers listen on every interface with no authentication. With
``cluster.firewall=true`` each host gets rules that drop TCP packets to the ports its tasks
listen on unless they come from a cluster host's address or from loopback. Nothing else is
touched: other ports, other protocols and the host's own rules stay as they are, and the rules
only ever *drop*; they never admit what the host's own firewall refuses.

This module is pure: it validates inputs and returns POSIX ``sh`` scripts (run as root on the
host, e.g. ``sh -c SCRIPT`` over SSH) and texts for the plan. It performs no I/O.

- :func:`detect_script` prints one line, ``tfplan-firewall-detect root=1 uid=0 nft=ok
  iptables=ok ip6tables=ok ipv6=1``; :func:`parse_detect` turns it into a
  :class:`FirewallSupport` with the backend to use or a one-line problem for preflight.
- :func:`install_script` installs (or replaces: idempotent, atomic per family) one host's
  rules with the ``nft`` or the ``iptables`` backend and prints ``tfplan-firewall-installed ...``.
- :func:`remove_script` removes an experiment's rules of either backend (idempotent: absent
  rules are no error) and prints ``tfplan-firewall-removed ...``.

Scripts exit 0 on success; on failure they print one line ``tfplan-firewall: error: ...`` to
stderr and exit 1.

nftables: one table ``inet tfplan_<id>`` per experiment with named sets (ports, allowed IPv4
and IPv6 sources) and a chain hooked at ``input`` with priority -10 (before the usual filter
chains at 0). iptables: one chain ``tfplan_<id>`` per family (iptables and, when the host has
IPv6, ip6tables), jumped to from the top of ``INPUT`` for exactly the planned ports.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from tfplan.errors import BackendError, ConfigError

__all__ = [
    "BACKENDS",
    "DETECT_MARK",
    "INSTALLED_MARK",
    "LOOPBACK",
    "REMOVED_MARK",
    "Backend",
    "FirewallSupport",
    "HostFirewall",
    "ToolState",
    "cluster_firewalls",
    "detect_script",
    "firewall_name",
    "install_script",
    "parse_detect",
    "remove_script",
]

Backend = Literal["nft", "iptables"]
BACKENDS: tuple[Backend, ...] = ("nft", "iptables")
ToolState = Literal["ok", "missing", "unusable"]
_TOOL_STATES: tuple[ToolState, ...] = ("ok", "missing", "unusable")

LOOPBACK = ("127.0.0.1", "::1")
DETECT_MARK = "tfplan-firewall-detect"
INSTALLED_MARK = "tfplan-firewall-installed"
REMOVED_MARK = "tfplan-firewall-removed"

NFT_PRIORITY = -10  # before the usual filter chains (0); our drop is final whatever the order
MULTIPORT_MAX = 15  # iptables' multiport match takes at most 15 ports (a range counts as 2)
_KEY = "cluster.firewall"
_SLUG_MAX = 12  # "tfplan_" + 12 + "_" + 8 hex = 28: iptables' longest chain name


def firewall_name(experiment: str) -> str:
    """The table / chain name for an experiment: ``tfplan_<slug>_<hash>``, at most 28 chars.

    The slug keeps ``[a-z0-9_]`` of the id (so it is readable in ``nft list tables``); the 8
    hex digits of its SHA-256 keep ids apart that sanitise or truncate to the same slug.
    """
    _check_experiment(experiment)
    slug = re.sub(r"[^a-z0-9]+", "_", experiment.lower()).strip("_")[:_SLUG_MAX].rstrip("_")
    digest = hashlib.sha256(experiment.encode("utf-8")).hexdigest()[:8]
    return f"tfplan_{slug}_{digest}" if slug else f"tfplan_{digest}"


def _check_experiment(experiment: object) -> None:
    if not isinstance(experiment, str) or not experiment.strip():
        raise ConfigError(
            _KEY, f"the experiment id {experiment!r} is empty", "give the experiment an id"
        )


def _normalize_address(address: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    text = address.strip() if isinstance(address, str) else None
    if not text or "%" in text:
        why = "a scoped IPv6 address (with %zone)" if text and "%" in text else "not an IP address"
        raise ConfigError(
            _KEY,
            f"allowed source {address!r} is {why}",
            "the rules admit IP addresses: give each host's IP (resolve names first)",
        )
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise ConfigError(
            _KEY,
            f"allowed source {address!r} is not an IP address",
            "the rules admit IP addresses: give each host's IP (resolve names first)",
        ) from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # the kernel sees such a peer as IPv4
    if ip.is_unspecified or ip.is_multicast:
        raise ConfigError(
            _KEY,
            f"allowed source {address!r} is not a host address",
            "give each host's own unicast IP",
        )
    return ip


def _normalize_port(port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(
            _KEY, f"port {port!r} is not a TCP port number", "ports are integers 1-65535"
        )
    return port


@dataclass(frozen=True)
class HostFirewall:
    """One host's rules: admit ``allowed`` to TCP ``ports``, drop every other source there.

    The constructor validates and normalises: ``allowed`` becomes the sorted unique IPs (IPv4
    first) plus :data:`LOOPBACK`; ``ports`` the sorted unique ports. Empty ``ports`` (a host
    without listening tasks) is valid: installing it removes any rules the host had.

    Raises:
        ConfigError: an id is empty, a source is not an IP address, a port is not 1-65535.
    """

    experiment: str
    host: str
    allowed: tuple[str, ...]
    ports: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_experiment(self.experiment)
        if not isinstance(self.host, str) or not self.host.strip():
            raise ConfigError(_KEY, f"host name {self.host!r} is empty", "name every host")
        if isinstance(self.allowed, str) or isinstance(self.ports, str | bytes):
            raise ConfigError(_KEY, "allowed and ports must be lists", "pass sequences")
        ips = {_normalize_address(a) for a in self.allowed}
        ips |= {ipaddress.ip_address(a) for a in LOOPBACK}
        ordered = sorted(ips, key=lambda ip: (ip.version, int(ip)))
        object.__setattr__(self, "allowed", tuple(str(ip) for ip in ordered))
        object.__setattr__(self, "ports", tuple(sorted({_normalize_port(p) for p in self.ports})))

    @property
    def name(self) -> str:
        """nft table ``inet <name>`` / iptables chain ``<name>`` (see :func:`firewall_name`)."""
        return firewall_name(self.experiment)

    @property
    def allowed_v4(self) -> tuple[str, ...]:
        return tuple(a for a in self.allowed if ":" not in a)

    @property
    def allowed_v6(self) -> tuple[str, ...]:
        return tuple(a for a in self.allowed if ":" in a)

    def describe(self, backend: Backend | None = None) -> str:
        """One line for the plan, e.g. ``host h1: admit 10.0.0.11, 10.0.0.12 and loopback to
        tcp 2222-2223; drop others (nft table inet tfplan_mnist_1a2b3c4d)``."""
        if not self.ports:
            return f"host {self.host}: no listening ports; no rules (any old ones are removed)"
        others = [a for a in self.allowed if a not in LOOPBACK]
        who = ", ".join(others) + " and loopback" if others else "loopback only"
        where = {
            None: self.name,
            "nft": f"nft table inet {self.name}",
            "iptables": f"iptables chain {self.name}",
        }[backend]
        return (
            f"host {self.host}: admit {who} to tcp {_port_ranges(self.ports, '-')}; "
            f"drop others ({where})"
        )

    def nft_ruleset(self) -> str:
        """The ``nft -f`` input: replaces the experiment's table atomically (add, delete, define)."""
        if not self.ports:
            raise ValueError("no ports: nothing to install (install_script removes instead)")
        name = self.name
        ports = ", ".join(str(p) for p in self.ports)
        return "\n".join(
            [
                f"add table inet {name}",
                f"delete table inet {name}",
                f"table inet {name} {{",
                f"\tset ports {{ type inet_service; elements = {{ {ports} }}; }}",
                f"\tset allow4 {{ type ipv4_addr; elements = {{ {', '.join(self.allowed_v4)} }}; }}",
                f"\tset allow6 {{ type ipv6_addr; elements = {{ {', '.join(self.allowed_v6)} }}; }}",
                "\tchain input {",
                f"\t\ttype filter hook input priority {NFT_PRIORITY}; policy accept;",
                '\t\tiif "lo" tcp dport @ports accept',
                "\t\tip saddr @allow4 tcp dport @ports accept",
                "\t\tip6 saddr @allow6 tcp dport @ports accept",
                "\t\ttcp dport @ports counter drop",
                "\t}",
                "}",
                "",
            ]
        )

    def iptables_restore(self, family: Literal[4, 6]) -> str:
        """``iptables-restore --noflush`` input (``ip6tables-restore`` for 6): declaring the
        chain creates or empties it, then fills it, in one commit. Sources RETURN (the host's
        own INPUT rules then decide, as without us); everything else that jumped here DROPs."""
        name = self.name
        sources = self.allowed_v4 if family == 4 else self.allowed_v6
        prefix = 32 if family == 4 else 128
        lines = ["*filter", f":{name} - [0:0]", f"-A {name} -i lo -j RETURN"]
        lines += [f"-A {name} -s {a}/{prefix} -j RETURN" for a in sources]
        lines += [f"-A {name} -j DROP", "COMMIT", ""]
        return "\n".join(lines)

    def iptables_jumps(self) -> tuple[str, ...]:
        """``--dports`` values of the INPUT jumps, at most 15 ports each (a range counts 2),
        exactly as ``iptables -S`` prints them back."""
        groups: list[list[tuple[int, int]]] = [[]]
        used = 0
        for lo, hi in _runs(self.ports):
            cost = 1 if lo == hi else 2
            if used + cost > MULTIPORT_MAX:
                groups.append([])
                used = 0
            groups[-1].append((lo, hi))
            used += cost
        return tuple(
            ",".join(str(lo) if lo == hi else f"{lo}:{hi}" for lo, hi in group)
            for group in groups
            if group
        )


def cluster_firewalls(
    experiment: str, tasks: Iterable[tuple[str, str, int | None]]
) -> dict[str, HostFirewall]:
    """One :class:`HostFirewall` per host from the plan's tasks.

    Args:
        tasks: ``(host name, host IP address, port or None)`` for every task, the evaluator
            included (it has no port but its host's address must be admitted everywhere).

    Every host admits every task host's address; each host's ports are those of its own tasks.
    """
    addresses: list[str] = []
    ports: dict[str, set[int]] = {}
    for host, address, port in tasks:
        addresses.append(address)
        ports.setdefault(host, set())
        if port is not None:
            ports[host].add(port)
    return {
        host: HostFirewall(experiment, host, tuple(addresses), tuple(host_ports))
        for host, host_ports in sorted(ports.items())
    }


def _runs(ports: Iterable[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for port in sorted(set(ports)):
        if runs and port == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], port)
        else:
            runs.append((port, port))
    return runs


def _port_ranges(ports: Iterable[int], dash: str) -> str:
    return ", ".join(str(lo) if lo == hi else f"{lo}{dash}{hi}" for lo, hi in _runs(ports))


# --- shell scripts ------------------------------------------------------------------------------

_PRELUDE = """\
# tfplan firewall ({what}); POSIX sh, run as root
PATH="${{PATH:-/usr/bin:/bin}}:/usr/local/sbin:/usr/sbin:/sbin"
export PATH
LC_ALL=C
export LC_ALL
fail() {{ echo "tfplan-firewall: error: $*" >&2; exit 1; }}
oneline() {{ printf '%s' "$1" | tr '\\n\\t' '  ' | cut -c1-400; }}
have() {{ command -v "$1" >/dev/null 2>&1; }}
"""

_NEED_ROOT = """\
uid=$(id -u)
[ "$uid" = 0 ] || fail "not root (uid $uid): changing the firewall needs root on this host"
"""

# Removing one family's iptables chain: the INPUT jumps to it, then the chain. Prints
# removed|absent|missing|unusable; on failure prints the tool's error and returns 1.
_IPT_REMOVE = """\
ipt_remove() {{
  cmd=$1
  have "$cmd" || {{ echo missing; return 0; }}
  "$cmd" -w -n -L INPUT >/dev/null 2>&1 || {{ echo unusable; return 0; }}
  "$cmd" -w -n -L {name} >/dev/null 2>&1 || {{ echo absent; return 0; }}
  rules=$("$cmd" -w -S INPUT 2>&1) || {{ echo "$rules"; return 1; }}
  printf '%s\\n' "$rules" | while IFS= read -r rule; do
    case "$rule" in
      "-A INPUT "*" -j {name}") set -f; "$cmd" -w -D INPUT ${{rule#-A INPUT }} 2>&1 || exit 1 ;;
    esac
  done || return 1
  "$cmd" -w -F {name} 2>&1 && "$cmd" -w -X {name} 2>&1 || return 1
  echo removed
}}
"""

# Removing the nft table (add + delete in one transaction: no error when it is absent).
_NFT_REMOVE = """\
nft_remove() {{
  have nft || {{ echo missing; return 0; }}
  nft list tables >/dev/null 2>&1 || {{ echo unusable; return 0; }}
  state=absent
  nft list table inet {name} >/dev/null 2>&1 && state=removed
  out=$(printf 'add table inet {name}\\ndelete table inet {name}\\n' | nft -f - 2>&1) || {{
    echo "$out"; return 1; }}
  echo "$state"
}}
"""


def detect_script() -> str:
    """A script that prints one line describing what this host can do, e.g.
    ``tfplan-firewall-detect root=1 uid=0 nft=ok iptables=ok ip6tables=missing ipv6=1``.

    Each tool is ``ok``, ``missing`` or ``unusable`` (present, but a read-only listing fails:
    no nf_tables / ip_tables in the kernel, or no CAP_NET_ADMIN, e.g. in a container). Without
    root the tools are only looked up, not tried. It changes nothing and always exits 0.
    """
    return (
        _PRELUDE.format(what="detect")
        + """\
uid=$(id -u)
root=0
[ "$uid" = 0 ] && root=1
probe() {
  tool=$1
  shift
  if ! have "$tool"; then echo missing
  elif [ "$root" = 1 ] && ! "$@" >/dev/null 2>&1; then echo unusable
  else echo ok
  fi
}
nft=$(probe nft nft list tables)
ipt=$(probe iptables iptables -w -n -L INPUT)
ip6t=$(probe ip6tables ip6tables -w -n -L INPUT)
ipv6=0
[ -e /proc/net/if_inet6 ] && ipv6=1
"""
        + f'echo "{DETECT_MARK} root=$root uid=$uid nft=$nft iptables=$ipt ip6tables=$ip6t '
        + 'ipv6=$ipv6"\n'
    )


@dataclass(frozen=True)
class FirewallSupport:
    """What :func:`detect_script` found on one host."""

    root: bool
    uid: int
    nft: ToolState
    iptables: ToolState
    ip6tables: ToolState
    ipv6: bool

    @property
    def backend(self) -> Backend | None:
        """``nft`` where it works, else ``iptables`` (with ip6tables where IPv6 is on), else None."""
        if not self.root:
            return None
        if self.nft == "ok":
            return "nft"
        if self.iptables == "ok" and (self.ip6tables == "ok" or not self.ipv6):
            return "iptables"
        return None

    @property
    def problem(self) -> str | None:
        """None when a backend is usable, else one line for preflight (says what to do)."""
        if not self.root:
            return (
                f"not root (uid {self.uid}): cluster.firewall installs rules, which needs root "
                "on the host; connect as root, or set cluster.firewall=false"
            )
        if self.backend is not None:
            return None
        why = {
            "missing": "{} is missing",
            "unusable": "{} is installed but cannot list rules (no kernel support, or no "
            "CAP_NET_ADMIN in a container)",
            "ok": "{} works",
        }
        reasons = [why[self.nft].format("nft"), why[self.iptables].format("iptables")]
        if self.iptables == "ok" and self.ipv6:
            reasons.append(why[self.ip6tables].format("ip6tables") + " while IPv6 is on")
        return (
            f"cannot install firewall rules: {', '.join(reasons)}; install nftables "
            "(apt-get install nftables), or set cluster.firewall=false"
        )


def _tool_state(value: str) -> ToolState:
    for state in _TOOL_STATES:
        if value == state:
            return state
    raise ValueError(value)


def parse_detect(output: str) -> FirewallSupport:
    """Read :func:`detect_script`'s line from a command's output (other lines are ignored).

    Raises:
        BackendError: no such line, or a malformed one (one-line message quoting it).
    """
    for line in output.splitlines():
        words = line.split()
        if not words or words[0] != DETECT_MARK:
            continue
        fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        try:
            if fields["root"] not in ("0", "1") or fields["ipv6"] not in ("0", "1"):
                raise ValueError(fields)
            return FirewallSupport(
                root=fields["root"] == "1",
                uid=int(fields["uid"]),
                nft=_tool_state(fields["nft"]),
                iptables=_tool_state(fields["iptables"]),
                ip6tables=_tool_state(fields["ip6tables"]),
                ipv6=fields["ipv6"] == "1",
            )
        except (KeyError, ValueError):
            raise BackendError(
                f"firewall detection printed a malformed line: {line[:200]!r}"
            ) from None
    head = output.strip().splitlines()[0][:200] if output.strip() else ""
    raise BackendError(f"firewall detection printed no {DETECT_MARK} line (output: {head!r})")


def remove_script(experiment: str) -> str:
    """A script removing the experiment's rules of both backends from this host.

    Idempotent: absent rules, or a tool that is missing or unusable, are no error. Prints
    ``tfplan-firewall-removed name=N nft=S iptables=S ip6tables=S`` where each S is
    ``removed``, ``absent``, ``missing`` or ``unusable``. Needs root.
    """
    name = firewall_name(experiment)
    return (
        _PRELUDE.format(what=f"remove {name}")
        + _NEED_ROOT
        + _NFT_REMOVE.format(name=name)
        + _IPT_REMOVE.format(name=name)
        + """\
nft_state=$(nft_remove) || fail "nft: $(oneline "$nft_state")"
v4=$(ipt_remove iptables) || fail "iptables: $(oneline "$v4")"
v6=$(ipt_remove ip6tables) || fail "ip6tables: $(oneline "$v6")"
"""
        + f'echo "{REMOVED_MARK} name={name} nft=$nft_state iptables=$v4 ip6tables=$v6"\n'
    )


def install_script(firewall: HostFirewall, backend: Backend) -> str:
    """A script installing (or replacing) one host's rules with ``backend``.

    Idempotent: running it again leaves the same rules. It replaces the experiment's earlier
    rules atomically (nft: one transaction; iptables: one restore per family, then the INPUT
    jumps are added before stale ones are removed), then removes any rules of this experiment
    that the *other* backend left. Empty ``ports``: removes the experiment's rules instead.
    Prints ``tfplan-firewall-installed backend=B name=N ports=P ipv6=0|1``. Needs root.
    """
    if backend not in BACKENDS:
        raise ConfigError(_KEY, f"unknown firewall backend {backend!r}", "use nft or iptables")
    if not firewall.ports:
        return remove_script(firewall.experiment)
    name = firewall.name
    ports = _port_ranges(firewall.ports, "-").replace(" ", "")
    done = f"{INSTALLED_MARK} backend={backend} name={name} ports={ports}"
    head = _PRELUDE.format(what=f"install {name} with {backend}") + _NEED_ROOT
    if backend == "nft":
        return (
            head
            + _IPT_REMOVE.format(name=name)
            + f"""\
have nft || fail "nft not found: install nftables, or use the iptables backend"
rules={shlex.quote(firewall.nft_ruleset())}
out=$(printf '%s' "$rules" | nft -f - 2>&1) || fail "nft -f: $(oneline "$out")"
out=$(ipt_remove iptables) || fail "removing the iptables leftovers: $(oneline "$out")"
out=$(ipt_remove ip6tables) || fail "removing the ip6tables leftovers: $(oneline "$out")"
ipv6=0
[ -e /proc/net/if_inet6 ] && ipv6=1
echo "{done} ipv6=$ipv6"
"""
        )
    jumps = " ".join(firewall.iptables_jumps())
    return (
        head
        + _NFT_REMOVE.format(name=name)
        + f"""\
JUMPS={shlex.quote(jumps)}
ipt_install() {{
  cmd=$1
  restore=$2
  out=$(printf '%s' "$restore" | "$cmd-restore" -w --noflush 2>&1) ||
    out=$(printf '%s' "$restore" | "$cmd-restore" --noflush 2>&1) || {{ echo "$out"; return 1; }}
  for spec in $JUMPS; do
    "$cmd" -w -C INPUT -p tcp -m multiport --dports "$spec" -j {name} >/dev/null 2>&1 ||
      "$cmd" -w -I INPUT 1 -p tcp -m multiport --dports "$spec" -j {name} 2>&1 || return 1
  done
  rules=$("$cmd" -w -S INPUT 2>&1) || {{ echo "$rules"; return 1; }}
  printf '%s\\n' "$rules" | while IFS= read -r rule; do
    case "$rule" in
      "-A INPUT "*" -j {name}") ;;
      *) continue ;;
    esac
    for spec in $JUMPS; do
      [ "$rule" = "-A INPUT -p tcp -m multiport --dports $spec -j {name}" ] && continue 2
    done
    set -f
    "$cmd" -w -D INPUT ${{rule#-A INPUT }} 2>&1 || exit 1
    set +f
  done || return 1
}}
have iptables || fail "iptables not found: install nftables or iptables"
have iptables-restore || fail "iptables-restore not found: install iptables"
out=$(ipt_install iptables {shlex.quote(firewall.iptables_restore(4))}) ||
  fail "iptables: $(oneline "$out")"
ipv6=0
if [ -e /proc/net/if_inet6 ]; then
  ipv6=1
  have ip6tables || fail "IPv6 is on but ip6tables is missing: install iptables, or nftables"
  out=$(ipt_install ip6tables {shlex.quote(firewall.iptables_restore(6))}) ||
    fail "ip6tables: $(oneline "$out")"
fi
out=$(nft_remove) || fail "removing the nft leftovers: $(oneline "$out")"
echo "{done} ipv6=$ipv6"
"""
    )
