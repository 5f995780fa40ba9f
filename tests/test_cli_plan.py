"""`tfplan plan` and `tfplan show`: real subprocesses for the main paths, in-process for errors;
and what every command shares: -e ID or experiment.id=ID, the user's own config groups, the step
bar."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from state_helpers import state_from

from tfplan.cli.main import main
from tfplan.engine.store import StateStore
from tfplan.planning.plan import PLAN_FORMAT_VERSION, Plan

_ENV_KEYS = ("TFPLAN_WORKSPACE", "TFPLAN_CONF", "TFPLAN_DEBUG")


def tfplan(cwd: Path, *args: str, debug: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV_KEYS}
    if debug:
        env["TFPLAN_DEBUG"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "tfplan", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for key in _ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    return tmp_path


# --- real subprocesses --------------------------------------------------------------------------


def test_plan_saves_and_show_json_prints_the_same_plan(tmp_path: Path) -> None:
    proc = tfplan(tmp_path, "plan", "cluster=3node", "algo=downpour")
    assert proc.returncode == 0, proc.stderr
    assert "Plan: 6 to add, 0 to change, 0 to destroy." in proc.stdout
    assert "\x1b[" not in proc.stdout  # not a terminal: plain text
    saved = tmp_path / ".tfplan" / "plan.json"
    plan = Plan.from_json(saved.read_text())
    assert plan.cluster_name == "3node" and len(plan.tasks) == 6
    shown = tfplan(tmp_path, "show", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == json.loads(saved.read_text())


def test_out_file_detailed_exitcode_and_show_file(tmp_path: Path) -> None:
    proc = tfplan(tmp_path, "plan", "cluster=local", "-out", "my.plan", "--detailed-exitcode")
    assert proc.returncode == 2, proc.stderr  # changes to make
    assert "tfplan apply my.plan" in proc.stdout
    assert not (tmp_path / ".tfplan" / "plan.json").exists()
    shown = tfplan(tmp_path, "show", "my.plan", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == json.loads((tmp_path / "my.plan").read_text())
    text = tfplan(tmp_path, "show", "my.plan")
    assert "Plan: 3 to add, 0 to change, 0 to destroy." in text.stdout


def test_detailed_exitcode_is_0_when_the_state_matches(tmp_path: Path) -> None:
    first = tfplan(tmp_path, "plan", "cluster=local", "--json", "--no-save")
    assert first.returncode == 0, first.stderr
    plan = Plan.from_json(first.stdout)
    # "succeeded" tasks match without a refresh reaching out to their (fake) processes
    state = state_from(plan, status="succeeded", serial=0, lineage="L")
    state = replace(state, tasks=tuple(replace(t, exit_code=0) for t in state.tasks))
    StateStore(tmp_path / ".tfplan" / "default").write(state)
    same = tfplan(tmp_path, "plan", "cluster=local", "--detailed-exitcode")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "No changes. Your cluster matches the configuration." in same.stdout
    saved = Plan.from_json((tmp_path / ".tfplan" / "plan.json").read_text())
    assert (saved.state_lineage, saved.state_serial) == ("L", 1)
    changed = tfplan(tmp_path, "plan", "cluster=local", "algo.lr=0.5", "--detailed-exitcode")
    assert changed.returncode == 2
    assert "the run config changed" in changed.stdout


def test_cfg_job_prints_the_composed_yaml(tmp_path: Path) -> None:
    proc = tfplan(tmp_path, "plan", "--cfg", "job", "cluster=3node", "algo=sync")
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["cluster"]["name"] == "3node" and cfg["algo"]["name"] == "sync"
    assert cfg["cluster"]["output_dir"] == "/shared/tfplan/default"  # interpolations resolved
    assert not (tmp_path / ".tfplan").exists()


def test_errors_are_one_line_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = tfplan(tmp_path, "plan", "algo=downpour", "algo.window=0")
    assert proc.returncode == 1
    assert proc.stderr == "error: algo.window: 0 < 1; use a window of at least 1 step\n"
    assert proc.stdout == "" and not (tmp_path / ".tfplan").exists()
    debug = tfplan(tmp_path, "plan", "algo=downpour", "algo.window=0", debug=True)
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert "tfplan.errors.ConfigError: algo.window: 0 < 1" in debug.stderr


def test_plan_does_not_import_tensorflow(tmp_path: Path) -> None:
    code = (
        "import sys; from tfplan.cli.main import main; "
        "rc = main(['plan', 'cluster=3node', 'algo=downpour']); "
        "assert rc == 0, rc; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')); "
        "print('TF' if bad else 'NO-TF', bad[:3])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "NO-TF []"


# --- bad input, in-process ----------------------------------------------------------------------

BAD_INPUT = [
    # (overrides, the error's start, a fragment of the fix)
    (
        ["cluster=nope"],
        "cluster: no option 'nope'",
        "available options: 3node, gpu2x4, k8s, local, local_allreduce, local_chief",
    ),
    (["cluster.foo=1"], "cluster.foo: no such key", "check the spelling"),
    # a + adds keys to mappings only: on a node with a schema the key would be dropped silently
    (["+cluster.foo=1"], "cluster.foo: no such key (a + adds keys only to mappings", "spelling"),
    (["recipe.env.X=1"], "recipe.env.X: no such key", "add a new key with +recipe.env.X=VALUE"),
    (
        ["cluster=k8s", "cluster.firewall=true"],
        "cluster.firewall: the kubernetes backend cannot install firewall rules",
        "NetworkPolicy",
    ),
    (["cluster.backend=nosuch"], "cluster.backend: unknown backend 'nosuch'", "available: "),
    (["algo.window=3"], "algo.window: no such key", "check the spelling"),  # hogwild has none
    (
        ["cluster.port_base=abc"],
        "cluster.port_base: Value 'abc' of type 'str' could not be converted to Integer",
        "--cfg job",
    ),
    (
        ["cluster.chief=boss"],
        "cluster.chief: Invalid value 'boss', expected one of [worker0, separate]",
        "fix the value",
    ),
    (["algo=downpour", "algo.window=0"], "algo.window: 0 < 1", "at least 1 step"),
    (["cluster.workers=20"], "cluster.hosts: no free slot for worker/7", "raise cluster.hosts[i]"),
    (
        ["algo=sync", "algo.replicas_to_aggregate=3"],
        "algo.replicas_to_aggregate: 3 but the cluster has 2 training replicas",
        "use 1-2, or raise cluster.workers",
    ),
    (
        ["algo=sync", "algo.backup_workers=2"],
        "algo.backup_workers: 2 backups with only 2",
        "keep backup_workers below",
    ),
    (
        ["cluster.port_base=80"],
        "cluster.port_base: ports 80-179 are outside 1024-65535",
        "pick a port_base",
    ),
    (["cluster.port_offset=63300"], "cluster.port_base: ports 65522-65621", "port_offset"),
    (["data=mnist", "data.path=null"], "data.path: mnist_npz needs a file path", "set data.path="),
    (
        ["data=mnist", "data.name=mnist", "data.path=null"],
        "data.path: mnist needs a file path",
        "set data.path=",
    ),
    (["data.name=cifar"], "data.name: unknown data set 'cifar'", "choose one of digits, mnist,"),
    (["recipe=command"], "recipe.command: is empty", 'recipe.command="python train.py'),
    (["experiment.id=../etc"], "experiment.id: '../etc' is not a plain name", "letters, digits"),
    (
        ["cluster.hosts=[{address:10.0.0.1,name:a},{address:10.0.0.2,name:a}]"],
        "cluster.hosts[1].name: host 'a' appears twice",
        "unique name",
    ),
    (["cluster.ps=0"], "cluster.ps: 0 parameter servers", "at least 1 (or per_host)"),
    (["cluster.workers=per_gpu"], "cluster.workers: per_gpu but no host has gpus", "gpus"),
    (
        ["cluster=3node", "cluster.output_dir=out"],
        "cluster.output_dir: relative path 'out'",
        "absolute folder that every host shares",
    ),
    (["algo.optimizer=lbfgs"], "algo.optimizer: unknown optimizer 'lbfgs'", "choose one of sgd"),
]


@pytest.mark.parametrize(("overrides", "start", "fix"), BAD_INPUT, ids=lambda v: str(v)[:40])
def test_bad_input_is_one_line_naming_the_key_and_writes_nothing(
    overrides: list[str], start: str, fix: str, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *overrides]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: {start}") and err.endswith("\n")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert fix in err
    assert "schema_" not in err
    assert list(in_tmp.iterdir()) == []  # no .tfplan/plan.json, nothing at all


def test_cfg_job_with_a_bad_override_is_an_error_too(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--cfg", "job", "cluster=nope"]) == 1
    assert capsys.readouterr().err.startswith("error: cluster: no option 'nope'")


def _show_error(path: Path | None, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["show", *([str(path)] if path else [])]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_show_without_a_plan_file(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _show_error(None, capsys)
    assert err.startswith(f"error: no plan file at {in_tmp / '.tfplan' / 'plan.json'}")
    assert "run `tfplan plan` first" in err
    assert "no plan file at" in _show_error(in_tmp / "missing.json", capsys)


def test_show_refuses_another_format_or_a_damaged_file(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "cluster=local", "-out", "p.json"]) == 0
    capsys.readouterr()
    data = json.loads((in_tmp / "p.json").read_text())
    data["format_version"] = PLAN_FORMAT_VERSION + 1
    (in_tmp / "old.json").write_text(json.dumps(data))
    err = _show_error(in_tmp / "old.json", capsys)
    assert (
        f"is not a tfplan plan file of format {PLAN_FORMAT_VERSION} (found {PLAN_FORMAT_VERSION + 1})"
        in err
    )
    assert "run `tfplan plan` again" in err
    (in_tmp / "junk.json").write_text("{not json")
    assert "cannot read plan file" in _show_error(in_tmp / "junk.json", capsys)
    del data["tasks"]
    data["format_version"] = PLAN_FORMAT_VERSION
    (in_tmp / "cut.json").write_text(json.dumps(data))
    assert "is damaged" in _show_error(in_tmp / "cut.json", capsys)


def test_overrides_may_stand_on_both_sides_of_an_option(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "cluster=3node", "--no-save", "--json", "algo=sync"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["cluster_name"] == "3node" and plan["run_config"]["algo"]["name"] == "sync"
    assert not (in_tmp / ".tfplan" / "plan.json").exists()
    with pytest.raises(SystemExit):
        main(["plan", "cluster=local", "--bogus", "algo=sync"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_a_reader_that_goes_away_is_not_a_traceback(tmp_path: Path) -> None:
    assert tfplan(tmp_path, "plan", "cluster=3node").returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in _ENV_KEYS}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfplan", "show", "--json"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| head` exiting before tfplan writes
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_the_tabular_examples_factory_command_plans_from_its_folder(tmp_path: Path) -> None:
    """examples/tabular/README.md's factory command, run from the example's folder: the data
    factory's package is found in recipe.code_dir (the current folder) as the model's is, by
    the one importer the tasks use, not only when PYTHONPATH names the folder."""
    example = tmp_path / "tabular"
    shutil.copytree(Path(__file__).resolve().parent.parent / "examples" / "tabular", example)
    args = ("model._target_=tabular.models.build", "data._target_=tabular.data.make")
    done = tfplan(example, "plan", "--no-save", *args, "algo=allreduce", "cluster.ps=0")
    assert done.returncode == 0, done.stderr
    assert "Data: factory: tabular.data.make shards its own data" in done.stdout
    # and a factory that is nowhere is still one line naming the key and the fix
    done = tfplan(example, "plan", "--no-save", "data._target_=nowhere_pkg.data.make")
    assert done.returncode != 0
    assert "data._target_" in done.stderr and "recipe.code_dir" in done.stderr, done.stderr


# --- -e ID and experiment.id=ID, alike for every command ---------------------------------------


@pytest.mark.parametrize(
    "words",
    [["status"], ["logs"], ["logs", "worker/1"], ["watch"], ["destroy"], ["explain"]],
    ids=" ".join,
)
def test_every_command_of_an_experiment_takes_experiment_id_as_plan_does(
    words: list[str], in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*words, "experiment.id=nope"]) == 1
    by_word = capsys.readouterr()
    assert main([*words, "-e", "nope"]) == 1
    assert capsys.readouterr() == by_word
    assert by_word.out == ""
    assert by_word.err == (
        f"error: experiment 'nope' has no state in {in_tmp / '.tfplan'}: nothing was applied\n"
    )
    assert main([*words, "-e", "nope", "experiment.id=nope"]) == 1  # the same id twice: fine
    assert capsys.readouterr() == by_word
    assert main([*words, "-e", "first", "experiment.id=second"]) == 1
    assert capsys.readouterr().err == (
        "error: experiment.id: -e first and experiment.id=second name different experiments; "
        "give the id once, as -e ID or experiment.id=ID\n"
    )


def test_plan_and_apply_take_e_as_experiment_id(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "-e", "first", "--no-save", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["experiment_id"] == "first"
    assert main(["plan", "experiment.id=first", "-e", "first", "--no-save", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["experiment_id"] == "first"
    for verb in ("plan", "apply"):
        assert main([verb, "-e", "first", "experiment.id=second"]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err == (
            "error: experiment.id: -e first and experiment.id=second name different "
            "experiments; give the id once, as -e ID or experiment.id=ID\n"
        )
    # apply -e ID plans experiment.id=ID, shows it and asks (no terminal here: refused)
    assert main(["apply", "-e", "first"]) == 1
    out, err = capsys.readouterr()
    assert 'tfplan plan for experiment "first"' in out
    assert err == "error: this needs approval and stdin is not a terminal: pass --auto-approve\n"
    assert list(in_tmp.iterdir()) == []


def test_tensorboard_and_export_model_take_the_experiment_either_way(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    errors = set()
    for words in (["nope"], ["-e", "nope"], ["experiment.id=nope"]):
        assert main(["tensorboard", *words]) == 1
        errors.add(capsys.readouterr().err)
    assert errors == {
        f"error: no experiment or sweep 'nope' in {in_tmp / '.tfplan'} (known: none yet); "
        "give its id or its folder\n"
    }
    assert main(["tensorboard", "other", "experiment.id=nope"]) == 1
    assert capsys.readouterr().err.startswith("error: experiment.id: TARGET other and experiment")
    errors.clear()
    for words in (["-e", "nope"], ["experiment.id=nope"]):  # export model names an experiment
        assert main(["export", "model", *words]) == 1
        errors.add(capsys.readouterr().err)
    assert len(errors) == 1 and errors.pop().startswith("error: no experiment 'nope' in")


# --- the user's own config groups: ./conf (or --config-dir) over tfplan's ----------------------


def _cluster_file(port_base: int) -> str:
    local = Path(__file__).resolve().parent.parent / "conf" / "cluster" / "local.yaml"
    text = local.read_text()
    assert "port_base: 2222\n" in text
    return text.replace("port_base: 2222\n", f"port_base: {port_base}\n")


def _ports(plan: dict[str, object]) -> list[int]:
    tasks = plan["tasks"]
    assert isinstance(tasks, list)
    return sorted(int(t["port"]) for t in tasks)


def test_a_conf_folder_adds_the_users_groups_without_a_config_yaml(tmp_path: Path) -> None:
    (tmp_path / "conf" / "cluster").mkdir(parents=True)
    (tmp_path / "conf" / "cluster" / "mine.yaml").write_text(_cluster_file(23456))
    done = tfplan(tmp_path, "plan", "cluster=mine", "--json", "--no-save")
    assert done.returncode == 0, done.stderr
    assert _ports(json.loads(done.stdout)) == [23456, 23457, 23458]
    wrong = tfplan(tmp_path, "plan", "cluster=nope", "--no-save")
    assert wrong.stderr == (
        "error: cluster: no option 'nope'; available options: 3node, gpu2x4, k8s, local, "
        "local_allreduce, local_chief, mine, slurm, spark\n"
    )


def test_the_users_file_wins_and_config_dir_and_sweeps_find_the_groups_too(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (in_tmp / "conf" / "cluster").mkdir(parents=True)
    (in_tmp / "conf" / "cluster" / "local.yaml").write_text(_cluster_file(23500))
    assert main(["plan", "--json", "--no-save"]) == 0  # config.yaml's default: cluster=local
    assert _ports(json.loads(capsys.readouterr().out)) == [23500, 23501, 23502]
    (in_tmp / "groups" / "cluster").mkdir(parents=True)
    (in_tmp / "groups" / "cluster" / "mine.yaml").write_text(_cluster_file(23600))
    assert main(["plan", "--config-dir", "groups", "cluster=mine", "--json", "--no-save"]) == 0
    assert _ports(json.loads(capsys.readouterr().out)) == [23600, 23601, 23602]
    assert main(["plan", "--config-dir", "groups", "-m", "cluster=mine", "algo.lr=0.1,0.2"]) == 0
    assert "ports 23600-23602" in capsys.readouterr().out
    assert main(["plan", "--config-dir", "nowhere", "--no-save"]) == 1
    assert capsys.readouterr().err == (
        f"error: --config-dir: no folder {in_tmp / 'nowhere'}; give the folder of your own "
        "config groups (e.g. conf/ holding cluster/mine.yaml)\n"
    )


# --- apply's step bar --------------------------------------------------------------------------


def test_the_step_bar_ends_at_max_steps_and_says_the_true_step() -> None:
    import io
    import re

    from rich.console import Console

    from tfplan.cli.output import shown_step, step_progress

    assert shown_step(120, 300) == (120, "")
    assert shown_step(300, 300) == (300, "")
    assert shown_step(305, 300) == (300, " (global step 305)")
    assert shown_step(305, None) == (305, "")  # watch: no total to stop at
    screen = io.StringIO()
    with step_progress(Console(file=screen, force_terminal=True, width=100), 300) as on_step:
        on_step(120)
        on_step(305)
    frames = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue()).split("\r")
    last = [f for f in frames if "global step" in f][-1]
    assert "300/300 (global step 305)" in last and "305/300" not in screen.getvalue()


def test_the_report_says_each_ps_recovery_in_words() -> None:
    from tfplan.cli.output import recoveries_line

    recoveries = [
        {"ps": 0, "source": "snapshot", "step": 4812, "lost_steps": 6},
        {"ps": 1, "source": "checkpoint", "step": 4600, "lost_steps": None},
        {"ps": 0, "source": "initial values", "step": 0, "lost_steps": 12},
        {"ps": 1, "source": "snapshot", "step": 5000, "lost_steps": None, "copy_on": "10.0.0.2"},
    ]
    assert recoveries_line(recoveries) == (
        "Parameter servers recovered while training: ps/0 from its snapshot of step 4,812, "
        "6 steps lost; ps/1 from its checkpoint of step 4,600; "
        "ps/0 from its initial values, 12 steps lost; "
        "ps/1 from its snapshot of step 5,000 (its copy on 10.0.0.2)"
    )
    assert recoveries_line([]) is None and recoveries_line(None) is None
