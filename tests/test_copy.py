"""`workbench runs copy`: local runs move to another store with everything intact.

The source holds a sweep-shaped pair made by the real training code: a parent run and a
TINY PPO child trained under it (``train(..., parent_run_id=...)``). Copies are compared
exactly with their source: run name, status, start and end time, params, tags, every point
of every metric history, and every artifact file's bytes.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from workbench import cli
from workbench.team import migrate

from tests.conftest import TINY, embedded_store
from tests.support.ports import free_port
from tests.teamserver import ALICE, TeamServer, logged_in

EXPERIMENT = "copy-source"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A local SQLite store with a parent run and one trained child run."""
    from workbench.training import load_config, train

    experiments = tmp_path_factory.mktemp("source") / "experiments"
    uri = f"sqlite:///{experiments / 'mlflow.db'}"
    with embedded_store(experiments):
        client = MlflowClient(uri)
        experiment_id = client.create_experiment(
            EXPERIMENT, artifact_location=(experiments / "mlartifacts" / EXPERIMENT).as_uri())
        parent = client.create_run(experiment_id, run_name="sweep-parent",
                                   tags={"sweep_id": "s1", "sweep.role": "parent"})
        client.log_param(parent.info.run_id, "sweep.points", "1")
        client.log_text(parent.info.run_id, "grid: [1]\n", "sweep.yaml")
        child = train(load_config([*TINY, f"tracking.experiment={EXPERIMENT}"]),
                      tags={"sweep_id": "s1", "sweep.role": "child"},
                      parent_run_id=parent.info.run_id)
        client.set_terminated(parent.info.run_id, "FINISHED")
        yield {"uri": uri, "parent": parent.info.run_id, "child": child.run_id,
               "experiments": experiments}


def snapshot(client: MlflowClient, run_id: str) -> dict[str, Any]:
    """Everything a copy must preserve, in comparable form."""
    run = client.get_run(run_id)
    histories = {
        key: sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(client.download_artifacts(run_id, "", tmp))
        files = {str(p.relative_to(local)): hashlib.sha256(p.read_bytes()).hexdigest()
                 for p in sorted(local.rglob("*")) if p.is_file()}
    return {
        "name": run.info.run_name, "status": run.info.status,
        "start": run.info.start_time, "end": run.info.end_time,
        "params": run.data.params, "tags": run.data.tags,
        "metrics": histories, "artifacts": files,
    }


def as_source(copy: dict[str, Any], id_map: dict[str, str]) -> dict[str, Any]:
    """A copy's snapshot with the copy bookkeeping undone, for an exact comparison."""
    tags = dict(copy["tags"])
    tags.pop(migrate.SOURCE_TAG)
    if migrate.PARENT_TAG in tags:
        tags[migrate.PARENT_TAG] = id_map[tags[migrate.PARENT_TAG]]
    return {**copy, "tags": tags}


def copies_by_source(client: MlflowClient) -> dict[str, str]:
    """Destination run id -> source run id, over every active run of the destination."""
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              run_view_type=ViewType.ACTIVE_ONLY)
    return {r.info.run_id: r.data.tags[migrate.SOURCE_TAG] for r in runs}


def assert_exact_copies(source: dict[str, Any], src: MlflowClient, dst: MlflowClient) -> None:
    """Exactly the two source runs are on ``dst``, each identical to its source."""
    id_map = copies_by_source(dst)
    assert sorted(id_map.values()) == sorted([source["parent"], source["child"]])
    for copy_id, source_id in id_map.items():
        original = snapshot(src, source_id)
        assert as_source(snapshot(dst, copy_id), id_map) == original
    child = snapshot(src, source["child"])
    assert {"manifest.json", "config.yaml", "model/model.zip", "model/config.yaml"} <= set(
        child["artifacts"])
    assert len(child["metrics"]["rollout/ep_rew_mean"]) >= 2  # a history, not a last value


