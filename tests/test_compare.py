"""notebooks/compare.ipynb's own part (workbench.review.compare): seeds counted once however
often they ran, mean curves over the runs that reach each step, and a selection that matches
nothing stopping the notebook with one line naming its parameter. Synthetic runs logged with
MlflowClient in a scratch store: no training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import papermill
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from papermill.exceptions import PapermillExecutionError
from workbench.review import compare, records, statistics
from workbench.review.diagnostics import Series
from workbench.review.selection import Selection

from .conftest import ROOT

NOTEBOOK = ROOT / "notebooks" / "compare.ipynb"
REWARD = "rollout/ep_rew_mean"


def logged_run(client: MlflowClient, experiment_id: str, seed: int, last_step: int,
               status: str = "FINISHED", tags: dict[str, str] | None = None) -> str:
    """A run of task "toy" (2 envs x 64 steps) whose reward is ``seed + step / 1000``,
    logged every 1000 steps up to ``last_step``."""
    run = client.create_run(experiment_id, run_name=f"toy-ne2-ns64-s{seed}",
                            tags={"env": "toy", "num_envs": "2", "n_steps": "64",
                                  "seed": str(seed), **(tags or {})})
    steps = range(1000, last_step + 1, 1000)
    client.log_batch(run.info.run_id, metrics=[Metric(REWARD, seed + s / 1000, 0, s)
                                               for s in steps])
    client.set_terminated(run.info.run_id, status)
    return run.info.run_id


def test_repeated_seeds_count_once_and_curves_outlast_a_killed_run(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("toy", artifact_location=(tmp_path / "a").as_uri())
    ids = [logged_run(client, exp, 0, 4000) for _ in range(3)]
    ids.append(logged_run(client, exp, 0, 2000, status="KILLED"))
    rep = records.build_report(client, Selection(run_ids=tuple(ids)), store=uri)
    (point,) = rep.points
    assert (len(point.runs), point.seeds, point.runs_text) == (4, 1, "4 runs of 1 seed")
    assert records.runs_text(point.runs[:1]) == "1 seed"

    curve = statistics.mean_curve([r.metrics[REWARD] for r in point.runs])
    assert curve.steps.tolist() == [1000, 2000, 3000, 4000]  # not cut at the killed run's 2000
    assert curve.runs.tolist() == [4, 4, 3, 3]
    assert curve.mean.tolist() == pytest.approx([1.0, 2.0, 3.0, 4.0])
    summary = compare.summary_markdown(rep)
    assert "Seeds repeated (each seed counts once): toy-ne2-ns64 (4 runs of 1 seed)" in summary
    assert "toy-ne2-ns64 toy-ne2-ns64-s0 (KILLED at 2,000 of 4,000 steps)" in summary


def test_mean_curve_of_distinct_seeds_at_different_steps() -> None:
    short = Series.of([100, 200], [1.0, 3.0])
    long = Series.of([50, 150, 250, 350], [0.0, 2.0, 4.0, 6.0])
    curve = statistics.mean_curve([short, long, Series.of([], [])])
    assert curve.steps.tolist() == [50, 100, 150, 200, 250, 350]
    assert curve.runs.tolist() == [1, 2, 2, 2, 1, 1]
    # Within its own range a run is interpolated; outside it, it does not count.
    assert curve.mean.tolist() == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0, 6.0])
    assert curve.std.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert len(statistics.mean_curve([])) == 0
    three = [Series.of([1, 2], [float(v), float(v)]) for v in (0, 1, 2)]
    assert np.allclose(statistics.mean_curve(three).std, np.std([0, 1, 2]))


@pytest.mark.slow  # a kernel importing the report's modules: ~15 s on a busy 2-core machine
def test_missing_sweep_stops_the_notebook_with_one_line(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("toy", artifact_location=(tmp_path / "a").as_uri())
    logged_run(client, exp, 0, 1000, tags={"sweep_id": "s-real", "sweep.role": "parent"})
    logged_run(client, exp, 0, 1000, tags={"sweep_id": "s-real", "sweep.role": "point"})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    output = tmp_path / "out.ipynb"
    with pytest.raises(PapermillExecutionError) as info:
        papermill.execute_notebook(str(NOTEBOOK), str(output), parameters={"sweep_id": "nope"},
                                   kernel_name="workbench", progress_bar=False,
                                   cwd=str(NOTEBOOK.parent))
    line = f"sweep_id='nope': no such sweep in {uri}; set sweep_id to one of s-real"
    assert (info.value.ename, info.value.evalue) == ("ConfigError", line)
    cells = json.loads(output.read_text())["cells"]
    (failed,) = [o for c in cells for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert failed["traceback"] == [f"workbench: error: {line}"]
    assert "--sweep" not in output.read_text()
