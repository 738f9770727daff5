"""A real small sweep for the sweep and report tests, made once per test session and shared.

``real_sweep`` runs ``workbench sweep`` (papermill executions of notebooks/train.ipynb, real
MuJoCo and MLflow, tiny budgets) over num_envs {1, 2} x n_steps {64, 128} with two workers
through the real command line (tests/test_sweep.py checks that invocation: its output, runs,
notebooks and resume), then extends the same sweep with a second seed at every point, so the
report has an iso-batch pair ((1, 128) and (2, 64): 128 samples per update) and every point
has mean ± std and an IQM interval over two seeds.
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from .conftest import TINY_VIDEO, embedded_store, run_cli

SWEEP_ID = "tiny-grid"
GRID = ["sweep.num_envs=[1,2]", "sweep.n_steps=[64,128]", "sweep.seeds=[0]"]
EXTRA_SEED = ["sweep.num_envs=[1,2]", "sweep.n_steps=[64,128]", "sweep.seeds=[1]"]
# TINY_VIDEO (the report shows videos) without the keys the grid sets; system metrics stay on
# (the bottleneck table uses them).
POINT_TINY = [o for o in TINY_VIDEO if o.split("=")[0] not in ("env.num_envs", "algo.n_steps")]


@dataclass(frozen=True)
class Sweep:
    """A store holding one small sweep."""

    experiments: Path
    uri: str
    sweep_id: str
    parent_id: str
    child_ids: tuple[str, ...]  # oldest first
    first: subprocess.CompletedProcess[str]  # the first invocation (seed 0) on the CLI
    first_parent: Run  # the parent run as that invocation left it

    def env(self) -> dict[str, str]:
        return {"MLFLOW_TRACKING_URI": self.uri, "WORKBENCH_EXPERIMENTS": str(self.experiments)}


@functools.cache
def real_sweep(root: Path) -> Sweep:
    """Run the sweep once per session into a store under ``root``."""
    from workbench.sweeps.sweep import run_sweep

    experiments = root / "report-sweep" / "experiments"
    uri = f"sqlite:///{experiments / 'mlflow.db'}"
    with embedded_store(experiments) as mp:
        mp.setenv("WORKBENCH_CPU_BUDGET", "2")  # 2 points at a time, 1 core each, anywhere
        first = run_cli(*first_sweep_args(), timeout=900)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        first_parent = sweep_runs(uri, "parent")[0]
        result = run_sweep(sweep_args(EXTRA_SEED)[1:])
        assert not result.failures, result.failures
    children = sweep_runs(uri, "child")
    return Sweep(experiments, uri, SWEEP_ID, result.parent_run_id,
                 tuple(r.info.run_id for r in children), first, first_parent)


def sweep_args(grid: list[str]) -> list[str]:
    """``workbench sweep`` arguments of the shared sweep for one grid."""
    return ["sweep", f"sweep.id={SWEEP_ID}", *grid, "sweep.workers=2", *POINT_TINY]


def first_sweep_args() -> list[str]:
    """The first invocation: seed 0 at every point."""
    return sweep_args(GRID)


def sweep_runs(uri: str, role: str) -> list[Run]:
    """The shared sweep's runs of one role (parent, child), oldest first."""
    client = MlflowClient(uri)
    return client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        f"tags.sweep_id = '{SWEEP_ID}' and tags.`sweep.role` = '{role}'",
        order_by=["attributes.start_time ASC"])


@functools.cache
def written_report(root: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``workbench report sweep=tiny-grid`` run once (a real subprocess): its result and the
    folder it writes. Tests read it; none writes into it."""
    sweep = real_sweep(root)
    out = root / "report-sweep" / "reports"
    proc = run_cli("report", "--sweep", sweep.sweep_id, "--out", str(out), env=sweep.env())
    return proc, out / f"sweep-{sweep.sweep_id}"


@pytest.fixture(scope="session")
def report_sweep(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    """The shared sweep (registered in tests/conftest.py)."""
    return real_sweep(tmp_path_factory.getbasetemp())


def client_for(sweep: Sweep) -> MlflowClient:
    return MlflowClient(sweep.uri)


def environ(sweep: Sweep) -> dict[str, str]:
    return {**os.environ, **sweep.env()}
