"""Shared pytest fixtures and the two test tiers. Real servers: see tests/testbed.py.

Tiers: ``pytest`` runs the fast tier (every unit test, and at least one real end-to-end run of
every capability); ``pytest --tier=full`` adds the tests marked ``full`` (the chaos suite, every
algorithm and sweep through apply, the other Slurm, namespace and restart scenarios). CI runs the
full tier.

- ``sshd_server`` (session): a :class:`~testbed.LoopbackSshd` (real sshd on 127.0.0.1).
- ``sshd_target`` (session): a HostTarget (kind="ssh") for it, with key and known_hosts.
- ``netns_testbed`` (session): a :class:`~testbed.NetnsTestbed`, three namespaces.
- ``netns_hosts`` (session): its three HostTargets (h1, h2, h3).
- ``slurm_cluster`` (session): a :class:`~slurm_testbed.SlurmTestbed`, a real Slurm cluster
  (munged, slurmctld, slurmd n1..n3 in network namespaces), idle and ready; clients need
  ``env=slurm_cluster.env()`` (SLURM_CONF).
- ``spark_cluster`` (session): a :class:`~spark_testbed.SparkTestbed`, a real Spark standalone
  cluster (a master on a bridge address, workers 0..2 in network namespaces), every worker
  ALIVE; clients need ``env=spark_cluster.env()`` and ``spark.driver.host=driver_host``.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recipe_cluster import stop_warm_seed
from slurm_testbed import SlurmTestbed, slurm_missing
from spark_testbed import SparkTestbed, spark_missing
from testbed import LoopbackSshd, NetnsTestbed  # tests/ is on sys.path (no __init__.py)

from tfplan.backends.transports.specs import HostTarget

# pytest keeps the assertion-rewritten test modules in __pycache__ only where Python may write
# bytecode: with PYTHONDONTWRITEBYTECODE (set on this machine and CI's) every pytest process (each
# xdist worker) rewrote all the test modules again, 7 of its 13 s of collection. The processes the
# tests start keep the environment's setting.
sys.dont_write_bytecode = False

TIERS = ("fast", "full")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier",
        choices=TIERS,
        default="fast",
        help="fast (default): unit tests and one real end-to-end run per capability; "
        "full: everything, including the tests marked 'full' (what CI runs)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background by a shell without job control (`cmd &` in a script)
    # inherits SIGINT ignored, and so would every tfplan it starts: the Ctrl-C tests would send
    # a signal nobody hears. Python's own handler here makes the children start with the default.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # One cache of model inspections for the run (tfplan/engine/model_shapes.py), shared by its
    # workers (they inherit it from the first process) and by every project a test copies: a
    # model built once is read by the later plans of the run, as a user's home keeps it; none
    # from an earlier run, and nothing written into this machine's own cache.
    # The run's shared folder (TFPLAN_TEST_RUN_DIR) also holds the examples' data, written once
    # (apply_helpers.example_with_data).
    # Warm seeds kept between applies (cluster.warm_keep_secs) register there too
    # (TFPLAN_WARM_DIR), and the run's end stops them; a developer's TFPLAN_WARM_KEEP_SECS is
    # not the tests' (a test that keeps a seed says so).
    os.environ.pop("TFPLAN_WARM_KEEP_SECS", None)
    if "TFPLAN_TEST_RUN_DIR" not in os.environ:
        run_dir = tempfile.mkdtemp(prefix="tfplan-test-run-")
        os.environ["TFPLAN_TEST_RUN_DIR"] = run_dir
        os.environ["TFPLAN_CACHE_DIR"] = os.path.join(run_dir, "cache")
        os.environ["TFPLAN_WARM_DIR"] = os.path.join(run_dir, "warm")
        config.add_cleanup(lambda: shutil.rmtree(run_dir, ignore_errors=True))
        config.add_cleanup(lambda: stop_kept_seeds(Path(run_dir) / "warm"))  # runs first


def stop_kept_seeds(root: Path) -> None:
    """End the kept warm seeds the run's applies left under ``root``, by the process groups
    their records name (they would end by themselves once idle)."""
    for record in root.glob("*/*/pgid"):
        try:
            os.killpg(int(record.read_text()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError, OSError):
            pass


# A test that uses a test bed carries its mark, whether or not it says so: CI runs those apart
# (.ci/run, -m "slurm or netns"), and a test bed built by both parts at once would race.
TESTBED_MARKS = {
    "netns_testbed": "netns",
    "netns_hosts": "netns",
    "slurm_cluster": "slurm",
    "spark_cluster": "spark",
}


# With --dist loadgroup (.ci/run, the README) each test goes to whichever worker is free
# (pytest_xdist_make_scheduler below); the tests of these files stay together on one worker: they share a
# module-scoped fixture (built once per file), a set-up that must not run twice at once (the
# TF 2.15 interpreter), or, the documents, the default folders of their fixed experiment ids
# (/tmp/tfplan/lr: the tutorial and the sweeps page both name experiment lr).
ONE_WORKER_FILES = {
    "test_docs.py",
    "test_export.py",
    "test_firewall.py",
    "test_known_failures.py",
    "test_plan_checks.py",
    "test_recipes_inputs.py",
    "test_scale.py",
    "test_tf_config.py",
    "test_user_model_apply.py",
}


# The longest files first (--dist loadgroup): the scheduler hands out work in collection order,
# so a long file (a one-worker group above all) collected late kept one worker busy while the
# other had nothing left: the full tier's last minutes ran at half the machine.
LONGEST_FIRST = (
    "test_spark.py",  # the fast tier's longest test (its test bed's start, then an apply)
    "test_user_model_apply.py",
    "test_docs.py",
    "test_bench_smoke.py",
    "test_known_failures.py",
    "test_sweep.py",
    "test_strategies_cluster.py",
    "test_resize.py",
    "test_chaos.py",
    "test_strategies_apply.py",
    "test_dynamic_apply.py",
    "test_experiments.py",
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: every test to the worker that is free, except that the tests of a
    file in :data:`ONE_WORKER_FILES` go together. Made here, not by ``xdist_group`` marks:
    pytest-xdist 3.8 marks a group by rewriting ``item._nodeid``, which pytest 9.2's ``nodeid``
    no longer reads (the marks were silently ignored and the documents ran on both workers)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerFiles(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if Path(path).name in ONE_WORKER_FILES else nodeid

    return OneWorkerFiles(config, log)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, mark in TESTBED_MARKS.items():
            if fixture in getattr(item, "fixturenames", ()) and not item.get_closest_marker(mark):
                item.add_marker(mark)
    # an xdist worker (which collects what the scheduler hands out) is told dist "no"
    if config.getvalue("dist") == "loadgroup" or hasattr(config, "workerinput"):
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files' order
    if config.getoption("--tier") == "full":
        return
    kept, deselected = [], []
    for item in items:
        (deselected if item.get_closest_marker("full") else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``TFPLAN_TEST_TIMELINE=FILE``: one line per test phase (worker, start, stop,
    phase, test), so a run's timeline shows which tests a stretch of idle CPU ran beside
    (``--durations`` gives lengths, not when)."""
    path = os.environ.get("TFPLAN_TEST_TIMELINE")
    if not path or getattr(report, "node", None) is not None:  # xdist's controller: a copy
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = f"{worker} {report.start:.1f} {report.stop:.1f} {report.when} {report.nodeid}\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    """With ``TFPLAN_TEST_CPU=FILE`` (root, cgroup v1's cpuacct): one line per test, the CPU
    seconds of every process it started (the test process is moved into a cgroup of the test's
    own for its set-up, call and teardown; its children inherit it, sessions and seeds too).
    What a run's wall time cannot say on a busy machine: which tests cost the CPU."""
    path = os.environ.get("TFPLAN_TEST_CPU")
    if not path or not CPUACCT.is_dir() or os.geteuid() != 0:
        yield
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    group = CPUACCT / f"tfplan-test-{os.getpid()}-{abs(hash(item.nodeid))}"
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    try:
        yield
    finally:
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        used = int((group / "cpuacct.usage").read_text()) / 1e9
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{used:.2f} {worker} {item.nodeid}\n")
        try:
            group.rmdir()
        except OSError:  # a process it started lives on (a session-wide bed): its group stays
            pass


def pytest_report_header(config: pytest.Config) -> str:
    if config.getoption("--tier") == "full":
        return "tier: full (every test)"
    return "tier: fast (the tests marked 'full' run with --tier=full)"


@pytest.fixture(scope="session", autouse=True)
def recipe_clusters_seed() -> Iterator[None]:
    """The warm seed tests/recipe_cluster.py forks its tasks from (one per test process, started
    on first use) is stopped at the session's end, by its process group."""
    yield
    stop_warm_seed()


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


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmTestbed]:
    """One real Slurm cluster shared by every Slurm test of the run."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm test bed needs root for network namespaces (CI runs as root)")
    missing = slurm_missing()
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)}): run scripts/setup.sh")
    bed = SlurmTestbed(tmp_path_factory.mktemp("slurm"))
    try:
        try:
            bed.start()
            bed.wait_ready()
        except Exception as exc:  # noqa: BLE001 - we are root: this must fail, loudly
            pytest.fail(f"could not build the Slurm test bed as root: {exc}")
        yield bed
    finally:
        problems = bed.stop()
        if problems:
            print("Slurm test bed teardown problems:", "; ".join(problems))


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkTestbed]:
    """One real Spark standalone cluster shared by every Spark test of the run."""
    if os.geteuid() != 0:
        pytest.skip("the Spark test bed needs root for network namespaces (CI runs as root)")
    missing = spark_missing()
    if missing:
        pytest.fail(f"Spark is not installed ({', '.join(missing)}): run scripts/setup.sh")
    bed = SparkTestbed(tmp_path_factory.mktemp("spark"))
    try:
        try:
            bed.start()
        except Exception as exc:  # noqa: BLE001 - we are root: this must fail, loudly
            pytest.fail(f"could not build the Spark test bed as root: {exc}")
        yield bed
    finally:
        problems = bed.stop()
        if problems:
            print("Spark test bed teardown problems:", "; ".join(problems))
