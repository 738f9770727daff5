"""A tracking server that loses a run or refuses the login: nothing is dropped.

Real `mlflow server` processes (tests/mlflowserver.py): one replaced by an empty one while a
real `workbench train` records into it, and after a training ended during an outage; one
with MLflow's basic-auth app, where a training's password is changed mid-run and `runs sync`
is tried with no login, the old password and a user without permission before the right one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from workbench.training import checkpoint

from tests.mlflowserver import MlflowServer, start_training, wait_text
from tests.teamserver import logged_in

from .conftest import TINY, run_cli

pytestmark = pytest.mark.slow

QUIET = [*TINY, "console.iteration_lines=true",
         "tracking.system_metrics=false", "eval.every_steps=0", "checkpoint.every_steps=256"]


@pytest.fixture()
def server(mlflow_server: MlflowServer) -> MlflowServer:
    """A real `mlflow server` for one test (tests/mlflowserver.py)."""
    return mlflow_server


def artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    found = set()
    for info in client.list_artifacts(run_id, path):
        found |= artifact_paths(client, run_id, info.path) if info.is_dir else {info.path}
    return found


def check_complete(client: MlflowClient, run_id: str, old_id: str, last_step: int) -> None:
    """The re-created run holds the whole record of the lost one."""
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["workbench.recreated_from"] == old_id
    assert client.get_experiment(run.info.experiment_id).name == "workbench"
    assert run.data.params["algo.n_steps"] == "64"
    assert run.data.tags["env"] == "halfcheetah"
    for key in ("rollout/ep_rew_mean", "train/value_loss", "time/iterations"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(128, last_step + 1, 128)), key
    assert {"summary/eval_mean_reward", "eval/mean_reward"} <= set(run.data.metrics)
    assert {"config.yaml", "manifest.json", "model/model.zip"} <= artifact_paths(client, run_id)
    assert checkpoint.stored_checkpoints(client, run_id)[-1].step == last_step


def test_a_server_replaced_mid_run_and_after_the_run_gets_the_whole_run_back(
    server: MlflowServer, tmp_path: Path
) -> None:
    outboxes = tmp_path / "experiments" / "outbox"
    # 1. Mid-run the server goes away and an empty one takes its place: the training
    # re-creates its run there from the journal and finishes it.
    proc, out, err = start_training(tmp_path, "first", *QUIET, "total_timesteps=2560")
    wait_text(out, "| 256 steps |", proc)
    old_id = next(ln for ln in out.read_text().splitlines() if ln.startswith("run "))
    old_id = old_id.rsplit("(", 1)[1].rstrip(")")
    proc.suspend()  # held while the server is replaced, so that it happens mid-run
    server.replace()
    proc.resume()
    assert proc.wait(timeout=900) == 0, err.read_text()
    new_id = out.read_text().strip().splitlines()[-1]
    assert new_id != old_id
    assert (f"run {old_id} no longer exists in the tracking store {server.url} (replaced or "
            f"purged); re-created it from the outbox journal as run {new_id}") in err.read_text()
    client = MlflowClient(server.url)
    check_complete(client, new_id, old_id, 2560)
    assert not (outboxes / old_id).exists()

    # 2. The server is down when a run ends, and comes back empty: `runs sync` re-creates it,
    # from its first metric on (before the outage the old server had them), not only what
    # was pending.
    proc, out, err = start_training(tmp_path, "second", *QUIET, "total_timesteps=1280")
    wait_text(out, "| 512 steps |", proc)
    server.stop()
    assert proc.wait(timeout=900) == 0, err.read_text()
    old_id = out.read_text().strip().splitlines()[-1]
    assert f"tracking writes of run {old_id} could not reach the store" in err.read_text()
    server.generation += 1  # an empty store this time
    server.start()
    synced = run_cli("runs", "sync")
    assert synced.returncode == 0, synced.stderr
    (line,) = [ln for ln in synced.stdout.splitlines() if ln.startswith(("synced", "pending"))]
    found = re.fullmatch(rf"synced {old_id}: \d+ write\(s\) delivered \(the store had lost the "
                         r"run: re-created as (\w+), the old id kept in tag "
                         r"workbench.recreated_from\)", line)
    assert found, line
    check_complete(client, found[1], old_id, 1280)
    assert not (outboxes / old_id).exists()


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "lock"}


@pytest.fixture()
def auth_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MlflowServer]:
    """A basic-auth server with two users; alice owns what she creates, bob may only read."""
    root = tmp_path / "server"
    root.mkdir()
    running = MlflowServer(root, auth=True)
    running.start()
    try:
        running.create_user("alice", "alice-password-1")
        running.create_user("bob", "bob-password-22")
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", running.url)
        monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
        yield running
    finally:
        running.stop()


def login(user: str, password: str) -> dict[str, str]:
    return {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password}


def test_a_refused_login_keeps_every_write_until_sync_is_logged_in(
    auth_server: MlflowServer, tmp_path: Path
) -> None:
    # alice trains; mid-run her password is changed, so from then on the store answers 401.
    with logged_in("alice", "alice-password-1"):
        proc, out, err = start_training(tmp_path, "alice", *QUIET, "total_timesteps=1280")
    wait_text(out, "| 256 steps |", proc)
    proc.suspend()  # held while the password changes, so that it happens mid-run
    auth_server.change_password("alice", "alice-password-2")
    proc.resume()
    assert proc.wait(timeout=900) == 0, err.read_text()
    run_id = out.read_text().strip().splitlines()[-1]
    folder = tmp_path / "experiments" / "outbox" / run_id
    warned = err.read_text()
    assert "refused the login" in warned
    assert re.search(rf"\d+ tracking writes of run {run_id} were not accepted: tracking server "
                     rf"{re.escape(auth_server.url)}: the login of alice was refused \(401\)",
                     warned), warned
    assert warned.rstrip().endswith("log in as alice (MLFLOW_TRACKING_USERNAME/PASSWORD) and "
                                    "rerun `workbench runs sync`")
    before = tree_digest(folder)
    assert any(name.endswith("model.zip") for name in before)  # the model waits in the outbox
    advice = (f"its writes are kept in {folder}: log in as alice "
              "(MLFLOW_TRACKING_USERNAME/PASSWORD) and rerun `workbench runs sync`")

    # No login, the old password, a user without permission: one line each, exit 2, and
    # not a byte of the outbox dropped.
    refusals = {
        "no login": ({}, f"the login is missing (401); {advice}"),
        "old password": (login("alice", "alice-password-1"),
                         f"the login of alice was refused (401); {advice}"),
        "bob": (login("bob", "bob-password-22"),
                f"the login bob may not write run {run_id} (403); {advice}"),
    }
    for case, (env, problem) in refusals.items():
        refused = run_cli("runs", "sync", env=env)
        assert refused.returncode == 2, (case, refused.stderr)
        assert refused.stderr.strip().splitlines() == [
            f"workbench: error: tracking server {auth_server.url}: {problem}"], case
        assert tree_digest(folder) == before, case

    synced = run_cli("runs", "sync", env=login("alice", "alice-password-2"))
    assert synced.returncode == 0, synced.stderr
    assert re.search(rf"^synced {run_id}: [1-9]\d* write\(s\) delivered$", synced.stdout,
                     re.MULTILINE), synced.stdout
    assert not folder.exists()
    with logged_in("alice", "alice-password-2"):
        client = MlflowClient(auth_server.url)
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert {"summary/eval_mean_reward", "eval/mean_reward"} <= set(run.data.metrics)
        steps = sorted(m.step for m in client.get_metric_history(run_id, "rollout/ep_rew_mean"))
        assert steps == list(range(128, 1281, 128))
        assert "model/model.zip" in artifact_paths(client, run_id)
        assert checkpoint.stored_checkpoints(client, run_id)[-1].step == 1280
