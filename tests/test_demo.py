"""Slow tier: the README's demo configuration really learns (InvertedPendulum to 1000)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from workbench.training import load_config, train


@pytest.mark.slow
def test_demo_reaches_maximum_return(store: Path) -> None:
    result = train(load_config(["experiment=demo", "console.progress_bar=false"]))
    assert result.eval_mean_reward >= 950.0, result
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    evals = client.get_metric_history(result.run_id, "eval/mean_reward")
    assert [m.step for m in evals][:3] == [10240, 20480, 30720]
