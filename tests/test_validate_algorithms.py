"""Every algorithm's settings checked against itself and the topology, as one-line errors.

Through ``tfplan.cli.main(["plan", ...])`` in-process: the user's view (``error: <key>: ...``, one
line, exit 1, nothing written). Also: the planner, the recipes' registry and ``conf/algo`` list
the same twelve algorithms, and every algorithm plans with its shipped defaults.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.algorithms import available
from recipes.errors import ConfigError
from recipes.strategies import STRATEGIES
from tfplan.cli.main import main
from tfplan.config.algorithms import ALGORITHMS

CONF = Path(__file__).resolve().parent.parent / "conf"
_ENV_KEYS = ("TFPLAN_WORKSPACE", "TFPLAN_CONF", "TFPLAN_DEBUG")


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for key in _ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def test_planner_registry_recipes_and_conf_agree_on_the_fourteen_algorithms() -> None:
    every = sorted(p.stem for p in (CONF / "algo").glob("*.yaml"))
    assert sorted(ALGORITHMS) == sorted([*available(), *STRATEGIES]) == every
    assert len(available()) == 12 and sorted(STRATEGIES) == ["allreduce", "pss"]


@pytest.mark.parametrize(
    "overrides,schema",
    [(["algo=allreduce"], "AllreduceConfig"), (["algo=pss"], "PssConfig")],
)
def test_the_tf2_strategies_compose_with_their_schema(overrides: list[str], schema: str) -> None:
    from tfplan.config.compose import compose_config, to_config

    cfg = to_config(compose_config(overrides, CONF))
    assert type(cfg.algo).__name__ == schema and cfg.algo.name == overrides[0].split("=")[1]


# The topology each algorithm needs on the local machine, and the tasks it makes with an evaluator.
TOPOLOGY = {
    "allreduce": (["cluster=local_allreduce", "cluster.evaluator=true"], 3),  # 2 workers, no ps
    "pss": (["cluster=local_chief"], 5),  # ps, the coordinating chief, 2 workers, evaluator
}


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_plans_with_its_defaults(
    algo: str, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides, tasks = TOPOLOGY.get(algo, (["cluster.evaluator=true"], 4))
    assert main(["plan", f"algo={algo}", *overrides]) == 0
    out, err = capsys.readouterr()
    assert f"Plan: {tasks} to add" in out and err == ""
    assert (in_tmp / ".tfplan" / "plan.json").is_file()


BAD = [
    # (overrides, the error's start, a fragment of the fix)
    (
        ["algo=allreduce"],
        "cluster.ps: 1 parameter servers, but algo=allreduce uses none",
        "cluster.ps=0",
    ),
    (
        ["algo=hogwild", "cluster.ps=0"],
        "cluster.ps: 0 parameter servers, but algo=hogwild keeps its variables on them",
        "algo=allreduce",
    ),
    (
        ["algo=pss"],
        "cluster.chief: worker0, but algo=pss needs a chief task",
        "cluster.chief=separate",
    ),
    (
        ["algo=pss", "cluster=local_chief", "cluster.workers=0"],
        "cluster.workers: 0 workers: algo=pss's coordinator needs some",
        "at least 1 worker",
    ),
    (
        ["algo=allreduce", "cluster=local_allreduce", "algo.collective_timeout_secs=5"],
        "algo.collective_timeout_secs: 5.0 is below TensorFlow's 10 s heartbeat",
        "use 10 or more",
    ),
    (
        ["algo=pss", "cluster=local_chief", "algo.steps_per_closure=0"],
        "algo.steps_per_closure: 0 < 1",
        "minibatches per scheduled function",
    ),
    (
        ["algo=sagn", "algo.sync=false"],
        "algo.sync: false, but sagn is synchronous",
        "leave algo.sync=true",
    ),
    (
        ["algo=sync_lr", "algo.sync=false"],
        "algo.sync: false, but sync_lr is synchronous",
        "algo=agn for sagn",
    ),
    (
        ["algo=agn", "algo.sync=true"],
        "algo.sync: true, but agn is asynchronous",
        "algo=sync, algo=sagn, algo=sync_lr",
    ),
    (
        ["algo=easgd", "algo.sync=true"],
        "algo.sync: true, but easgd is asynchronous",
        "leave algo.sync=false",
    ),
    (["algo=agn", "algo.window=0"], "algo.window: 0 < 1", "at least 1 step"),
    (["algo=adag", "algo.window=0"], "algo.window: 0 < 1", "at least 1 step"),
    (["algo=sagn", "algo.window=0"], "algo.window: 0 < 1", "at least 1 step"),
    (["algo=dynsgd", "algo.window=-2"], "algo.window: -2 < 1", "at least 1 step"),
    (["algo=easgd", "algo.window=0"], "algo.window: 0 < 1", "at least 1 step"),
    (["algo=downpour_easy", "algo.window=0"], "algo.window: 0 < 1", "at least 1 step"),
    (
        ["algo=easgd", "algo.alpha=1.5"],
        "algo.alpha: elastic rate 1.5 outside [0, 1]",
        "0.9 / workers",
    ),
    (
        ["algo=eamsgd", "algo.alpha=-0.1"],
        "algo.alpha: elastic rate -0.1 outside [0, 1]",
        "null for that default",
    ),
    (["algo=eamsgd", "algo.momentum=1.0"], "algo.momentum: 1.0 outside [0, 1)", "e.g. 0.9"),
    (["algo=adag", "algo.gamma=0"], "algo.gamma: 0.0 is not positive", "1e-4"),
    (
        ["algo=sync_lr", "algo.lrs=[0.1]"],
        "algo.lrs: 1 rates for 2 training replicas",
        "one rate per replica",
    ),
    (
        ["algo=sync_lr", "algo.lrs=[0.1,-0.2]"],
        "algo.lrs: [0.1, -0.2] has a rate <= 0",
        "positive rates",
    ),
    (["algo=sync_lr", "algo.lr_decay=0"], "algo.lr_decay: 0.0 outside (0, 1]", "e.g. 0.5"),
    (
        ["algo=sync_lr", "algo.optimizer=adam"],
        "algo.optimizer: 'adam', but sync_lr runs plain",
        "algo.optimizer=sgd",
    ),
    (
        ["algo=sync_lr", "algo.backup_workers=2"],
        "algo.backup_workers: 2 backups with only 2",
        "keep backup_workers below",
    ),
    (
        ["algo=downpour_easy", "algo.optimizer=momentum"],
        "algo.optimizer: 'momentum', but downpour_easy runs plain SGD",
        "algo=downpour",
    ),
    (
        ["algo=downpour_easy", "algo.ps_optimizer=adam"],
        "algo.ps_optimizer: unknown ps optimizer 'adam'",
        "choose sgd or adagrad",
    ),
    (
        ["algo=sagn", "algo.ps_optimizer=lbfgs"],
        "algo.ps_optimizer: unknown ps optimizer 'lbfgs'",
        "choose one of sgd, adagrad, adam, momentum",
    ),
    (
        ["algo=sagn", "algo.replicas_to_aggregate=3"],
        "algo.replicas_to_aggregate: 3 but the cluster has 2 training replicas",
        "use 1-2",
    ),
    (["algo=multi_gpu", "algo.towers=0"], "algo.towers: 0 < 1", "at least 1 tower"),
    (
        ["algo=multi_gpu", "algo.device=tpu"],
        "algo.device: unknown device 'tpu'",
        "choose cpu or gpu",
    ),
    (
        ["algo=multi_gpu", "algo.device=gpu", "algo.towers=4"],
        "algo.towers: 4 GPU towers, but tfplan gives each worker task one GPU",
        "algo.device=cpu",
    ),
    (
        ["algo=multi_gpu", "algo.towers=8", "data.batch_size=4"],
        "data.batch_size: 4 rows cannot feed 8 towers",
        "at least 8 rows",
    ),
    (["algo=agn", "algo.gamma=1"], "algo.gamma: no such key", "check the spelling"),
    (
        ["algo=easgd", "algo.alpha=fast"],
        "algo.alpha: Value 'fast' of type 'str' could not be converted to Float",
        "fix the value",
    ),
]


@pytest.mark.parametrize(("overrides", "start", "fix"), BAD, ids=lambda v: str(v)[:48])
def test_bad_algorithm_setting_is_one_line_naming_the_key(
    overrides: list[str],
    start: str,
    fix: str,
    in_tmp: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", *overrides]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: {start}"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert fix in err, err
    assert list(in_tmp.iterdir()) == []  # nothing written


def test_the_recipes_refuse_what_the_planner_refuses() -> None:
    """A run.yaml written by another launcher gets the same rules from the recipe itself."""
    import tensorflow as tf
    from recipe_cluster import InProcessCluster
    from test_rules_common import build_replicas

    from recipes.config import AlgoConf

    for conf, match in [
        (AlgoConf(name="agn", extra={"window": 0}), "window must be >= 1"),
        (AlgoConf(name="adag", extra={"gamma": -1.0}), "gamma must be > 0"),
        (AlgoConf(name="eamsgd", extra={"momentum": 1.0}), "momentum must be in"),
        (AlgoConf(name="multi_gpu", extra={"device": "tpu"}), "cpu or gpu"),
        (AlgoConf(name="sync_lr", optimizer="adam"), "SGD with per-worker rates"),
    ]:
        with tf.Graph().as_default(), pytest.raises(ConfigError, match=match):
            build_replicas(InProcessCluster(n_workers=1), conf, 1, init=False)
