"""The outbox keeps what the store did not acknowledge: a run the store lost is re-created from
the journal, writes to a deleted run wait, only a write the live run refuses is dropped, and a
run reaped while alive ends with its true status.

Real MLflow SQLite stores and MLflow's own `mlflow gc` to purge a run; a tracking server
where nothing listens (a free port) for a store that is unreachable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import ErrorCode
from mlflow.tracking import MlflowClient
from workbench.tracking import journal, outbox, rejection, runs
from workbench.tracking.rejection import Verdict

from .conftest import run_cli
from .support.runs import down_url, new_run

T0 = 1_700_000_000_000  # metric timestamps (ms)


def metrics(*steps: int, key: str = "loss") -> list[Metric]:
    return [Metric(key, float(step), T0 + step, step) for step in steps]


def steps_of(client: MlflowClient, run_id: str, key: str = "loss") -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    found = set()
    for info in client.list_artifacts(run_id, path):
        found |= artifact_paths(client, run_id, info.path) if info.is_dir else {info.path}
    return found


def purge(uri: str, run_id: str) -> None:
    """Delete the run for good, as a user would: `mlflow runs delete`, then `mlflow gc`."""
    MlflowClient(uri).delete_run(run_id)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    done = subprocess.run([sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", uri,
                           "--run-ids", run_id], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    with pytest.raises(MlflowException, match="not found|does not exist"):
        MlflowClient(uri).get_run(run_id)


def checkpoint_dir(tmp: Path, step: int) -> Path:
    folder = tmp / f"ckpt-{step}"
    folder.mkdir()
    (folder / "state.json").write_text(f'{{"step": {step}}}')
    return folder


# --------------------------------------------------------------------------- verdicts


@pytest.mark.unit
def test_the_store_s_answers_are_judged_before_anything_is_dropped() -> None:
    def refused(code: str) -> MlflowException:
        return MlflowException("refused", error_code=ErrorCode.Value(code))

    http_401 = requests.HTTPError(response=requests.Response())
    http_401.response.status_code = 401
    assert rejection.first_verdict(refused("UNAUTHENTICATED")) is Verdict.LOGIN
    assert rejection.first_verdict(refused("PERMISSION_DENIED")) is Verdict.LOGIN
    assert rejection.first_verdict(http_401) is Verdict.LOGIN  # an artifact upload's 401
    assert rejection.first_verdict(requests.ConnectionError("refused")) is Verdict.OUTAGE
    assert rejection.first_verdict(refused("INTERNAL_ERROR")) is Verdict.OUTAGE
    assert rejection.first_verdict(refused("TEMPORARILY_UNAVAILABLE")) is Verdict.OUTAGE
    # The store answered and refused: whether the run is gone, deleted or only this write
    # is bad is asked of the store (judge), never assumed.
    for code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "BAD_REQUEST"):
        assert rejection.first_verdict(refused(code)) is None


# --------------------------------------------------------------------------- re-creation


def test_a_run_purged_mid_run_is_recreated_from_the_journal(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = os.environ["MLFLOW_TRACKING_URI"]
    client = MlflowClient(uri)
    run_id, origin = new_run(client, tmp_path)
    live = outbox.RunWriter(uri, run_id, origin=origin)
    live.log_batch(run_id, params=[Param("algo.n_steps", "64")])
    live.log_batch(run_id, metrics=metrics(1, 2))
    live.log_text(run_id, "seed: 0\n", "config.yaml")
    live.log_artifacts(run_id, str(checkpoint_dir(tmp_path, 1)), "checkpoints/step-1")
    live.log_artifacts(run_id, str(checkpoint_dir(tmp_path, 2)), "checkpoints/step-2")
    live.delete_artifacts(run_id, "checkpoints/step-1")  # keep_last: the older one goes
    live.set_tag(run_id, "workbench.checkpoint", "checkpoints/step-2")
    assert live.flush(60)
    # The journal keeps what the store holds (for a re-creation), not what it deleted.
    staged = {p.name for p in (live.journal.folder / "files").iterdir()}
    assert staged == {"3", "5"}  # config.yaml and checkpoints/step-2

    purge(uri, run_id)  # the run is gone from the store while it trains
    live.log_batch(run_id, metrics=metrics(3))
    live.set_terminated(run_id, "FINISHED")
    assert live.flush(60)
    new_id = live.store_run_id
    assert new_id != run_id
    assert live.close() == 0
    assert not live.journal.folder.exists()
    err = capsys.readouterr().err
    assert (f"run {run_id} no longer exists in the tracking store {uri} (replaced or purged); "
            f"re-created it from the outbox journal as run {new_id} (tag "
            f"workbench.recreated_from={run_id})") in err

    run = client.get_run(new_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "tiny-run"
    assert run.info.start_time == origin["start_time"]
    assert client.get_experiment(run.info.experiment_id).name == "outbox"
    assert run.data.params == {"algo.n_steps": "64"}
    assert run.data.tags["env"] == "halfcheetah"
    assert run.data.tags["workbench.recreated_from"] == run_id
    assert run.data.tags["workbench.checkpoint"] == "checkpoints/step-2"
    assert "workbench.recreated_partial" not in run.data.tags  # a fresh run's whole record
    assert steps_of(client, new_id) == [1, 2, 3]
    assert artifact_paths(client, new_id) == {"config.yaml", "checkpoints/step-2/state.json"}


def test_sync_recreates_a_run_the_replaced_store_does_not_have(
    store: Path, tmp_path: Path
) -> None:
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run_id, origin = new_run(client, tmp_path, experiment="lost")
    down = outbox.RunWriter(down_url(), run_id, origin=origin, drain_timeout_s=0.5)
    down.log_batch(run_id, params=[Param("seed", "0")])
    down.log_batch(run_id, metrics=metrics(128))
    down.log_batch(run_id, metrics=metrics(256))
    down.log_text(run_id, "weights", "model/model.zip")
    down.set_terminated(run_id, "FINISHED")
    assert down.close() == 5
    folder = store / "outbox" / run_id

    # The store that comes back is an empty one: neither the run nor its experiment exist.
    replaced = MlflowClient(f"sqlite:///{tmp_path / 'replaced.db'}")
    result = runs.sync_outbox(replaced, folder)
    assert (result.delivered, result.left, result.dropped) == (5, 0, 0)
    assert result.recreated_as is not None and result.recreated_as != run_id
    assert not folder.exists()
    run = replaced.get_run(result.recreated_as)
    assert run.info.status == "FINISHED"
    assert replaced.get_experiment(run.info.experiment_id).name == "lost"
    assert run.data.params == {"seed": "0"}
    assert run.data.tags["workbench.recreated_from"] == run_id
    assert steps_of(replaced, result.recreated_as) == [128, 256]
    assert artifact_paths(replaced, result.recreated_as) == {"model/model.zip"}
    assert "re-created as" in runs.sync_line(result)


def test_an_outbox_without_its_origin_is_kept_when_the_run_is_gone(
    store: Path, tmp_path: Path
) -> None:
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run_id, _ = new_run(client, tmp_path)
    down = outbox.RunWriter(down_url(), run_id, drain_timeout_s=0.5)  # no origin given
    down.log_batch(run_id, metrics=metrics(1))
    assert down.close() == 1
    folder = store / "outbox" / run_id
    replaced = MlflowClient(f"sqlite:///{tmp_path / 'replaced.db'}")
    result = runs.sync_outbox(replaced, folder)
    assert (result.delivered, result.left) == (0, 1)
    assert "does not record how it was created" in result.note
    assert len(journal.Journal(folder).pending()) == 1


# --------------------------------------------------------------------------- refusals


def test_sync_waits_for_a_deleted_run_and_drops_only_the_refused_write(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run_id, origin = new_run(client, tmp_path)
    down = outbox.RunWriter(down_url(), run_id, origin=origin, drain_timeout_s=0.5)
    down.log_batch(run_id, params=[Param("lr", "0.001")])
    down.log_batch(run_id, metrics=metrics(1))
    down.log_batch(run_id, params=[Param("lr", "0.5")])  # MLflow's params are write-once
    down.set_terminated(run_id, "FINISHED")
    assert down.close() == 4
    folder = store / "outbox" / run_id
    journal_text = (folder / journal.JOURNAL).read_text()

    client.delete_run(run_id)  # in the store's trash: re-creating it would undo that
    result = runs.sync_outbox(client, folder)
    assert (result.delivered, result.left) == (0, 4)
    assert result.note.startswith(f"run {run_id} is deleted in the store; its writes are kept")
    assert f"mlflow runs restore --run-id {run_id}" in result.note
    assert (folder / journal.JOURNAL).read_text() == journal_text

    client.restore_run(run_id)
    result = runs.sync_outbox(client, folder)
    assert (result.delivered, result.left, result.dropped) == (3, 0, 1)
    err = capsys.readouterr().err
    (warning,) = [line for line in err.splitlines() if "rejected" in line]
    assert warning.startswith(f"workbench: warning: run {run_id}: the store rejected a "
                              "log_batch write (#3), which is dropped: ")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.001"}
    assert steps_of(client, run_id) == [1]
    assert "1 write(s) refused by the store and dropped" in runs.sync_line(result)


# --------------------------------------------------------------------------- reaping


@pytest.mark.unit
def test_reap_never_touches_a_fresh_heartbeat(store: Path, tmp_path: Path) -> None:
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    now = time.time()
    experiment = client.create_experiment("reap", artifact_location=(tmp_path / "a").as_uri())
    fresh = client.create_run(experiment, tags={"workbench.heartbeat": f"{now - 5:.3f}"})
    stale = client.create_run(experiment, tags={"workbench.heartbeat": f"{now - 25:.3f}"})
    report = runs.reap(older_than_s=0, now=now)
    assert report.reaped == [stale.info.run_id]
    assert [(run_id, round(age)) for run_id, age in report.live] == [(fresh.info.run_id, 5)]
    assert client.get_run(fresh.info.run_id).info.status == "RUNNING"
    assert client.get_run(stale.info.run_id).info.status == "KILLED"


def test_reap_command_says_a_live_run_is_live(store: Path, tmp_path: Path) -> None:
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.create_experiment("reap", artifact_location=(tmp_path / "a").as_uri())
    live = client.create_run(experiment, tags={"workbench.heartbeat": f"{time.time():.3f}"})
    done = run_cli("runs", "reap", "--older-than", "0")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"live {live.info.run_id}: heartbeat ")
    assert lines[0].endswith(" s ago, within 20 s (two heartbeat intervals): a training is "
                             "recording it; not reaped")
    assert lines[1].startswith("0 run(s) reaped in ")
    run = client.get_run(live.info.run_id)
    assert run.info.status == "RUNNING"
    assert "error" not in run.data.tags and runs.REAPED_TAG not in run.data.tags


def test_a_run_reaped_while_alive_is_revived_and_ends_truthfully(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = os.environ["MLFLOW_TRACKING_URI"]
    client = MlflowClient(uri)
    run_id, origin = new_run(client, tmp_path)
    live = outbox.RunWriter(uri, run_id, origin=origin)
    assert live.flush(60)  # its first heartbeat
    # Its heartbeats stop reaching the store (a suspended process, a partition): reaped.
    assert runs.reap_stale_runs(uri, older_than_s=300, now=time.time() + 400) == [run_id]
    assert client.get_run(run_id).info.status == "KILLED"

    live.heartbeat()  # the process was alive after all
    assert live.flush(60)
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING"
    assert runs.REAPED_TAG not in run.data.tags and "error" not in run.data.tags
    assert (f"run {run_id} had been marked KILLED by `workbench runs reap`"
            in capsys.readouterr().err)
    live.log_batch(run_id, metrics=metrics(1))
    live.set_terminated(run_id, "FINISHED")
    assert live.close() == 0
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert runs.REAPED_TAG not in run.data.tags and "error" not in run.data.tags


def test_a_status_synced_after_a_reap_replaces_the_reap(store: Path, tmp_path: Path) -> None:
    uri = os.environ["MLFLOW_TRACKING_URI"]
    client = MlflowClient(uri)
    run_id, origin = new_run(client, tmp_path)
    # The training was stopped by SIGTERM while its store was unreachable...
    down = outbox.RunWriter(down_url(), run_id, origin=origin, drain_timeout_s=0.5)
    down.set_tag(run_id, "error", "interrupted: SIGTERM received at step 256")
    down.set_terminated(run_id, "KILLED", end_time=int(time.time() * 1000))
    assert down.close() == 2
    # ...then reaped (its outbox was recorded for the other store, so reaping could not sync).
    assert runs.reap_stale_runs(uri, older_than_s=300, now=time.time() + 400) == [run_id]
    result = runs.sync_outbox(client, store / "outbox" / run_id)
    assert (result.delivered, result.left) == (2, 0)
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags["error"] == "interrupted: SIGTERM received at step 256"
    assert runs.REAPED_TAG not in run.data.tags
