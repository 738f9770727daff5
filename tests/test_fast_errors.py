"""A typo is answered at once: bad input to train, sweep, tune, export, report and compare exits
2 with one line before torch, stable-baselines3, MLflow, matplotlib or the simulator is
imported.

Each row runs ``python -m workbench`` as a real subprocess with Python's import profiler on
(``PYTHONPROFILEIMPORTTIME``, the same as ``-X importtime``): its stderr lists every module
the command imported, so the test reads what was loaded, not how long it took on a machine
that may be busy.
"""

from __future__ import annotations

import pytest

from .conftest import run_cli

# What a typo must not wait for: the learner, the tracking store, the plots, the simulator.
HEAVY = {"torch", "stable_baselines3", "mlflow", "matplotlib", "mujoco", "envpool"}

BAD_INPUT = [
    # command line, what the one error line names
    (["train", "algo.n_step=64"], "algo.n_step"),  # unknown key
    (["train", "env=hoper"], "env=hoper"),  # unknown group option
    (["train", "algo.n_steps=many"], "algo.n_steps"),  # wrong type
    (["train", "algo.gamma=1.5"], "algo.gamma"),  # out of range
    (["train", "--cfg=yaml"], "--cfg"),  # unknown flag value
    (["sweep", "sweep.num_envz=[1,2]"], "sweep.num_envz"),
    (["sweep", "env.num_envs=4"], "env.num_envs"),  # a key the grid sets per point
    (["sweep", "sweep.num_envs=[1]", "sweep.n_steps=[64]", "algo.gamma=1.5"], "algo.gamma"),
    (["tune", "tune.objectiv=final_return"], "tune.objectiv"),
    (["tune", "algo.gamma=1.5"], "algo.gamma"),
    (["tune", "--n-trials", "0"], "--n-trials"),
    (["tune", "tune.seeds=[0,1]", "tune.recheck_seeds=[1,2]"], "tune.recheck_seeds"),
    (["export", "--run", "0123456789abcdef", "--obsrvations", "8"], "--obsrvations"),
    (["export", "--run", "0123456789abcdef", "--observations", "0"], "observations=0"),
    (["deploy", "verify", "--run", "0123456789abcdef", "--episodes", "0"], "--episodes 0"),
    (["deploy", "check", "--run", "0123456789abcdef"], "invalid choice: 'check'"),
    (["report", "--sweeep", "demo"], "--sweeep"),
    (["report", "--approx-kl-max", "-1"], "approx_kl_max=-1.0"),
    (["report", "tracking.urri=sqlite:///nowhere.db"], "tracking.urri"),
    (["report", "--compare", "0f3a9c", "0f3a9c"], "A and B are the same"),
    (["compare", "0f3a9c", "0f3a9c"], "A and B are the same"),  # before any store is read
    (["compare", "tiny-grid/", "0f3a9c"], "SWEEP_ID/POINT"),
]


def imported_modules(stderr: str) -> set[str]:
    """Top-level names of the modules ``-X importtime`` reports (``import time: ... | name``)."""
    return {line.rsplit("|", 1)[-1].strip().split(".")[0]
            for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize(("argv", "named"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_answers_before_heavy_imports(argv: list[str], named: str) -> None:
    proc = run_cli(*argv, env={"PYTHONPROFILEIMPORTTIME": "1"}, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1, lines
    assert lines[0].startswith("workbench: error: "), lines
    assert named in lines[0], lines
    loaded = imported_modules(proc.stderr) & HEAVY
    assert not loaded, f"{' '.join(argv)} imported {sorted(loaded)} before answering {lines[0]}"
