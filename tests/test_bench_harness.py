"""The benchmark harness's measured child processes (benchmarks/harness.py)."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import their sibling harness
import harness

HOLD_MB = 256


def test_a_childs_peak_memory_is_its_own_not_its_parents() -> None:
    """On Linux an exec'd child's ``ru_maxrss`` starts at its parent's memory: a child that
    stays small must not report this (pytest) process's peak, one that grows reports its own."""
    small = harness.Child([sys.executable, "-c", "pass"]).finish()
    assert small["peak_rss_mb"] < 100, small["peak_rss_mb"]
    assert harness.vm_hwm_mb() > 100  # the test process is bigger: the check above can fail
    grows = harness.Child([sys.executable, "-c",
                           f"import time; held = b'x' * ({HOLD_MB} << 20); time.sleep(1)"]).finish()
    assert HOLD_MB <= grows["peak_rss_mb"] < HOLD_MB + 100, grows["peak_rss_mb"]


def test_a_studys_chosen_trial_becomes_the_tasks_tuning_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tune_time_to_reward.py --write-tuning: the tuned preset ``workbench tune`` writes
    (its real writer) becomes conf/tuning/ppo_<task>.yaml, which ``env=<task>`` then composes,
    with the study, its command and the verdict in the header."""
    import tune_time_to_reward as bench
    from workbench.config import load_config
    from workbench.tuning.best import best_config_text
    from workbench.tuning.objectives import Objective

    args = bench.parse_args(["--task", "swimmer", "--target", "282", "--search", "ppo_suite",
                             "--trial-seeds", "0", "1", "2", "--write-tuning"])
    chosen = load_config(["env=swimmer", "algo=ppo_sb3", "env.num_envs=4", "algo.n_steps=1024",
                          "algo.gamma=0.9999", "algo.policy.log_std_init=-1.5"])
    best = best_config_text("bench-swimmer-ttr", Objective("time_to_target", 282.0, 120.0), 7,
                            95.0, None, chosen, {"n_steps": 1024, "gamma": 0.9999},
                            verdict="better than the defaults: PoI 0.91", seeds="0,1,2")
    text = bench.tuning_text(args, "bench-swimmer-ttr", best)
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert "#   workbench tune --n-trials 8 env=swimmer search=ppo_suite " in "\n".join(header)
    assert "tune.seeds=[0,1,2]" in "\n".join(header)
    assert "#   re-checked: better than the defaults: PoI 0.91" in header
    # written over the shipped file, as --write-tuning does, in a copy of conf/
    compose_module = importlib.import_module("workbench.config.compose")  # the function shadows it
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "conf" / "tuning" / "ppo_swimmer.yaml").write_text(text)
    monkeypatch.setattr(compose_module, "conf_dir", lambda: tmp_path / "conf")
    tuned = load_config(["env=swimmer"])
    assert (tuned.env.num_envs, tuned.algo.n_steps, tuned.algo.gamma) == (4, 1024, 0.9999)
    assert tuned.algo.policy.log_std_init == -1.5 and tuned.algo.name == "ppo"
    assert load_config(["env=swimmer", "~tuning"]).algo.n_steps != 1024


def test_a_time_ratio_says_which_side_missed_the_budget() -> None:
    import time_to_reward

    inf = float("inf")
    assert time_to_reward._ratio(30.0, 60.0, 120.0) == "0.50"
    assert time_to_reward._ratio(30.0, inf, 120.0).startswith("< 0.25 (baseline not reached")
    assert time_to_reward._ratio(inf, 60.0, 120.0).startswith("> 2.00 (workbench not reached")
    assert time_to_reward._ratio(inf, inf, 120.0) == "n/a (neither reached)"
