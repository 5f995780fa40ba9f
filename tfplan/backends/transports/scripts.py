"""The POSIX ``sh`` scripts every transport runs on its host, and the parsers of their output.

Local and SSH transports run exactly the same scripts (locally through ``sh -c``, remotely
through ``sh -c`` over an SSH channel), so the conformance suite tests one implementation of
stop/status/streaming/file transfer, and only process creation and transport differ.
"""

from __future__ import annotations

import base64
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence

from tfplan.backends.transports.cgroups import CGROUP_SH, ENTER_FAILED_EXIT, ENTER_SH

__all__ = [
    "EXIT_CODE_FILE",
    "fork_script",
    "LISTENING_SCRIPT",
    "MEMORY_TASK_WRAPPER",
    "listening_ports",
    "STREAM_POLL_SECS",
    "TASK_WRAPPER",
    "prepare_start_script",
    "put_tree_script",
    "handle_exit_file",
    "move_script",
    "moves_script",
    "standby_exit_file",
    "signal_script",
    "read_script",
    "remote_start_script",
    "status_script",
    "stop_groups_script",
    "stop_script",
    "stream_script",
    "write_file_script",
]

EXIT_CODE_FILE = "exit_code"
# Linux refuses a single argument over 128 KiB (MAX_ARG_STRLEN): a longer script (a status or
# the log tails of a thousand tasks) is fed to ``sh -s`` on its stdin instead of ``sh -c``.
LONG_SCRIPT_BYTES = 64 * 1024
STREAM_POLL_SECS = 0.2

# Runs the task's argv ("$@") and records its exit status atomically in $TFPLAN_EXIT_FILE.
# The TERM/INT/HUP traps only make the wrapper *wait*: a trap runs after the foreground command
# has finished, so a stop (SIGTERM to the whole group) still records the task's own status (143
# for a task that dies of SIGTERM). USR1 and USR2 are trapped the same way: the go signal of a
# warm standby, and a replica's "leave the running job" (both sent to the whole group), must not
# end the wrapper (their default action). Traps
# with a command (not '') are reset in children, so the task still receives the signals normally.
_RECORD_EXIT = (
    'printf "%s\\n" "$rc" > "$TFPLAN_EXIT_FILE.tmp.$$" '
    '&& mv -f "$TFPLAN_EXIT_FILE.tmp.$$" "$TFPLAN_EXIT_FILE"; '
    "exit $rc"
)
TASK_WRAPPER = "trap 'true' TERM INT HUP USR1 USR2; \"$@\"; rc=$?; " + _RECORD_EXIT
# The same for a task with a memory limit (LaunchSpec.memory_limit): the wrapper enters the
# task's memory cgroup first (:mod:`.cgroups`; $TFPLAN_CGROUP, $TFPLAN_MEMORY_LIMIT), so that
# the program and all it starts are in it; one that cannot enter records 125 and runs nothing.
MEMORY_TASK_WRAPPER = (
    CGROUP_SH
    + "trap 'true' TERM INT HUP USR1 USR2; "
    + f'if {ENTER_SH}; then "$@"; rc=$?; else rc={ENTER_FAILED_EXIT}; fi; '
    + _RECORD_EXIT
)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def shell_invocation(script: str, stdin: bytes | None) -> tuple[list[str], bytes | None]:
    """``(argv of sh, its stdin)`` to run ``script``: ``sh -c SCRIPT``, or for a long script
    that reads nothing ``sh -s`` with the script as its input."""
    if len(script) > LONG_SCRIPT_BYTES and not stdin:
        return ["sh", "-s"], script.encode()
    return ["sh", "-c", script], stdin


def check_env_names(env: Mapping[str, str]) -> None:
    """Refuse a variable name that is not a plain shell name: it is written into the start
    script unquoted (``export NAME=...``), where anything else could run as code."""
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(
                f"environment variable name {name!r} is not a plain name "
                "(letters, digits, '_', not starting with a digit)"
            )


def q(value: str) -> str:
    """Quote one word for sh."""
    return shlex.quote(value)


def exit_file(workdir: str) -> str:
    """Where the wrapper records the exit status of the task whose cwd is ``workdir``."""
    return workdir.rstrip("/") + "/" + EXIT_CODE_FILE


def standby_exit_file(workdir: str, attempt: int) -> str:
    """A warm standby's exit record: beside its task's, named by the life it will become."""
    return f"{exit_file(workdir)}.{attempt}"


