"""A task's memory cgroup on its host: where it lives, how a task enters it, how it is removed.

A task with a memory limit (``cluster.memory``) runs in a memory cgroup of its own, named for
the experiment and the task (:func:`cgroup_name`), created where it starts:

- cgroup v2 (``memory`` in ``/sys/fs/cgroup/cgroup.controllers``): ``/sys/fs/cgroup/tfplan/<name>``,
  ``+memory`` enabled in the ``cgroup.subtree_control`` of the root and of ``tfplan/`` on the
  way; ``memory.max`` the limit, ``memory.swap.max`` 0;
- cgroup v1 (the memory controller mounted at ``/sys/fs/cgroup/memory``): a child of the
  starting process's own memory cgroup (as ``/proc/self/cgroup`` names it; the mount's root
  where that folder is not seen, as in a container); ``memory.limit_in_bytes`` the limit, and
  ``memory.memsw.limit_in_bytes`` the same where swap is accounted (no swap).

A restarted task enters the same group, its limit written again. Two implementations, kept
small and alike: :data:`CGROUP_SH` (the cold start's wrapper, POSIX sh, and preflight's probe)
and ``seed_agent._memory_group`` (a task forked from the warm seed: stdlib Python). Release
removes the groups (:func:`remove_script`): empty once their tasks ended.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from shlex import quote as q

__all__ = [
    "CGROUP_SH",
    "ENTER_FAILED_EXIT",
    "ENTER_SH",
    "cgroup_name",
    "probe_script",
    "remove_script",
]

# The exit status a task records when it could not enter its cgroup (nothing of it ran).
ENTER_FAILED_EXIT = 125
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")

# ``tfplan_cgroup NAME LIMIT [PID]``: create (or reuse) the group, write its limit, move PID
# into it; prints the group's folder, or why not on stderr (status 1).
CGROUP_SH = (
    "tfplan_cgroup() { "
    "if [ -f /sys/fs/cgroup/cgroup.controllers ]; then "
    'case " $(cat /sys/fs/cgroup/cgroup.controllers) " in *" memory "*) ;; '
    "*) echo 'cgroup v2 without the memory controller' >&2; return 1;; esac; "
    "r=/sys/fs/cgroup/tfplan; mkdir -p $r || return 1; "
    "echo +memory > /sys/fs/cgroup/cgroup.subtree_control || return 1; "
    "echo +memory > $r/cgroup.subtree_control || return 1; "
    'g=$r/$1; mkdir -p "$g" && echo "$2" > "$g/memory.max" || return 1; '
    'if [ -f "$g/memory.swap.max" ]; then echo 0 > "$g/memory.swap.max" || return 1; fi; '
    "elif [ -d /sys/fs/cgroup/memory ]; then "
    'o=$(awk -F: \'{n=split($2,c,","); for(i=1;i<=n;i++) if(c[i]=="memory") print $3}\' '
    "/proc/self/cgroup); "
    'p=/sys/fs/cgroup/memory$o; [ -d "$p" ] || p=/sys/fs/cgroup/memory; g=${p%/}/$1; '
    'mkdir -p "$g" || return 1; s="$g/memory.memsw.limit_in_bytes"; '
    '[ -f "$s" ] && echo "$2" 2>/dev/null > "$s"; '  # raised first: memsw >= the limit
    'echo "$2" > "$g/memory.limit_in_bytes" || return 1; '
    'if [ -f "$s" ]; then echo "$2" > "$s" || return 1; fi; '
    "else echo 'no memory cgroup here (neither cgroup v2 nor v1 at /sys/fs/cgroup)' >&2; "
    "return 1; fi; "
    'if [ -n "$3" ]; then echo "$3" > "$g/cgroup.procs" || return 1; fi; '
    "printf '%s\\n' \"$g\"; }; "
)

# In the wrapper: enter the group $TFPLAN_CGROUP of limit $TFPLAN_MEMORY_LIMIT (``$$`` is the
# wrapper, also in the command substitution's subshell) before the task's program starts; the
# status says whether it did, and why not is on stderr (the task's log) as one line.
ENTER_SH = (
    'e=$(tfplan_cgroup "$TFPLAN_CGROUP" "$TFPLAN_MEMORY_LIMIT" $$ 2>&1) || '
    '{ printf "error: could not put the task in its memory cgroup %s (%s): run tfplan as root '
    'on this host, delegate a cgroup to its user, or remove cluster.memory\\n" '
    '"$TFPLAN_CGROUP" "$(printf \'%s\\n\' "$e" | tail -n 1)" >&2; false; }'
)


def cgroup_name(experiment: str, role: str, index: int, standby_attempt: int | None = None) -> str:
    """The task's group on its host: ``tfplan-<experiment>-<role>-<index>`` (anything but
    letters, digits, ``_``, ``.`` and ``-`` as ``_``); a warm standby's has
    ``-standby-<attempt>`` added (it runs beside its task, under a limit of its own)."""
    name = f"tfplan-{_UNSAFE.sub('_', experiment)[:96]}-{role}-{index}"
    return name if standby_attempt is None else f"{name}-standby-{standby_attempt}"


def probe_script(name: str, limit: int) -> str:
    """Create the group ``name`` with ``limit`` as a task would, then remove it: prints
    ``ok``, or why it cannot be made (exit status 0 either way)."""
    return (
        CGROUP_SH
        + f"if g=$(tfplan_cgroup {q(name)} {limit} 2>&1); then "
        + 'rmdir "$(printf \'%s\\n\' "$g" | tail -n 1)"; echo ok; '
        + "else printf '%s\\n' \"${g:-could not create it}\" | tail -n 1; fi"
    )


def remove_script(names: Sequence[str]) -> str:
    """Remove the groups ``names`` (and their standbys' ``<name>-standby-*``) wherever the
    host has them: a group still holding a process is waited for up to 2 s, then left, and
    printed as ``left <folder>``; exit status 0."""
    patterns = " -o ".join(f"-name {q(n)} -o -name {q(n + '-standby-*')}" for n in names)
    return (
        "if [ -f /sys/fs/cgroup/cgroup.controllers ]; then r=/sys/fs/cgroup/tfplan; "
        "else r=/sys/fs/cgroup/memory; fi; "
        '[ -d "$r" ] || exit 0; '
        f'find "$r" -mindepth 1 -depth -type d \\( {patterns} \\) 2>/dev/null | '
        'while read -r g; do i=0; until rmdir "$g" 2>/dev/null; do '
        'i=$((i+1)); [ $i -ge 20 ] && { echo "left $g"; break; }; sleep 0.1; done; done; '
        'if [ "$r" = /sys/fs/cgroup/tfplan ]; then rmdir "$r" 2>/dev/null; fi; exit 0'
    )
