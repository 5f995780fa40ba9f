"""Preflight: the checks run on every host before any task starts, as data.

One small Python snippet (:data:`PREFLIGHT_SNIPPET`) runs on each host, the same for the local
and the SSH transport (the Slurm backend runs it on each node through ``srun``), and prints one
JSON object. :meth:`~tfplan.backends.transports.base.Transport.preflight` turns it into a
:class:`PreflightResult`; :func:`check_shared_dir` compares the results of several hosts, and
:func:`raise_for_preflight` raises one :class:`~tfplan.errors.PreflightError` listing every
host that failed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfplan.errors import PreflightError

__all__ = [
    "PREFLIGHT_SNIPPET",
    "OutputSharing",
    "PreflightRequest",
    "PreflightResult",
    "check_shared_dir",
    "output_sharing",
    "parse_preflight_output",
    "raise_for_preflight",
    "readiness_lines",
]


@dataclass(frozen=True)
class PreflightRequest:
    """What to check on each host. The same request goes to every host of a cluster."""

    tf_version: str | None = None  # "2.21" matches 2.21.x; None: only check TF is installed
    ports: tuple[int, ...] = ()  # must be free (a bind test on bind_address)
    writable_dirs: tuple[str, ...] = ()  # created if missing, then a file is written and removed
    shared_dir: str | None = None  # every host writes/reads the marker .tfplan-shared-<token>
    marker_token: str = field(default_factory=lambda: uuid.uuid4().hex)
    bind_address: str = "0.0.0.0"
    import_tensorflow: bool = False  # True: really import it (seconds); False: find it + version
    legacy_keras: bool = False  # recipe.legacy_keras: tf_keras must match TensorFlow's version
    gpus: int = 0  # GPUs the plan assigns on this host: TensorFlow must see as many (imports it)
    # the parameter servers planned on this host and the bytes they hold at least (their
    # variables and optimizer slots, tfplan/planning/footprint.py): the host's available memory
    # (MemAvailable, Linux) must exceed it; none: not checked
    ps_names: tuple[str, ...] = ()
    ps_bytes: int = 0


@dataclass(frozen=True)
class PreflightResult:
    """The outcome on one host. ``problems`` is empty when every check passed."""

    host: str
    problems: tuple[str, ...]
    hostname: str | None = None
    python: str | None = None  # the interpreter's path there
    python_version: str | None = None
    tf_version: str | None = None
    shared_marker: str | None = None  # content of the marker file this host read back
    elapsed_secs: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


# Runs on the host with its own python (3.6+), argv[1] = the request as JSON. Prints one JSON
# line. Keep it free of anything newer than Python 3.6 and of non-stdlib imports.
PREFLIGHT_SNIPPET = r"""
import json, os, platform, socket, sys, time, uuid
req = json.loads(sys.argv[1])
out = {"problems": [], "hostname": socket.gethostname(), "python": sys.executable,
       "python_version": platform.python_version(), "tf_version": None, "shared_marker": None}
bad = out["problems"].append
def tf_version():
    if req["import_tensorflow"]:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as tf
        return tf.__version__
    import importlib.util
    if importlib.util.find_spec("tensorflow") is None:
        raise ImportError("No module named 'tensorflow'")
    try:
        from importlib import metadata
    except ImportError:
        return "unknown"
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly"):
        try:
            return metadata.version(dist)
        except Exception:
            pass
    return "unknown"
try:
    out["tf_version"] = tf_version()