def handle_exit_file(handle: Mapping[str, object], workdir: str) -> str:
    """Where the wrapper of the task with this handle records its exit status: the handle's
    ``exit_file`` (a task that started as a standby), else ``<workdir>/exit_code``."""
    return str(handle.get("exit_file") or exit_file(workdir))


def prepare_start_script(workdir: str, log_path: str, exit_path: str | None = None) -> str:
    """Create the workdir and the log's folder; drop a stale exit code from an earlier run
    (``exit_path``: the task's own, by default ``<workdir>/exit_code``)."""
    log_dir = log_path.rsplit("/", 1)[0] or "/"
    exit_path = exit_path or exit_file(workdir)
    return f"mkdir -p {q(workdir)} {q(log_dir)} && rm -f {q(exit_path)} && : > {q(log_path)}"


def task_wrapper(memory_limit: int | None) -> str:
    """The wrapper of a task: :data:`MEMORY_TASK_WRAPPER` for one with a memory limit."""
    return TASK_WRAPPER if memory_limit is None else MEMORY_TASK_WRAPPER


def memory_env(memory_limit: int | None, cgroup: str) -> dict[str, str]:
    """What :data:`MEMORY_TASK_WRAPPER` reads (the task's program sees it too)."""
    if memory_limit is None:
        return {}
    return {"TFPLAN_CGROUP": cgroup, "TFPLAN_MEMORY_LIMIT": str(memory_limit)}


def remote_start_script(
    command: Sequence[str],
    env: Mapping[str, str],
    workdir: str,
    log_path: str,
    exit_path: str | None = None,
    memory_limit: int | None = None,
    cgroup: str = "",
) -> str:
    """Start the wrapped command detached in its own session and print its PID.

    ``;`` (not ``&&``) before the backgrounded command matters: ``a && b &`` backgrounds the
    whole list in a subshell that keeps the SSH channel open (see TESTBED.md). A non-interactive
    shell's background job stays in the shell's process group, so ``setsid`` does not fork and
    ``$!`` is the new session's leader: PID == PGID.
    """
    check_env_names(env)
    env = {**env, **memory_env(memory_limit, cgroup)}
    exports = "".join(f"export {name}={q(value)}; " for name, value in env.items())
    argv = " ".join(q(word) for word in command)
    exit_path = exit_path or exit_file(workdir)
    return (
        f"{prepare_start_script(workdir, log_path, exit_path)} || exit 97; "
        f"cd {q(workdir)} || exit 98; "
        f"{exports}export TFPLAN_EXIT_FILE={q(exit_path)}; "
        f"setsid sh -c {q(task_wrapper(memory_limit))} tfplan-task {argv} "
        f"> {q(log_path)} 2>&1 < /dev/null & echo $!"
    )


def _group_alive_fn(pgid: int) -> str:
    # Counts the group's live processes. A zombie is dead for our purposes (PID 1 may reap it
    # late), unless other threads of it still run (``Zl``): a multi-threaded program's main
    # thread is a zombie as soon as it has exited, while its last thread still unmaps the
    # memory and only then closes the files, its listening socket among them (a TensorFlow ps
    # holds its port for tens of milliseconds after its leader shows ``Z``).
    return (
        "left() { ps -e -o pgid=,stat= | "
        f"awk -v g={pgid} '$1==g && ($2 !~ /^Z/ || $2 ~ /l/) {{c++}} END {{print c+0}}'; }}; "
    )


def stop_script(pgid: int, grace_secs: float) -> str:
    """SIGTERM the group, wait up to the grace period, SIGKILL it, and verify it is gone.

    Prints one word: ``none`` (nothing was running), ``terminated``, ``killed`` or ``stuck``.
    """
    ticks = max(0, int(round(grace_secs / 0.1)))
    return (
        _group_alive_fn(pgid) + f'[ "$(left)" -eq 0 ] && {{ echo none; exit 0; }}; '
        f"kill -TERM -{pgid} 2>/dev/null; i=0; "
        f'while [ "$(left)" -gt 0 ]; do '
        f"  if [ $i -ge {ticks} ]; then "
        f"    kill -KILL -{pgid} 2>/dev/null; j=0; "
        f'    while [ "$(left)" -gt 0 ] && [ $j -lt 50 ]; do sleep 0.1; j=$((j+1)); done; '
        f'    if [ "$(left)" -eq 0 ]; then echo killed; else echo stuck; fi; exit 0; '
        f"  fi; sleep 0.1; i=$((i+1)); "
        f"done; echo terminated"
    )


