"""Slurm's own commands (sbatch, squeue, scancel, scontrol, sinfo), run and parsed.

Every call has a timeout and turns a failure into a one-line :class:`BackendError` quoting the
tool's last line of stderr. The cluster is found the way Slurm's tools find it (``SLURM_CONF``
or /etc/slurm/slurm.conf). Behaviours relied on are measured in docs/slurm_notes.md.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from tfplan.errors import BackendError

__all__ = ["JobState", "Slurm", "SlurmUnreachable"]

TIMEOUT_SECS = 30.0
GONE = "Invalid job id specified"  # squeue's words for a job that ended long ago
_STEP_LINE = re.compile(r"^(\d+)\.(\S+)\s+(.*)$")


class SlurmUnreachable(BackendError):
    """Slurm's commands are missing or the controller does not answer."""


@dataclass(frozen=True)
class JobState:
    state: str  # PENDING, RUNNING, COMPLETING, CANCELLED, ... ; "" when the job is gone
    reason: str  # why it pends ("Resources", "Priority", "PartitionConfig", ...)
    nodes: str  # compressed node list, "n[1-3]"

    @property
    def gone(self) -> bool:
        return self.state == ""


class Slurm:
    """The commands, with the environment they run in (``SLURM_CONF`` etc. inherited)."""

    def __init__(self, timeout: float = TIMEOUT_SECS) -> None:
        self.timeout = timeout

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command.

        Raises:
            SlurmUnreachable: the command is not installed, or timed out.
            BackendError: it failed (with ``check``), quoting its stderr.
        """
        if shutil.which(argv[0]) is None:
            raise SlurmUnreachable(
                f"Slurm's {argv[0]} is not installed here: run tfplan on a Slurm submit host "
                "(or install slurm-client and point SLURM_CONF at the cluster's slurm.conf)"
            )
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise SlurmUnreachable(
                f"{argv[0]} did not answer in {self.timeout:.0f}s: is slurmctld up?"
            ) from None
        if check and done.returncode != 0:
            raise BackendError(f"{argv[0]} failed: {last_line(done.stderr or done.stdout)}")
        return done

    # ---- the cluster ---------------------------------------------------------------------
    def ping(self) -> None:
        """Raises SlurmUnreachable when the controller does not answer. ``scontrol ping`` says
        so at once (`Slurmctld(primary) at HOST is DOWN`, exit 1), where sinfo and squeue
        retry for 9 s first (docs/slurm_notes.md)."""
        done = self.run("scontrol", "ping", check=False)
        if done.returncode != 0:
            raise SlurmUnreachable(
                f"Slurm is not reachable ({last_line(done.stderr)}): check SLURM_CONF and "
                "that slurmctld runs"
            )

    def partitions(self) -> list[str]:
        """Partition names; the default one carries a ``*`` in sinfo, removed here."""
        out = self.run("sinfo", "-h", "-o", "%P").stdout
        return sorted({p.strip().rstrip("*") for p in out.split() if p.strip()})

    def test_only(self, options: Sequence[str]) -> str | None:
        """``sbatch --test-only``: None when the request could run, else Slurm's reason."""
        done = self.run("sbatch", "--test-only", *options, "--wrap", "true", check=False)
        if done.returncode == 0:
            return None
        return last_line(done.stderr or done.stdout)

    # ---- jobs ----------------------------------------------------------------------------
    def submit(self, options: Sequence[str], script: str) -> str:
        """Submit a batch script (``sbatch --parsable``); returns the job id."""
        done = self.run("sbatch", "--parsable", *options, script)
        job = done.stdout.strip().split(";")[0]
        if not job.isdigit():
            raise BackendError(f"sbatch printed no job id: {done.stdout.strip()[:200]!r}")
        return job

    def job(self, job: str) -> JobState:
        """The job's state now; ``gone`` once squeue no longer lists it."""
        done = self.run("squeue", "-h", "-j", job, "-o", "%T|%r|%N", check=False)
        if done.returncode != 0:
            if GONE in done.stderr:
                return JobState("", "", "")
            raise BackendError(f"squeue failed: {last_line(done.stderr)}")
        line = done.stdout.strip().splitlines()[:1]
        if not line:
            return JobState("", "", "")
        state, reason, nodes = (line[0].split("|") + ["", ""])[:3]
        return JobState(state, reason, nodes)

    def final_state(self, job: str) -> str:
        """What became of an ended job (``squeue -t all`` keeps it for MinJobAge), or ""."""
        done = self.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T", check=False)
        return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""

    def hostnames(self, nodelist: str) -> list[str]:
        return self.run("scontrol", "show", "hostnames", nodelist).stdout.split()

    def node_addresses(self, nodes: Sequence[str]) -> dict[str, str]:
        """node -> NodeAddr (the address other nodes reach it at)."""
        out = self.run("scontrol", "-o", "show", "node", ",".join(nodes)).stdout
        found: dict[str, str] = {}
        for line in out.splitlines():
            fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
            if "NodeName" in fields:
                found[fields["NodeName"]] = fields.get("NodeAddr", fields["NodeName"])
        missing = [n for n in nodes if n not in found]
        if missing:
            raise BackendError(f"scontrol shows no address for node(s) {', '.join(missing)}")
        return found

    def steps(self, job: str) -> dict[str, str]:
        """Step name -> step id (``JOB.N``) of the job's running steps."""
        done = self.run("squeue", "-h", "-s", "-j", job, "-o", "%i %j", check=False)
        steps: dict[str, str] = {}
        for line in done.stdout.splitlines():
            match = _STEP_LINE.match(line.strip())
            if match and match.group(2).isdigit():
                steps[match.group(3)] = f"{match.group(1)}.{match.group(2)}"
        return steps

    def cancel(self, ids: Sequence[str], signal: str | None = None) -> None:
        """``scancel`` jobs or steps (``JOB`` / ``JOB.STEP``); with ``signal`` only signal them."""
        if not ids:
            return
        flags = [f"--signal={signal}"] if signal else []
        self.run("scancel", *flags, *ids, check=False)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
