"""Runs for the report tests, made once per test session and shared by the report modules.

``real_sweep`` trains a small real grid through ``workbench.train.train`` (tiny budgets, real
MuJoCo and MLflow) tagged the way sweeps tag their runs (DESIGN.md "Sweep tags"): a parent
run ``sweep.role=parent`` and one child per point and seed.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from workbench import tracking
from workbench.config import load_config
from workbench.train import train

from .conftest import TINY

SWEEP_ID = "tiny-grid"
# num_envs x n_steps with one iso-batch pair ((1, 128) and (2, 64): 128 samples per update),
# two seeds at one point so the report shows mean ± std over seeds.
POINTS = [(1, 64, 0), (1, 128, 0), (2, 64, 0), (2, 64, 1), (2, 128, 0)]


@dataclass(frozen=True)
class Sweep:
    """A store holding one small sweep."""

    experiments: Path
    uri: str
    sweep_id: str
    parent_id: str
    child_ids: tuple[str, ...]

    def env(self) -> dict[str, str]:
        return {"MLFLOW_TRACKING_URI": self.uri, "WORKBENCH_EXPERIMENTS": str(self.experiments)}


@functools.cache
def real_sweep(root: Path) -> Sweep:
    """Train the grid once per session into a store under ``root``."""
    experiments = root / "report-sweep" / "experiments"
    uri = f"sqlite:///{experiments / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.setenv("WORKBENCH_EXPERIMENTS", str(experiments))
        client = MlflowClient(uri)
        # The experiment train() uses, artifacts under experiments/mlartifacts like every run.
        experiment_id = tracking.ensure_experiment(client, "workbench", uri)
        parent = client.create_run(experiment_id, run_name=f"sweep-{SWEEP_ID}", tags={
            "sweep_id": SWEEP_ID, "sweep.role": "parent",
            "mlflow.note.content": "tiny grid for the report tests",
        })
        children = []
        for num_envs, n_steps, seed in POINTS:
            cfg = load_config([*TINY, f"env.num_envs={num_envs}", f"algo.n_steps={n_steps}",
                               f"seed={seed}", "console.iteration_lines=false"])
            name = f"halfcheetah-ne{num_envs}-ns{n_steps}-s{seed}"
            result = train(cfg, parent_run_id=parent.info.run_id, tags={
                "sweep_id": SWEEP_ID, "sweep.role": "child", "sweep.point": name})
            children.append(result.run_id)
        client.set_terminated(parent.info.run_id, "FINISHED")
    return Sweep(experiments, uri, SWEEP_ID, parent.info.run_id, tuple(children))


def sweep_fixture(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    """Body of the ``sweep`` fixtures of the report test modules."""
    return real_sweep(tmp_path_factory.getbasetemp())


def client_for(sweep: Sweep) -> MlflowClient:
    return MlflowClient(sweep.uri)


def environ(sweep: Sweep) -> dict[str, str]:
    return {**os.environ, **sweep.env()}