def stop_groups_script(pgids: Sequence[int], grace_secs: float) -> str:
    """:func:`stop_script` for many groups at once: one ``ps`` per tenth of a second for all.

    SIGTERM every live group, wait until all are gone or the grace period has passed, SIGKILL
    what is left and verify. Prints one line per group: ``<pgid> <outcome>`` (``none``,
    ``terminated``, ``killed`` or ``stuck``).
    """
    ticks = max(0, int(round(grace_secs / 0.1)))
    wanted = " ".join(str(g) for g in pgids)
    return (
        f"w={q(wanted)}; "
        'alive() { ps -e -o pgid=,stat= | awk -v w="$w" '
        '\'BEGIN {n=split(w,a," "); for (i=1;i<=n;i++) k[a[i]]=1} '
        '($1 in k) && ($2 !~ /^Z/ || $2 ~ /l/) {c[$1]=1} END {for (g in c) printf " %s", g}\'; }; '
        'has() { case "$1 " in *" $2 "*) return 0;; esac; return 1; }; '
        'first="$(alive)"; '
        "for g in $first; do kill -TERM -$g 2>/dev/null; done; "
        'i=0; while [ -n "$(alive)" ] && [ $i -lt ' + str(ticks) + " ]; do "
        "sleep 0.1; i=$((i+1)); done; "
        'rest="$(alive)"; for g in $rest; do kill -KILL -$g 2>/dev/null; done; '
        'j=0; while [ -n "$rest" ] && [ -n "$(alive)" ] && [ $j -lt 50 ]; do '
        "sleep 0.1; j=$((j+1)); done; "
        'final=""; [ -n "$rest" ] && final="$(alive)"; '
        "for g in $w; do "
        'if ! has "$first" $g; then echo "$g none"; '
        'elif has "$final" $g; then echo "$g stuck"; '
        'elif has "$rest" $g; then echo "$g killed"; '
        'else echo "$g terminated"; fi; done'
    )


SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "KILL", "STOP", "CONT")


def signal_script(pgid: int, name: str) -> str:
    """Send signal ``name`` to every process of group ``pgid``; prints how many got it.

    Exits 3 when the group has no live process (nothing to signal; zombies do not count).
    """
    if name not in SIGNALS:
        raise ValueError(f"signal {name!r} is not one of {', '.join(SIGNALS)}")
    return (
        _group_alive_fn(pgid) + f'n=$(left); [ "$n" -eq 0 ] && {{ echo 0; exit 3; }}; '
        f"kill -{name} -{pgid} 2>/dev/null || exit 3; echo $n"
    )


def status_script(pids: Sequence[int], exit_files: Sequence[str | None]) -> str:
    """One ``ps`` over the processes of the given groups, then each task's recorded exit code.

    Output lines: ``P <pid> <pgid> <stat> <pcpu> <rss_kib>`` for every process whose PID or
    PGID is one of ``pids``, then ``E <pid> <exit code or empty>`` per task with an exit file.
    """
    wanted = " ".join(str(pid) for pid in pids)
    lines = [
        "ps -e -o pid=,pgid=,stat=,pcpu=,rss= | awk -v w="
        + q(wanted)
        + ' \'BEGIN {n=split(w,a," "); for (i=1;i<=n;i++) k[a[i]]=1} '
        '($1 in k) || ($2 in k) {print "P", $1, $2, $3, $4, $5}\''
    ]
    # `read` and the redirection are shell builtins: no process per task (a `$(cat ...)` each
    # made a status of 1,000 tasks take longer than its timeout)
    for pid, path in zip(pids, exit_files, strict=True):
        if path:
            lines.append(f'c=; read -r c < {q(path)} 2>/dev/null; echo "E {pid} $c"')
    return "; ".join(lines) + "; exit 0"


