"""``make bench ARGS=--quick`` runs the whole suite end to end (real MuJoCo, SB3, MLflow).

Correctness only: every part ran and wrote its results with the expected structure; no
timing is asserted (benchmarks print ratios instead).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT


def run_script(script: str, *args: str, results: Path, timeout: float = 900
               ) -> subprocess.CompletedProcess[str]:
    """``benchmarks/SCRIPT ARGS`` with its results written under ``results``."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT,
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "WORKBENCH_BENCH_RESULTS": str(results)})


@pytest.mark.slow
def test_make_bench_runs_its_parts_and_sums_them_up(tmp_path: Path) -> None:
    """What only the whole suite proves: the Make target, the parts run one after the other,
    and the summary read from their results. Two quick parts suffice (each part's own smoke
    is below, smaller than its quick mode)."""
    results = tmp_path / "results"
    # The test runs inside the set-up venv; `-o setup` skips re-installing it (make test did).
    proc = subprocess.run(
        ["make", "-o", "setup", "bench", "ARGS=--quick --only physics tracking",
         f"VENV={sys.prefix}"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "WORKBENCH_BENCH_RESULTS": str(results)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Summary: measured ratios against the targets of docs/benchmarks.md" in proc.stdout

    physics = json.loads((results / "physics.json").read_text())
    assert physics["c_phys"]["HalfCheetah-v5"]["frame_skip"] == 5
    assert physics["c_phys"]["HalfCheetah-v5"]["c_phys"] > 0
    assert set(physics["r_env"]) >= {"dummy", "subproc"}
    assert all(set(per) == {"1", "16"} for per in physics["r_env"].values())

    overhead = json.loads((results / "tracking_overhead.json").read_text())
    assert len(overhead["runs"]["bare"]) == len(overhead["runs"]["workbench"]) == 1

    bench = json.loads((results / "bench.json").read_text())
    assert bench["quick"] is True
    assert bench["parts"] == ["physics", "tracking"]
    assert set(bench["durations_s"]) == {"physics", "tracking"}
    measures = [row["measure"] for row in bench["summary"]]
    assert measures == ["best R_env at 16 envs (HalfCheetah-v5)",
                        "tracking overhead (workbench/bare wall time)"]


@pytest.mark.slow
def test_batched_sampling_tables_side_by_side(tmp_path: Path) -> None:
    """benchmarks/batched.py shrunk (one task, 2 envs, 0.05 s a case): every backend measured
    in one run, the docs' two tables filled from it."""
    results = tmp_path / "results"
    proc = run_script("batched.py", "--tasks", "halfcheetah", "--envs", "2", "--reps", "1",
                      "--seconds", "0.05", results=results)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((results / "batched.json").read_text())
    cases = ["dummy+rand", "subproc+rand", "batched+rand", "batched"]
    measured = set(data["table"]["HalfCheetah-v5"])
    assert measured >= set(cases) and measured <= {*cases, "envpool"}
    sampling, time = data["tables"]["sampling"], data["tables"]["time"]
    assert sampling["headers"] == ["task", *cases, "envpool"]
    assert [row[0] for row in sampling["rows"]] == ["HalfCheetah-v5"]
    assert all("(" in cell for cell in sampling["rows"][0][1:5])  # rate (share of C_phys...)
    (split,) = data["time_split_per_rep"]["HalfCheetah-v5"]
    assert split["physics_us"] > 0 and split["rest_us"] > 0
    assert time["rows"][0][0] == "HalfCheetah-v5" and len(time["rows"][0]) == 5
    assert data["command"].endswith("benchmarks/batched.py --tasks halfcheetah --envs 2 "
                                    "--reps 1 --seconds 0.05")


@pytest.mark.slow
def test_train_and_reward_parts_shrunk_feed_the_summary(tmp_path: Path) -> None:
    """The suite's two training parts, each smaller than its quick mode, and the summary rows
    bench.py makes of their results."""
    results = tmp_path / "results"
    proc = run_script("train_throughput.py", "--quick", "--backends", "dummy", "--steps", "2048",
                      results=results)
    assert proc.returncode == 0, proc.stderr[-3000:]
    throughput = json.loads((results / "train_throughput.json").read_text())
    kinds = {(r["backend"], r["kind"]) for r in throughput["runs"]}
    assert kinds == {("dummy", "bare"), ("dummy", "workbench")}
    assert all(r["steps"] == 2048 and r["peak_rss_mb"] > 0 for r in throughput["runs"])
    assert math.isfinite(throughput["summary"]["lowest_r_train"])

    # One rollout and one evaluation per contestant (the zoo's PPO makes 20 epochs an update;
    # the zoo's SAC, an algorithm contestant, is still in its 10,000 random warm-up steps).
    proc = run_script("time_to_reward.py", "--quick", "--budget-s", "4", "--max-steps", "1024",
                      "--eval-every", "1024", "--episodes", "1", "--algos", "sac",
                      results=results)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reward = json.loads((results / "time_to_reward.json").read_text())
    assert sorted(r["contestant"] for r in reward["runs"]) == ["sac", "sb3", "workbench", "zoo"]
    assert [r["overrides"] for r in reward["runs"] if r["contestant"] == "sac"] == [
        ["experiment=zoo_sac_halfcheetah"]]
    assert all(r["evals"] and r["thresholds"] == [0.0] for r in reward["runs"])
    # the zoo contestant is rl_zoo3's own ExperimentManager on its HalfCheetah entry
    assert [(r["zoo_entry"], r["num_envs"]) for r in reward["runs"]
            if r["contestant"] == "zoo"] == [("HalfCheetah-v4", 1)]

    summary = subprocess.run(
        [sys.executable, "-c", "import sys, json; sys.path.insert(0, 'benchmarks'); "
         "import bench; print(json.dumps(bench.summary_rows(['train', 'reward'])))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "WORKBENCH_BENCH_RESULTS": str(results)})
    assert summary.returncode == 0, summary.stderr[-3000:]
    rows = json.loads(summary.stdout)
    assert rows[0][:3] == ["lowest R_train", throughput["summary"]["lowest_r_train"], ">= 0.98"]
    bases = list(reward["summary"]["halfcheetah"]["ratios"])  # workbench/sb3, workbench/zoo
    assert [row[0].split(" (")[0] for row in rows[1:]] == [
        f"halfcheetah time to 0, {base}" for base in bases]


@pytest.mark.slow
def test_final_return_trains_seeds_side_by_side(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "final_return.py"), "--steps", "2048",
         "--seeds", "0", "1", "--parallel", "2", "--episodes", "1",
         "env.num_envs=2", "algo.n_steps=64", "env.vec_env=dummy"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "WORKBENCH_BENCH_RESULTS": str(results)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rl-baselines3-zoo publishes 5819 +- 664" in proc.stdout
    data = json.loads((results / "final_return_halfcheetah.json").read_text())
    assert [r["seed"] for r in data["runs"]] == [0, 1]
    assert all(math.isfinite(r["final_return"]) and r["vec_env"] == "dummy"
               for r in data["runs"])
    assert len({r["run_id"] for r in data["runs"]}) == 2


def test_final_return_rejects_no_parallelism() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "final_return.py"), "--parallel", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "--parallel 0: must be at least 1" in proc.stderr


def test_time_to_reward_rescore_reads_recorded_curves(tmp_path: Path) -> None:
    def run(contestant: str, curve: list[tuple[float, float]]) -> dict[str, object]:
        return {"task": "hopper", "seed": 0, "contestant": contestant, "thresholds": [2000.0],
                "reached": {}, "steps": 30_000, "fps": 1000.0, "update_share": 0.3,
                "evals": [{"steps": 10_000 * (i + 1), "train_s": t, "return": r}
                          for i, (t, r) in enumerate(curve)]}

    recorded = tmp_path / "time_to_reward.json"
    recorded.write_text(json.dumps({"args": {"budget_s": 120.0}, "runs": [
        run("workbench", [(10.0, 300.0), (20.0, 950.0), (30.0, 990.0)]),
        run("zoo", [(40.0, 200.0), (80.0, 600.0), (120.0, 700.0)]),
    ]}))
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "time_to_reward.py"), "--rescore",
         str(recorded), "--thresholds", "500", "900"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "WORKBENCH_BENCH_RESULTS": str(results)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((results / "time_to_reward_rescored.json").read_text())["summary"]
    assert summary["hopper"]["median_s"] == {"workbench": [20.0, 20.0],
                                             "zoo": [80.0, math.inf]}
    assert summary["hopper"]["ratios"]["workbench/zoo"][0] == 0.25
    assert summary["hopper"]["ratio_upper_bounds"]["workbench/zoo"][1] == 20.0 / 120.0


def test_time_to_reward_rescore_needs_thresholds(tmp_path: Path) -> None:
    recorded = tmp_path / "time_to_reward.json"
    recorded.write_text("{}")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "time_to_reward.py"), "--rescore",
         str(recorded)], cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "--rescore needs --thresholds" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("control", [False, True], ids=["workbench", "control"])
def test_tracking_overhead_runs_pairs_concurrently(tmp_path: Path, control: bool) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tracking_overhead.py"), "--concurrent",
         "--reps", "2", "--steps", "1024", "--num-envs", "2", "--n-steps", "256",
         *(["--control"] if control else [])],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "WORKBENCH_BENCH_RESULTS": str(results)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 repetitions at the same time, one core each" in proc.stdout
    data = json.loads((results / "tracking_overhead.json").read_text())
    assert data["args"]["concurrent"] is True and data["args"]["control"] is control
    for side in ("bare", "workbench"):
        runs = data["runs"][side]
        assert len(runs) == 2
        for run in runs:
            # the split covers the training span: setup before the first rollout is all
            # that lies outside it
            assert run["rollout_s"] > 0 and run["update_s"] > 0
            assert run["rollout_s"] + run["update_s"] <= run["train_s"] * 1.01
    assert math.isfinite(data["ratio"])


def test_instruction_overhead_rejects_bad_iterations() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "instruction_overhead.py"),
         "--iterations", "3", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "--iterations 3 1: need 0 < SHORT < LONG" in proc.stderr
