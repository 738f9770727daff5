"""``tune.executor=ray``: a real local Ray head (tests/raycluster.py's fixture) runs a
2-trial study's trials as Ray tasks; their notebooks come back to this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_cli
from .test_tune import CORES_2, TINY_STUDY, study_trials, tune_runs


@pytest.mark.slow
def test_ray_executor_runs_trials_as_tasks(store: Path, ray_head: str) -> None:
    args = ["tune", "--n-trials", "2", *TINY_STUDY, "tune.study=on-ray", "tune.executor=ray",
            f"tune.ray.address={ray_head}", "tune.workers=2"]
    proc = run_cli(*args, env=CORES_2, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"ray at {ray_head}: up to 2 trials at a time x 1 CPU each" in proc.stdout
    assert [t.state.name for t in study_trials(store, "on-ray")] == ["COMPLETE"] * 2
    children = tune_runs("trial")
    assert sorted(r.data.tags["tune.trial"] for r in children) == ["0", "1"]
    assert sorted(p.name for p in (store / "tuning" / "on-ray").glob("*.ipynb")) == [
        "trial-000.ipynb", "trial-001.ipynb"]  # carried back from the Ray workers