def stream_script(path: str, pid: int) -> str:
    """Follow ``path`` from its first line until task ``pid`` is dead (or zombie), or stdin ends.

    ``tail --pid`` alone would wait forever on a zombie (``kill -0`` succeeds on it), so tail
    watches a small watcher loop instead, which ends when the task's ``ps`` state is empty or Z.
    A second helper reads our stdin: when the caller closes it (LogStream.stop), it ends tail.
    Background jobs get /dev/null as stdin, hence the copy of fd 0 to fd 3 first.
    """
    return (
        "exec 3<&0; "
        f"( while :; do case \"$(ps -o stat= -p {pid} 2>/dev/null)\" in ''|*Z*) exit 0;; esac; "
        f"sleep {STREAM_POLL_SECS}; done ) </dev/null >/dev/null 2>&1 & w=$!; "
        f"tail -n +1 -s 0.1 -F --pid=$w {q(path)} 2>/dev/null </dev/null & t=$!; "
        "( cat <&3 >/dev/null 2>&1; kill $t $w 2>/dev/null ) >/dev/null 2>&1 & "
        "exec 3<&-; wait $t; exit 0"
    )


def write_file_script(path: str) -> str:
    """Write stdin to ``path`` atomically (temp file in the same folder, then rename).

    The temporary name ends in the shell's PID (``$$``, left unescaped so that it expands), so
    two writers of the same file never share a temporary file.
    """
    parent = path.rsplit("/", 1)[0] or "/"
    tmp = f"{_dq(parent)}/.{_dq(path.rsplit('/', 1)[-1])}.tmp.$$"
    return (
        f'mkdir -p {q(parent)} && cat > "{tmp}" && mv -f "{tmp}" {q(path)} '
        f'|| {{ rm -f "{tmp}"; exit 1; }}'
    )


def move_script(source: str, target: str) -> str:
    """Rename ``source`` to ``target`` when it exists (a missing source is not an error)."""
    return f"if [ -e {q(source)} ]; then mv -f {q(source)} {q(target)}; fi"


def moves_script(moves: Sequence[tuple[str, str]]) -> str:
    """Several renames, in order, each as :func:`move_script`; stops at the first failure."""
    return " && ".join(f"{{ {move_script(s, t)}; }}" for s, t in moves) or "true"


def put_tree_script(remote_dir: str) -> str:
    """Unpack a gzipped tar from stdin so that ``remote_dir`` holds exactly its contents.

    Unpacks beside the target and swaps with two renames, so readers never see half a tree.
    Several hosts may share the folder (NFS, or network namespaces on one machine) and copy
    the same tree at once: a swap that loses the race to another writer is simply retried.
    """
    d = remote_dir.rstrip("/")
    return (
        f'new="{_dq(d)}.new.$$"; old="{_dq(d)}.old.$$"; '
        'rm -rf "$new" && mkdir -p "$new" && tar -xzf - -C "$new" || { rm -rf "$new"; exit 1; }; '
        "i=0; while [ $i -lt 50 ]; do i=$((i+1)); "
        f'if [ -e {q(d)} ]; then mv -T {q(d)} "$old" 2>/dev/null || {{ sleep 0.1; continue; }}; fi; '
        f'if mv -T "$new" {q(d)} 2>/dev/null; then rm -rf "$old"; exit 0; fi; '
        'rm -rf "$old"; sleep 0.1; done; '
        f'rm -rf "$new" "$old"; echo "could not swap in {_dq(d)}" >&2; exit 1'
    )


def read_script(path: str, offset: int, max_bytes: int, missing_ok: bool) -> str:
    """Print the start offset, then up to ``max_bytes`` of ``path`` from it, base64 encoded.

    A negative ``offset`` counts from the end of the file (``-4096``: the last 4 KiB). A missing
    file exits with status 3, unless ``missing_ok`` (then it reads as empty).
    """
    first = "0" if offset < 0 else str(offset)
    missing = f"echo {first}; exit 0" if missing_ok else "echo 'no such file' >&2; exit 3"
    if offset < 0:
        n = -offset
        start = f"size=$(wc -c < {q(path)}) || exit 1; start=$((size > {n} ? size - {n} : 0))"
    else:
        start = f"start={offset}"
    return (
        f"[ -e {q(path)} ] || {{ {missing}; }}; {start}; echo $start; "
        f"tail -c +$((start + 1)) {q(path)} | head -c {max_bytes} | base64"
    )


# Prints, per file given, a line: its tail base64-encoded (empty for a missing file).
_TAILS_CODE = (
    "import base64,os,sys\n"
    "n=int(sys.argv[1])\n"
    "for p in sys.argv[2:]:\n"
    "  try:\n"
    "    f=open(p,'rb'); f.seek(max(0,os.fstat(f.fileno()).st_size-n)); d=f.read(n); f.close()\n"
    "  except OSError:\n"
    "    d=b''\n"
    "  sys.stdout.write(base64.b64encode(d).decode()+'\\n')\n"
)