except Exception as exc:
    bad("tensorflow is not importable with %s (%s): install it, or set the host's python"
        % (sys.executable, str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
want = req["tf_version"]
have = out["tf_version"]
if want and have and have != "unknown":
    if have.split(".")[:len(want.split("."))] != want.split("."):
        bad("tensorflow %s found, %s wanted: install tensorflow==%s on this host"
            % (have, want, want))
def minor(version):
    return ".".join(version.split(".")[:2])
if req.get("legacy_keras") and have:
    import importlib.util
    fix = "%s -m pip install --no-deps 'tf_keras~=%s.0'" % (sys.executable, minor(have))
    if importlib.util.find_spec("tf_keras") is None:
        bad("recipe.legacy_keras=true but tf_keras is not installed: " + fix)
    else:
        try:
            from importlib import metadata
            keras2 = metadata.version("tf_keras")
        except Exception:
            keras2 = None
        if keras2 and have != "unknown" and minor(keras2) != minor(have):
            bad("recipe.legacy_keras=true but tf_keras %s does not match tensorflow %s: %s"
                % (keras2, have, fix))
if req.get("gpus") and have:
    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as tf
        seen = len(tf.config.list_physical_devices("GPU"))
    except Exception as exc:
        seen = 0
    if seen < req["gpus"]:
        bad("%d GPU(s) assigned on this host but TensorFlow sees %d (it would train on the CPU):"
            " fix the host's CUDA install (nvidia-smi, pip install 'tensorflow[and-cuda]') or"
            " set the host's gpus to %d" % (req["gpus"], seen, seen))
def holder(port):
    # " by pid N (its command)": the process listening on the port in this host's network
    # namespace, found from /proc/net/tcp* (the socket's inode) and /proc/*/fd; "" if unseen
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for row in list(f)[1:]:
                    cols = row.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add("socket:[%s]" % cols[9])
        except (OSError, ValueError, IndexError):
            pass
    for pid in (d for d in os.listdir("/proc") if d.isdigit()) if inodes else ():
        try:
            if any(os.readlink("/proc/%s/fd/%s" % (pid, fd)) in inodes
                   for fd in os.listdir("/proc/%s/fd" % pid)):
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
                return " by pid %s (%s)" % (pid, cmd[:100] + ("..." if len(cmd) > 100 else ""))
        except OSError:
            continue
    return ""
for port in req["ports"]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((req["bind_address"], port))
    except OSError as exc:
        bad("port %d is in use%s (%s): stop what holds it or change cluster.port_base"
            % (port, holder(port), exc.strerror))
    finally:
        s.close()
def available_memory():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
def size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%d B" % n if unit == "B" else "%.1f %s" % (n, unit)
        n = n / 1024.0
if req.get("ps_bytes"):
    avail = available_memory()
    if avail is not None and req["ps_bytes"] > avail:
        bad("%s need(s) at least %s of memory here (variables and optimizer slots) but the host"
            " has %s available: add parameter servers (cluster.ps), place them on larger hosts,"
            " or use an optimizer with fewer slots (algo.optimizer)"
            % (", ".join(req["ps_names"]), size(req["ps_bytes"]), size(avail)))
for d in req["writable_dirs"]:
    try:
        # exist_ok: hosts sharing the folder (NFS) run this at the same time, and a check-then-
        # create lost that race with "File exists" (seen with three hosts on one file system)
        os.makedirs(d, exist_ok=True)
        probe = os.path.join(d, ".tfplan-probe-%d-%s" % (os.getpid(), uuid.uuid4().hex))
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as exc:
        bad("%s is not writable (%s): fix its permissions or choose another folder"
            % (d, exc.strerror))
if req["shared_dir"]:
    path = os.path.join(req["shared_dir"], ".tfplan-shared-" + req["marker_token"])
    try:
        os.makedirs(req["shared_dir"], exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, ("%s %s" % (out["hostname"], uuid.uuid4().hex)).encode())
            os.fsync(fd)
            os.close(fd)
        except OSError:
            pass  # another host made it first: that is the point
        for _ in range(50):  # the first writer may not have written its content yet
            with open(path) as f:
                out["shared_marker"] = f.read()
            if out["shared_marker"]:
                break
            time.sleep(0.1)
    except OSError as exc:
        bad("shared dir %s is not usable (%s): mount it on every host"
            % (req["shared_dir"], exc.strerror))
print(json.dumps(out))
"""


def request_json(req: PreflightRequest) -> str:
    """The request as the snippet's argv[1]."""
    return json.dumps(
        {
            "tf_version": req.tf_version,
            "ports": list(req.ports),
            "writable_dirs": list(req.writable_dirs),
            "shared_dir": req.shared_dir,
            "marker_token": req.marker_token,
            "bind_address": req.bind_address,
            "import_tensorflow": req.import_tensorflow,
            "legacy_keras": req.legacy_keras,
            "gpus": req.gpus,
            "ps_names": list(req.ps_names),
            "ps_bytes": req.ps_bytes,
        }
    )


def parse_preflight_output(host: str, stdout: str, elapsed_secs: float) -> PreflightResult:
    """Turn the snippet's JSON line into a result.

    Raises:
        ValueError: the output holds no JSON object (the caller reports it as a problem).
    """
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            data: dict[str, Any] = json.loads(line)
            return PreflightResult(
                host=host,
                problems=tuple(data["problems"]),
                hostname=data.get("hostname"),
                python=data.get("python"),
                python_version=data.get("python_version"),
                tf_version=data.get("tf_version"),
                shared_marker=data.get("shared_marker"),
                elapsed_secs=elapsed_secs,
            )
    raise ValueError(f"no JSON in the preflight output: {stdout.strip()[-200:]!r}")


def check_shared_dir(results: Mapping[str, PreflightResult]) -> dict[str, str]:
    """Which hosts do not see the same marker in the shared dir as the others.

    Every host's snippet creates the marker only if it is missing (O_EXCL) and reads it back,
    so on a truly shared folder all hosts read the first writer's content. The majority content
    is taken as the shared one; hosts that read another (or none) are returned.

    Args:
        results: host name -> its preflight result (made with one request).

    Returns:
        host name -> the reason, for each host that does not share the folder; empty when all do.
    """
    seen = {host: r.shared_marker for host, r in results.items() if r.shared_marker is not None}
    if len(seen) < 2:
        return {}
    counts: dict[str, int] = {}
    for marker in seen.values():
        counts[marker] = counts.get(marker, 0) + 1
    shared = max(sorted(counts), key=lambda m: counts[m])
    writer = shared.split(" ", 1)[0]
    return {
        host: (
            f"does not see the shared dir of the other hosts (its marker was written by "
            f"{marker.split(' ', 1)[0]}, theirs by {writer}): mount the same folder on every host"
        )
        for host, marker in sorted(seen.items())
        if marker != shared
    }


def raise_for_preflight(
    results: Mapping[str, PreflightResult | BaseException],
) -> list[PreflightResult]:
    """Raise one error listing every failed host, including shared-dir mismatches; else return
    every host's result, in host order.

    Args:
        results: host name -> result, or the exception the host raised (see ``run_on_hosts``).

    Raises:
        PreflightError: any host failed any check; ``failures`` maps host -> reasons.
    """
    failures: dict[str, str] = {}
    good: dict[str, PreflightResult] = {}
    for host, result in results.items():
        if isinstance(result, BaseException):
            failures[host] = str(result)
        elif result.problems:
            failures[host] = "; ".join(result.problems)
            good[host] = result
        else:
            good[host] = result
    for host, why in check_shared_dir(good).items():
        failures[host] = f"{failures[host]}; {why}" if host in failures else why
    if failures:
        raise PreflightError(failures)
    return [good[host] for host in sorted(good)]


def readiness_lines(results: Sequence[PreflightResult], shown: int = 4) -> list[str]:
    """What every host will run, one line per distinct interpreter and TensorFlow:
    ``ready: localhost, node-2: /usr/bin/python3 (Python 3.11.7), tensorflow 2.21.0``."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for result in results:
        key = (
            result.python or "python",
            result.python_version or "?",
            result.tf_version or "not installed",
        )
        groups.setdefault(key, []).append(result.host)
    lines = []
    for (python, version, tf), hosts in groups.items():  # in the order the hosts came
        names = ", ".join(hosts[:shown])
        if len(hosts) > shown:
            names = f"{len(hosts)} hosts ({names}, ...)"
        lines.append(f"ready: {names}: {python} (Python {version}), tensorflow {tf}")
    return lines


@dataclass(frozen=True)
class OutputSharing:
    """What the output-folder markers say (:func:`output_sharing`)."""

    per_host: bool  # every host has its own folder
    launcher_sees: bool  # this machine sees the folder the hosts share
    detail: str  # one line: what was found


def _names(hosts: list[str]) -> str:
    return ", ".join(hosts[:-1]) + f" and {hosts[-1]}" if len(hosts) > 1 else hosts[0]


def output_sharing(
    mode: str, folder: str, markers: Mapping[str, str], launcher_marker: str | None
) -> OutputSharing:
    """Decide from the marker each host read in ``folder`` (``Transport.shared_marker``, one
    token for all) whether the hosts share it, and whether this machine does.

    Every host creates the marker only if it is missing and reads it back, so hosts that share
    the folder read the same content, and hosts with their own folder read their own.

    Args:
        mode: ``cluster.output_mode``: ``shared`` (the hosts must share it), ``auto`` (all
            share it, or none does: per-host output) or ``per_host`` (not asked: no markers).
        markers: host name -> what it read.
        launcher_marker: what this machine reads at the same path (None: no such file).

    Raises:
        PreflightError: the hosts do not share the folder as ``mode`` requires, naming the
            hosts that differ from the others.
    """
    groups: dict[str, list[str]] = {}
    for host, marker in sorted(markers.items()):
        groups.setdefault(marker, []).append(host)
    hosts = sorted(markers)
    if len(groups) <= 1:
        sees = launcher_marker is not None and launcher_marker in groups
        if len(hosts) == 1:  # one host: nothing to share, only whether this machine sees it
            seen = "this machine sees it too" if sees else "this machine does not see it"
            return OutputSharing(False, sees, f"output_dir {folder} on {hosts[0]}: {seen}")
        where = "and this machine" if sees else "(not this machine)"
        return OutputSharing(
            False, sees, f"output_dir {folder} is shared by {_names(hosts)} {where}"
        )
    if mode == "auto" and all(len(g) == 1 for g in groups.values()):
        return OutputSharing(
            True,
            False,
            f"output_dir {folder} is not shared: {_names(hosts)} each have their own "
            "(per-host output)",
        )
    # The largest group is taken as the shared folder (ties: the one of the first host).
    shared = max(groups.values(), key=len)
    odd = {h: m for h, m in markers.items() if h not in shared}
    if mode == "auto":
        why = (
            f"sees its own {folder}, not the one {_names(shared)} share: mount it here too, or "
            "set cluster.output_mode=per_host (then each host keeps its own)"
        )
        raise PreflightError({h: why for h in odd})
    writer = markers[shared[0]].split(" ", 1)[0]
    raise PreflightError(
        {
            h: f"does not see the shared dir of the other hosts (its marker was written by "
            f"{m.split(' ', 1)[0]}, theirs by {writer}): mount the same folder on every host, "
            "or set cluster.output_mode=per_host (each host keeps its own)"
            for h, m in odd.items()
        }
    )
