"""A custom robot's ``module:Id`` works everywhere a built-in task does: randomization,
subprocess workers, checkpoints and resume, evaluation, export."""

from __future__ import annotations

import os
from pathlib import Path

from mlflow.tracking import MlflowClient

from .conftest import TINY, run_cli

CUSTOM = "tests.custom_robot:Custom/Cheetah-v0"
OVERRIDES = [*TINY, f"env.id={CUSTOM}", "env.vec_env=subproc",
             "env.randomization.friction=[0.8,1.2]", "env.randomization.obs_noise_std=0.01",
             "eval.randomization.mass_scale=[0.9,1.1]", "checkpoint.every_steps=128",
             "tracking.system_metrics=false", "console.iteration_lines=false"]


def test_custom_module_id_trains_resumes_and_exports(store: Path) -> None:
    first = run_cli("train", *OVERRIDES)
    assert first.returncode == 0, first.stderr[-2000:]
    run_id = first.stdout.strip().splitlines()[-1]
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert (run.data.params["env.id"], run.data.params["derived.vec_env"]) == (CUSTOM, "subproc")
    assert "eval/mean_reward" in run.data.metrics
    # A run's stored env id is data: resuming imports its module only when the command line
    # names it too (SECURITY.md), as exporting does with --allow-module.
    more = run_cli("train", f"resume={run_id}", f"env.id={CUSTOM}", "total_timesteps=640")
    assert more.returncode == 0, more.stderr[-2000:]
    resumed = client.get_run(run_id)
    assert resumed.info.status == "FINISHED" and resumed.data.tags["resume.count"] == "1"
    assert max(m.step for m in client.get_metric_history(run_id, "rollout/ep_rew_mean")) == 640
    exported = run_cli("export", "--run", run_id, "--allow-module", CUSTOM.split(":")[0],
                       "--observations", "16", "--episodes", "1", "--warmup", "0")
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert "export/policy.onnx" in {a.path for a in client.list_artifacts(run_id, "export")}