def test_copy_between_stores_is_exact_and_idempotent(
    source: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    dest_uri = f"sqlite:///{tmp_path / 'experiments' / 'mlflow.db'}"
    args = ["runs", "copy", "--from", source["uri"], "--to", dest_uri]
    assert cli.main(args) == 0
    first = capsys.readouterr().out
    assert "2 run(s) copied, 0 already there" in first
    src, dst = MlflowClient(source["uri"]), MlflowClient(dest_uri)
    assert_exact_copies(source, src, dst)

    assert cli.main(args) == 0  # again: nothing new, nothing duplicated
    assert "0 run(s) copied, 2 already there" in capsys.readouterr().out
    assert len(copies_by_source(dst)) == 2


def test_selected_child_brings_its_parent(
    source: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    dest_uri = f"sqlite:///{tmp_path / 'experiments' / 'mlflow.db'}"
    results = migrate.copy_runs(source["uri"], dest_uri, run_ids=[source["child"]],
                                report=lambda line: None)
    assert [r.source_run_id for r in results] == [source["parent"], source["child"]]
    dst = MlflowClient(dest_uri)
    child_copy = dst.get_run(results[1].dest_run_id)
    assert child_copy.data.tags[migrate.PARENT_TAG] == results[0].dest_run_id


def test_half_finished_copy_is_replaced(
    source: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    dest_uri = f"sqlite:///{tmp_path / 'experiments' / 'mlflow.db'}"
    dst = MlflowClient(dest_uri)
    # What a copy killed with SIGKILL leaves: tagged, RUNNING, incomplete.
    experiment_id = dst.create_experiment(
        EXPERIMENT, artifact_location=(tmp_path / "experiments" / "mlartifacts").as_uri())
    stale = dst.create_run(experiment_id, tags={migrate.SOURCE_TAG: source["child"]})
    migrate.copy_runs(source["uri"], dest_uri, report=lambda line: None)
    assert dst.get_run(stale.info.run_id).info.lifecycle_stage == "deleted"
    assert_exact_copies(source, MlflowClient(source["uri"]), dst)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--from", "sqlite:////nonexistent/mlflow.db"], "--from sqlite:////nonexistent/mlflow.db"
         ": no such SQLite store"),
        (["--experiment", "nope"], "--experiment nope: not in the source store; its "
         f"experiments: Default, {EXPERIMENT}"),
        (["--run-id", "0" * 32], f"--run-id {'0' * 32}: no such run in the source store"),
        (["--to", "@UNREACHABLE@"], ": no MLflow server answers; start it"),
        (["--to", "@SOURCE@"], "--from and --to are the same store"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    source: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, arguments: list[str], message: str,
) -> None:
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    dest = tmp_path / "dest" / "mlflow.db"
    given = {"--from": source["uri"], "--to": f"sqlite:///{dest}"}
    replacements = {"@UNREACHABLE@": f"http://127.0.0.1:{free_port()}",
                    "@SOURCE@": source["uri"]}
    for flag, value in zip(arguments[::2], arguments[1::2], strict=True):
        given[flag] = replacements.get(value, value)
    argv = ["runs", "copy", *[item for pair in given.items() for item in pair]]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not dest.parent.exists()  # nothing was written


@pytest.mark.slow
def test_copy_to_team_server_is_exact(source: dict[str, Any], team_server: TeamServer) -> None:
    copied = team_server.cli("runs", "copy", "--from", source["uri"], "--to", team_server.url)
    assert copied.returncode == 0, copied.stderr
    assert "2 run(s) copied, 0 already there" in copied.stdout
    again = team_server.cli("runs", "copy", "--from", source["uri"], "--to", team_server.url)
    assert again.returncode == 0, again.stderr
    assert "0 run(s) copied, 2 already there" in again.stdout

    with logged_in(ALICE, team_server.alice_password):
        dst = MlflowClient(team_server.url)
        experiment = dst.get_experiment_by_name(EXPERIMENT)
        assert experiment is not None
        id_map = {r.info.run_id: r.data.tags[migrate.SOURCE_TAG]
                  for r in dst.search_runs([experiment.experiment_id])}
        assert sorted(id_map.values()) == sorted([source["parent"], source["child"]])
        src = MlflowClient(source["uri"])
        for copy_id, source_id in id_map.items():
            assert as_source(snapshot(dst, copy_id), id_map) == snapshot(src, source_id)
            # The server proxies artifacts into its own artifact root.
            stored = team_server.root / "server" / "artifacts" / experiment.experiment_id / copy_id
            assert stored.is_dir()