# Prints the kernel's out-of-memory kills since a unix time, one JSON list: /dev/kmsg (root),
# else `dmesg` (kernel.dmesg_restrict=0); [] when neither can be read. A kill the kernel
# attributes (its ``oom-kill:`` line) names the memory cgroup whose limit was reached
# (``memcg``; "" for the host's own want of memory) and the victim's own (``task_memcg``).
_OOM_CODE = r"""
import json, os, re, subprocess, sys, time
since = float(sys.argv[1])
pat = re.compile(r"Killed process (\d+) \(([^)]*)\).*?anon-rss:(\d+)kB(?:, file-rss:(\d+)kB)?")
now_unix, now_mono = time.time(), time.clock_gettime(time.CLOCK_MONOTONIC)
lines = []
try:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    while True:
        try:
            rec = os.read(fd, 8192).decode(errors="replace")
        except BlockingIOError:
            break
        except OSError:
            continue
        head, _, text = rec.partition(";")
        parts = head.split(",")
        if len(parts) >= 3:
            lines.append((int(parts[2]) / 1e6, text))
    os.close(fd)
except OSError:
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        m = re.match(r"\[\s*([\d.]+)\]\s*(.*)", line)
        if m:
            lines.append((float(m.group(1)), m.group(2)))
memcg = re.compile(r"oom-kill:(.*?)task_memcg=([^,]*),.*?pid=(\d+)")
limit = re.compile(r"oom_memcg=([^,]*)")
groups = {}
found = []
for mono, text in lines:
    g = memcg.search(text)
    if g:  # a kill for the host's want of memory (global_oom) names no oom_memcg: ""
        reached = limit.search(g.group(1))
        groups[int(g.group(3))] = (reached.group(1) if reached else "", g.group(2))
    m = pat.search(text)
    at = now_unix - (now_mono - mono)
    if m and at >= since - 1:
        rss = (int(m.group(3)) + int(m.group(4) or 0)) * 1024
        kill = {"pid": int(m.group(1)), "name": m.group(2), "rss": rss, "at": at}
        if int(m.group(1)) in groups:  # the memory cgroup whose limit was reached, and its own
            kill["memcg"], kill["task_memcg"] = groups[int(m.group(1))]
        found.append(kill)
print(json.dumps(found))
"""


def oom_script(python: str, since: float) -> str:
    """The kernel's out-of-memory kills since ``since`` (unix time), as one JSON list."""
    return f"{q(python)} -c {q(_OOM_CODE)} {since:.3f}"


def tails_script(python: str, paths: Sequence[str], max_bytes: int) -> str:
    """The last ``max_bytes`` of each file, in one process (the host's Python): a line per
    file, its tail base64 encoded (empty for a missing file)."""
    return f"{q(python)} -c {q(_TAILS_CODE)} {max_bytes} " + " ".join(q(p) for p in paths)


def parse_tails(text: str, count: int) -> list[bytes]:
    """What :func:`tails_script` printed, one entry per file (b"" for a missing one)."""
    lines = text.splitlines()
    if len(lines) != count:
        raise ValueError(f"expected {count} tails, got {len(lines)} lines")
    return [base64.b64decode(line) for line in lines]


def _dq(value: str) -> str:
    """Escape for the inside of a double-quoted sh string (so ``$$`` can still expand)."""
    out = []
    for ch in value:
        if ch in '\\"$`':
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


SHARED_MARKER = ".tfplan-shared-"


def marker_script(folder: str, token: str, content: str) -> str:
    """Create ``<folder>/.tfplan-shared-<token>`` holding ``content`` unless it exists, then
    print what it holds. On a folder several hosts share, each prints the first writer's.

    ``set -C`` (noclobber) creates with ``O_EXCL``; a host that lost the race may find the file
    still empty, so it waits (up to 5 s) for the winner's content.
    """
    marker = f"{folder.rstrip('/')}/{SHARED_MARKER}{token}"
    return (
        f"mkdir -p {q(folder)} || exit 1; "
        f"( set -C; printf '%s' {q(content)} > {q(marker)} ) 2>/dev/null; "
        f"i=0; while [ ! -s {q(marker)} ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; "
        f"cat {q(marker)}"
    )


