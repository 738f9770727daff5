"""Faults during training: crashed env workers, NaN/inf, and a tracking store that goes away.

Real MuJoCo physics with injected faults (tests/faulty_envs.py), real SubprocVecEnv workers,
real `workbench train` processes, a real SQLite store and a real `mlflow server`.
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from mlflow.tracking import MlflowClient
from stable_baselines3.common.callbacks import BaseCallback
from workbench.envs import guards
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_envs
from workbench.tracking import journal, outbox, runs
from workbench.training import checkpoint, load_config, train

from tests.mlflowserver import (
    MlflowServer,
    session_processes,
    start_training,
    wait_text,
)
from tests.support.ports import free_port

from .conftest import ROOT, TINY, run_cli

FAULTY = "tests.faulty_envs:WorkbenchTest/{}-v0"
QUIET = [*TINY, "console.iteration_lines=false",
         "tracking.system_metrics=false", "eval.every_steps=0", "checkpoint.every_steps=64"]


def only_run(client: MlflowClient):
    (run,) = client.search_runs([client.get_experiment_by_name("workbench").experiment_id])
    return run


def run_train_process(*overrides: str, timeout: float = 300) -> tuple[int, str, str, int]:
    """`python -m workbench train` in its own session; (exit code, stdout, stderr, session)."""
    proc = psutil.Popen(
        [sys.executable, "-m", "workbench", "train", *overrides], cwd=ROOT,
        start_new_session=True, stdout=-1, stderr=-1, text=True, env={**os.environ},
    )
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err, proc.pid


# --------------------------------------------------------------------------- crashed workers


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        ("CrashingCheetah",
         "crashed during step: RuntimeError: simulated simulator fault at step 90"),
        pytest.param(
            "SegfaultingCheetah",
            "killed by signal SIGSEGV (a native crash, no Python exception) during step",
            marks=pytest.mark.slow),
    ],
)
def test_crashed_worker_names_env_rank_and_cause(fault: str, cause: str, store: Path) -> None:
    env_id = FAULTY.format(fault)
    code, out, err, session = run_train_process(*QUIET, f"env.id={env_id}",
                                                "env.vec_env=subproc")
    assert code == 1, err
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = only_run(client)
    assert run.info.status == "FAILED"
    error = run.data.tags["error"]
    assert error.startswith(f"EnvWorkerError: environment {env_id} worker rank 1 (pid ")
    assert error.endswith(cause), error
    assert "EOFError" not in error and "BrokenPipe" not in error
    # The last good state is kept: the iteration boundary before the crash (rank 1 fails at
    # its 90th step, num_timesteps 180, in the second 128-step rollout).
    last_good = "checkpoints/step-000000000128"
    assert run.data.tags["workbench.checkpoint"] == last_good
    files = {a.path for a in client.list_artifacts(run.info.run_id, last_good)}
    assert f"{last_good}/state.json" in files
    assert f"FAILED; checkpoint {last_good}; resume with" in err
    time.sleep(0.5)
    assert session_processes(session) == []


def test_worker_that_cannot_make_its_env_is_named(store: Path) -> None:
    with pytest.raises(guards.EnvWorkerError, match=r"^environment HalfCheetah-v5 worker rank 0 "
                       r"\(pid \d+\) crashed during make: TypeError: .*unexpected keyword "
                       r"argument 'no_such_kwarg'"):
        make_envs(EnvSpec("HalfCheetah-v5", 2, "subproc", kwargs={"no_such_kwarg": 1}))


# --------------------------------------------------------------------------- non-finite values


def test_nan_observation_fails_the_run_with_source_and_step(store: Path) -> None:
    env_id = FAULTY.format("NanObservationCheetah")
    with pytest.raises(guards.NonFiniteError) as info:
        train(load_config([*QUIET, f"env.id={env_id}"]))
    # Rank 1's 90th step is the vectorized step that brings num_timesteps to 180.
    assert str(info.value) == (
        f"non-finite values from environment {env_id} at step 180: nan in observations of "
        "env rank 1"
    )
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = only_run(client)
    assert run.info.status == "FAILED"
    assert run.data.tags["error"] == f"NonFiniteError: {info.value}"
    assert run.data.tags["workbench.checkpoint"] == "checkpoints/step-000000000128"


def test_huge_rewards_stop_at_the_nonfinite_loss(store: Path) -> None:
    env_id = FAULTY.format("HugeRewardCheetah")
    with pytest.raises(guards.NonFiniteError,
                       match=r"^non-finite train/loss=(inf|nan), train/value_loss=(inf|nan) in "
                             r"the update after step 256: lower algo.learning_rate"):
        # VecNormalize (on by default) would scale the rewards back to finite losses
        train(load_config([*QUIET, f"env.id={env_id}", "checkpoint.every_steps=0",
                           "env.normalize=false"]))
    run = only_run(MlflowClient(os.environ["MLFLOW_TRACKING_URI"]))
    assert run.info.status == "FAILED"
    # The checkpoint kept is the state before the bad update, never a NaN policy.
    assert run.data.tags["workbench.checkpoint"] == "checkpoints/step-000000000128"


def test_nonfinite_reward_and_action_are_named() -> None:
    venv = make_envs(EnvSpec(FAULTY.format("NanRewardCheetah"), 2, "dummy", seed=0))
    try:
        venv.reset()
        actions = np.zeros((2, 6), dtype=np.float32)
        with pytest.raises(guards.NonFiniteError) as info:
            for _ in range(200):
                venv.step(actions)
        assert str(info.value) == (
            "non-finite values from environment tests.faulty_envs:WorkbenchTest/"
            "NanRewardCheetah-v0 at step 180: inf in rewards of env rank 1"
        )
        actions[0, 2] = np.nan
        with pytest.raises(guards.NonFiniteError, match=r"^non-finite values from the policy at "
                           r"step 180: nan in actions of env rank 0$"):
            venv.step(actions)
    finally:
        venv.close()


# --------------------------------------------------------------------------- tracking outages


class LockStore(BaseCallback):
    """Holds an exclusive lock on the SQLite store from step ``start`` to step ``end``."""

    def __init__(self, db: Path, start: int, end: int) -> None:
        super().__init__()
        self.db, self.start, self.end = db, start, end
        self.connection: sqlite3.Connection | None = None
        self.iterations_while_locked = 0

    def _on_rollout_end(self) -> None:
        if self.connection is None and self.start <= self.num_timesteps < self.end:
            self.connection = sqlite3.connect(self.db, isolation_level=None, timeout=60)
            self.connection.execute("BEGIN EXCLUSIVE")
        elif self.connection is not None and self.num_timesteps >= self.end:
            self.connection.execute("COMMIT")
            self.connection.close()
            self.connection = None
        elif self.connection is not None:
            self.iterations_while_locked += 1

    def _on_step(self) -> bool:
        return True


@pytest.mark.slow
def test_locked_store_neither_stalls_nor_loses_metrics(store: Path) -> None:
    lock = LockStore(store / "mlflow.db", start=256, end=1024)
    result = train(load_config([*QUIET, "total_timesteps=1280"]), callbacks=[lock])
    # Training went on while every write to the store was blocked...
    assert lock.iterations_while_locked == 5
    # ...and nothing was dropped: every iteration's metrics arrived once.
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    for key in ("rollout/ep_rew_mean", "train/value_loss", "time/iterations"):
        steps = [m.step for m in client.get_metric_history(result.run_id, key)]
        assert sorted(steps) == list(range(128, 1281, 128)), key
    assert not (store / "outbox" / result.run_id).exists()


@pytest.mark.slow
def test_server_outage_mid_run_then_outage_at_the_end_and_sync(
    mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    overrides = [*QUIET, "console.iteration_lines=true", "checkpoint.every_steps=256"]
    client = MlflowClient(mlflow_server.url)

    # 1. The server goes away mid-run and comes back: the run loses nothing.
    proc, out, err = start_training(tmp_path, "first", *overrides, "total_timesteps=3840")
    wait_text(out, "| 256 steps |", proc)
    mlflow_server.stop()
    wait_text(err, "not reachable", proc)
    seen = out.read_text().count(" steps | ")
    deadline = time.monotonic() + 300
    while out.read_text().count(" steps | ") < seen + 3:  # training goes on meanwhile
        assert time.monotonic() < deadline and proc.poll() is None, err.read_text()
        time.sleep(0.1)
    proc.suspend()  # hold it while the server restarts, so the outage ends mid-run
    mlflow_server.start()
    proc.resume()
    assert proc.wait(timeout=600) == 0, err.read_text()
    assert "reachable again" in err.read_text()
    run_id = out.read_text().strip().splitlines()[-1]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    for key in ("rollout/ep_rew_mean", "train/value_loss", "time/iterations"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(128, 3841, 128)), key
    assert {a.path for a in client.list_artifacts(run_id, "model")} >= {"model/model.zip"}
    assert [c.step for c in checkpoint.stored_checkpoints(client, run_id)] == [
        3328, 3584, 3840]
    assert not (tmp_path / "experiments" / "outbox" / run_id).exists()

    # 2. The server is down when the run ends: the rest waits in the outbox for `runs sync`.
    proc, out, err = start_training(tmp_path, "second", *overrides, "total_timesteps=1280")
    wait_text(out, "| 256 steps |", proc)
    mlflow_server.stop()
    assert proc.wait(timeout=600) == 0, err.read_text()
    run_id = out.read_text().strip().splitlines()[-1]
    assert f"tracking writes of run {run_id} could not reach the store" in err.read_text()
    assert "run `workbench runs sync` when it is back" in err.read_text()
    assert (tmp_path / "experiments" / "outbox" / run_id / "journal.jsonl").exists()
    mlflow_server.start()
    synced = run_cli("runs", "sync")
    assert synced.returncode == 0, synced.stderr
    # (MLflow prints its own "View run" line for runs on a server; only ours are checked.)
    (line,) = [ln for ln in synced.stdout.splitlines() if ln.startswith(("synced", "pending"))]
    assert re.fullmatch(rf"synced {run_id}: [1-9]\d* write\(s\) delivered", line), line
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(run_id, "rollout/ep_rew_mean"))
    assert steps == list(range(128, 1281, 128))
    assert "eval/mean_reward" in run.data.metrics
    assert {a.path for a in client.list_artifacts(run_id, "model")} >= {"model/model.zip"}
    assert not (tmp_path / "experiments" / "outbox" / run_id).exists()


def test_outbox_keeps_what_the_store_refused_and_sync_delivers_it_once(
    store: Path, tmp_path: Path
) -> None:
    from mlflow.entities import Metric

    uri = os.environ["MLFLOW_TRACKING_URI"]
    client = MlflowClient(uri)
    experiment = client.create_experiment("outbox", artifact_location=(tmp_path / "a").as_uri())
    run_id = client.create_run(experiment).info.run_id
    # The same run, through a tracking server that is not there (nothing listens on the port).
    down = outbox.RunWriter(f"http://127.0.0.1:{free_port()}", run_id, drain_timeout_s=0.5)
    metrics = [Metric("loss", float(step), 1_700_000_000_000 + step, step) for step in (1, 2)]
    down.log_batch(run_id, metrics=metrics)
    down.log_text(run_id, "hello", "notes/hello.txt")
    down.set_terminated(run_id, "FINISHED")
    assert down.close() == 3  # nothing was lost: all three writes wait in the outbox
    folder = store / "outbox" / run_id
    assert len(journal.Journal(folder).pending()) == 3
    assert client.get_run(run_id).info.status == "RUNNING"

    result = runs.sync_outbox(client, folder)
    assert (result.delivered, result.left) == (3, 0)
    assert not folder.exists()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [
        (1, 1.0), (2, 2.0)]
    assert Path(client.download_artifacts(run_id, "notes/hello.txt", str(tmp_path))
                ).read_text() == "hello"
    # A replay (a write delivered, its acknowledgement lost in a kill) changes nothing.
    journal.apply(client, run_id, journal.encode_batch(metrics, [], []), journal.Journal(folder))
    assert len(client.get_metric_history(run_id, "loss")) == 2


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_nonfinite_policy_parameter_is_named(bad: float) -> None:
    """The one-pass scan (a float64 sum) finds a single bad element; the error names its
    parameter. A stand-in model: the check reads only ``policy`` and ``_n_updates``."""
    import torch
    from stable_baselines3.common.logger import Logger
    from workbench.training.faults import UpdateCheck, parameter_sum

    policy = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    model = type("Model", (), {"policy": policy, "_n_updates": 1, "num_timesteps": 512})()
    check = UpdateCheck()
    check.init_callback(model)  # type: ignore[arg-type]
    check.model.logger = Logger(folder=None, output_formats=[])
    check.check()  # finite: passes
    with torch.no_grad():
        policy[1].bias[0] = bad
    model._n_updates = 2
    with pytest.raises(guards.NonFiniteError, match=r"^non-finite policy parameter 1\.bias "
                                                    r"after the update at step"):
        check.check()
    # finite float32 extremes cannot overflow the float64 sum: no false alarm
    huge = torch.full((1000,), torch.finfo(torch.float32).max)
    assert np.isfinite(parameter_sum([huge, huge]))
