"""Shared fixtures: a temporary MLflow store and the real config, shrunk for speed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Tiny but real: HalfCheetah, 2 envs, 64-step rollouts, a few PPO iterations.
TINY = [
    "env=halfcheetah",
    "env.num_envs=2",
    "algo.n_steps=64",
    "algo.batch_size=64",
    "algo.n_epochs=2",
    "total_timesteps=384",
    "eval.every_steps=128",
    "eval.n_episodes=1",
    "eval.final_episodes=1",
    "env.max_episode_steps=50",
    "console.progress_bar=false",
    "tracking.system_metrics_interval_s=1",
]


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh embedded MLflow store under tmp_path (MLFLOW_TRACKING_URI and experiments/)."""
    experiments = tmp_path / "experiments"
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(experiments))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{experiments / 'mlflow.db'}")
    return experiments


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
            **kwargs) -> subprocess.CompletedProcess[str]:
    """Run ``python -m workbench ARGS`` as a real subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env={**os.environ, **(env or {})}, **kwargs,
    )


# Team mode (tests/test_server.py, tests/test_copy.py): one PostgreSQL + MLflow server per session.
from tests.teamserver import team_server  # noqa: E402, F401