def pack_tree_script(folder: str, skip: Sequence[str], prune: Sequence[str], max_kib: int) -> str:
    """A gzipped tar (base64) of the files under ``folder``, leaving out names matching a
    ``skip`` pattern, the subfolders ``prune`` and files of ``max_kib`` KiB or more. A missing
    folder exits with status 3."""
    pruned = " ".join(f"-path {q('./' + p)} -prune -o" for p in prune)
    names = " ".join(f"! -name {q(p)}" for p in skip)
    return (
        f"[ -d {q(folder)} ] || exit 3; cd {q(folder)} || exit 1; "
        f"find . {pruned} -type f {names} -size -{max_kib}k -print0 "
        "| tar --null -czf - -T - 2>/dev/null | base64"
    )


# The kernel's TCP socket tables (IPv4 and IPv6); a socket in state 0A is listening.
LISTENING_SCRIPT = "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; true"


def listening_ports(table: str) -> set[int]:
    """The ports listened on, from :data:`LISTENING_SCRIPT`'s output
    (``sl local_address rem_address st ...``, addresses as ``HEXIP:HEXPORT``)."""
    ports: set[int] = set()
    for line in table.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A" and ":" in fields[1]:
            try:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
            except ValueError:
                continue
    return ports


def fork_script(
    requests: str,
    token: str,
    pgid: int,
    wait_secs: float,
    import_secs: float,
    taken_secs: float = 20.0,
) -> str:
    """Ask a warm seed (:mod:`.seed_agent`) for a task: write stdin as ``<requests>/<token>.json``
    atomically, wake the seed's group with SIGUSR1 once it is ready (``ready`` beside
    ``requests``: before, a signal could end a seed that has not blocked it yet, and the seed
    reads what is waiting as soon as it is ready), and print its answer (a PID, or
    ``error: ...``) once it is there. Exits 3 when the seed's group is gone, 4 when it did not
    become ready within ``import_secs`` or did not answer within ``wait_secs`` of being ready
    (``taken_secs`` more when it had taken the request by then: it is forking it).
    While the seed imports it looks every 0.2 s, then every 10 ms, and whether the seed's group
    is still there every half second (a seed that died after ready is not waited for). A seed
    still importing is waited for rather than raced: a cold start would import the same modules
    beside it, and on a loaded host both would take longer."""
    request = f"{requests}/{token}.json"
    answer = f"{requests}/{token}.pid"
    ready = f"{posixpath.dirname(requests)}/ready"
    gone = f"rm -f {q(request)}; echo 'is gone' >&2; exit 3;"
    tries = max(int(wait_secs / 0.01), 1)
    looks = max(int(import_secs / 0.2), 1)
    late = f"rm -f {q(request)}; echo '{{}}' >&2; exit 4;"
    # Past the wait, a request still there was never taken: removed, the caller may start the
    # task cold. One already taken is being forked (the seed removes it first): its answer comes
    # once the child leads its own group, and is waited for, or a cold start beside the forked
    # one would run the task twice (the second untracked, holding its port).
    untaken = (
        f"rm {q(request)} 2>/dev/null && "
        f"{{ echo 'did not answer within {wait_secs:.0f}s' >&2; exit 4; }};"
    )
    taken_tries = max(int(taken_secs / 0.01), 1)
    taken = f"echo 'took the request but did not answer within {taken_secs:.0f}s more' >&2; exit 4;"
    return (
        write_file_script(request)
        + f" && s=0; i=0; j=0; while [ ! -s {q(answer)} ]; do "
        + f"if [ -e {q(ready)} ]; then "
        + f'[ "$i" -gt {tries} ] && {{ {untaken} '
        + f'[ "$i" -gt {tries + taken_tries} ] && {{ {taken} }}; }}; '
        + f'[ "$s" = 0 ] && {{ kill -USR1 -{pgid} 2>/dev/null || {{ {gone} }}; s=1; }}; '
        + f"[ $((i % 50)) = 49 ] && {{ kill -0 -{pgid} 2>/dev/null || {{ {gone} }}; }}; "
        + "i=$((i+1)); sleep 0.01; "
        + f'else [ "$j" -gt {looks} ] && {{ {late.format(f"was still importing after {import_secs:.0f}s")} }}; '
        + f"kill -0 -{pgid} 2>/dev/null || {{ {gone} }}; j=$((j+1)); sleep 0.2; fi; done; "
        + f"cat {q(answer)}; rm -f {q(answer)}"
    )
