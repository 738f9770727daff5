"""Slow tier: every learning claim the README makes about a shipped configuration holds.

- ``make demo``: every point of ``experiment=demo sweep=demo`` reaches InvertedPendulum's
  maximum return (1000) at the sweep's budget;
- ``notebooks/train.ipynb`` as it opens (its parameters cell's defaults) reaches it too.

Each configuration is composed the way it runs (the sweep's points and the notebook's
parameters through :meth:`NotebookParameters.config_overrides`) and trains on the backend
``env.vec_env=auto`` picks for it, so a change of ``auto``'s rule, of a tuning file or of the
defaults is re-checked here for what it does to learning, not only to speed. Learning, never
timing: how long it takes is in docs/benchmarks.md.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import nbformat
import pytest
from workbench.notebook import NotebookParameters
from workbench.sweeps.request import check_request
from workbench.training import load_config, train

from .conftest import ROOT

MAXIMUM = 1000.0  # InvertedPendulum-v5's maximum return (1000 steps of +1)
REACHED = 0.95 * MAXIMUM  # the mean of the final deterministic evaluation episodes
FAST = ["video=off", "tracking.system_metrics=false"]  # what the claim does not depend on


def notebook_defaults() -> dict[str, Any]:
    """The values of ``notebooks/train.ipynb``'s parameters cell, as a Run All sees them."""
    nb = nbformat.read(ROOT / "notebooks" / "train.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    values = {}
    for node in ast.parse(cell.source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            values[node.target.id] = ast.literal_eval(node.value)  # type: ignore[arg-type]
    return values


def demo_points() -> dict[str, dict[str, Any]]:
    """``make demo``'s points as the sweep hands them to the notebook (point -> parameters)."""
    request = check_request(["experiment=demo", "sweep=demo"])
    return {p.name: {"env": p.env, "num_envs": p.num_envs, "n_steps": p.n_steps,
                     "seed": p.seed,
                     "total_timesteps": p.total_timesteps or request.shared.total_timesteps,
                     "overrides": [*request.point_overrides, *p.overrides()]}
            for p in request.points}


def train_as_notebook(parameters: dict[str, Any]) -> Any:
    """Train what the notebook trains with these parameters (without its video)."""
    params = NotebookParameters(**{**parameters,
                                   "overrides": [*parameters["overrides"], *FAST]})
    return train(load_config(params.config_overrides()))


@pytest.mark.slow
@pytest.mark.parametrize("point", sorted(demo_points()))
def test_demo_sweep_point_reaches_maximum_return(store: Path, point: str) -> None:
    result = train_as_notebook(demo_points()[point])
    assert result.eval_mean_reward >= REACHED, (point, result.eval_mean_reward)


@pytest.mark.slow
def test_notebook_defaults_reach_maximum_return(store: Path) -> None:
    defaults = notebook_defaults()
    assert defaults["env"] == "inverted_pendulum"  # the task the README promises 1000 on
    result = train_as_notebook(defaults)
    assert result.eval_mean_reward >= REACHED, result.eval_mean_reward
