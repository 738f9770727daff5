"""Runs as tests make and read them: interrupted and resumed trainings compared, store
records of sweeps and studies, outbox runs, the team server's database."""

from __future__ import annotations

import io
import os
import signal
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from stable_baselines3.common.callbacks import BaseCallback
from workbench.team import postgres, server
from workbench.team.layout import Layout
from workbench.tracking import rejection
from workbench.training import load_config, train
from workbench.training.faults import TrainingInterrupted

from tests.conftest import TINY
from tests.support.ports import free_port
from tests.teamserver import TeamServer


def down_url() -> str:
    """A tracking server that is not there: nothing listens on the port."""
    return f"http://127.0.0.1:{free_port()}"


def new_run(client: MlflowClient, root: Path, experiment: str = "outbox") -> tuple[str, dict]:
    """A RUNNING run with creation tags, and its origin as the trainer records it."""
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(
        experiment, artifact_location=(root / "artifacts" / experiment).as_uri())
    run = client.create_run(experiment_id, run_name="tiny-run", tags={"env": "halfcheetah"})
    return run.info.run_id, rejection.origin_of(run, experiment)


class SignalAt(BaseCallback):
    """Sends this process a real SIGINT once training passes ``step``."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step
        self.sent = False

    def _on_step(self) -> bool:
        if not self.sent and self.num_timesteps >= self.step:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return True


def histories(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every non-timing metric's (step, value) history, in logging order of steps."""
    found = {}
    for key in client.get_run(run_id).data.metrics:
        if key.startswith(TIMING):
            continue
        found[key] = [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
    return found


def policy_weights(client: MlflowClient, run_id: str, tmp: Path) -> dict[str, torch.Tensor]:
    local = client.download_artifacts(run_id, "model/model.zip", str(tmp / run_id))
    with zipfile.ZipFile(local) as archive:
        return torch.load(io.BytesIO(archive.read("policy.pth")), weights_only=True)


def interrupt_and_resume(overrides: list[str]) -> tuple[MlflowClient, Any, Any, Any]:
    """The uninterrupted run of ``overrides``, the same run stopped by a real SIGINT after
    step 420 (its stored run), and that run resumed to the end."""
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    full = train(load_config(overrides))
    with pytest.raises(TrainingInterrupted, match=r"^SIGINT received at step 42\d$"):
        train(load_config(overrides), callbacks=[SignalAt(420)])
    (killed,) = [r for r in client.search_runs([full.experiment_id])
                 if r.info.run_id != full.run_id]
    resumed = train(load_config([f"resume={killed.info.run_id}"]))
    return client, full, killed, resumed


def assert_same_training(client: MlflowClient, full: Any, resumed: Any, tmp: Path
                         ) -> dict[str, list[tuple[int, float]]]:
    """The resumed run FINISHED exactly as the uninterrupted one: every non-timing metric at
    the same steps with the same values (nothing logged twice), the same final evaluation
    and weights. Returns the resumed run's histories."""
    run = client.get_run(resumed.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["resume.exact"] == "true"
    expected, got = histories(client, full.run_id), histories(client, resumed.run_id)
    assert set(got) == set(expected)
    for key, points in expected.items():
        assert got[key] == points, key
    assert resumed.eval_mean_reward == full.eval_mean_reward
    weights_full = policy_weights(client, full.run_id, tmp)
    weights_resumed = policy_weights(client, resumed.run_id, tmp)
    assert weights_full.keys() == weights_resumed.keys()
    for name, value in weights_full.items():
        assert torch.equal(value, weights_resumed[name]), name
    return got


# TINY without the keys the grid sets; no system-metrics thread in each kernel.
GRID_SET = ("env.num_envs", "algo.n_steps")


POINT_TINY = [o for o in TINY if o.split("=")[0] not in GRID_SET] + [
    "tracking.system_metrics=false"]


def runs_of(role: str) -> list[Run]:
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("workbench")
    return client.search_runs([experiment.experiment_id], f"tags.`sweep.role` = '{role}'")


def study_trials(store: Path, study: str) -> list:
    import optuna

    return optuna.load_study(study_name=study, storage=f"sqlite:///{store / 'optuna.db'}").trials


def tune_runs(role: str) -> list:
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("workbench")
    return client.search_runs([experiment.experiment_id], f"tags.`tune.role` = '{role}'")


def psql(team: TeamServer, database: str, query: str) -> list[str]:
    """First column of ``query`` over the cluster's private socket."""
    import psycopg2

    layout = Layout(team.root / "server")
    state = server.read_state(layout)
    assert state is not None
    connection = psycopg2.connect(host=str(layout.socket_dir), port=state.pg_port,
                                  user=postgres.DB_ROLE, dbname=database)
    try:
        with connection.cursor() as cursor:
            cursor.execute(query)
            return [str(row[0]) for row in cursor.fetchall()]
    finally:
        connection.close()


# Timing values differ between any two runs; everything else must match exactly.
TIMING = ("time/fps", "time/rollout_s", "time/update_s", "time/rollout_cpu_s", "time/update_cpu_s",
          "time/eval_s", "time/time_elapsed",
          "summary/fps", "summary/wall_time_s", "summary/peak_rss_mb", "system/",
          "video/render_seconds")


# InvertedPendulum with debug=tiny: 50-step episodes (a return of at most 50), 384 steps,
# an evaluation every 128 steps; search=tiny fits that budget.
TINY_STUDY = ["env=inverted_pendulum", "debug=tiny", "search=tiny", "env.vec_env=dummy",
              "tracking.system_metrics=false"]
