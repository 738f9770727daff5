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


@pytest.mark.slow
def test_make_bench_quick_runs_end_to_end(tmp_path: Path) -> None:
    results = tmp_path / "results"
    # The test runs inside the set-up venv; `-o setup` skips re-installing it (make test did).
    proc = subprocess.run(
        ["make", "-o", "setup", "bench", "ARGS=--quick", f"VENV={sys.prefix}"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "WORKBENCH_BENCH_RESULTS": str(results),
             "WORKBENCH_CALIBRATION_CACHE": str(tmp_path / "vec_env.json")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Summary: measured ratios against issue 8's targets" in proc.stdout

    physics = json.loads((results / "physics.json").read_text())
    assert physics["c_phys"]["HalfCheetah-v5"]["frame_skip"] == 5
    assert physics["c_phys"]["HalfCheetah-v5"]["c_phys"] > 0
    assert set(physics["r_env"]) >= {"dummy", "subproc"}
    assert all(set(per) == {"1", "16"} for per in physics["r_env"].values())

    throughput = json.loads((results / "train_throughput.json").read_text())
    kinds = {(r["backend"], r["kind"]) for r in throughput["runs"]}
    assert ("dummy", "bare") in kinds and ("dummy", "workbench") in kinds
    assert all(r["steps"] == 8192 and r["peak_rss_mb"] > 0 for r in throughput["runs"])
    assert math.isfinite(throughput["summary"]["lowest_r_train"])

    overhead = json.loads((results / "tracking_overhead.json").read_text())
    assert len(overhead["runs"]["bare"]) == len(overhead["runs"]["workbench"]) == 1

    reward = json.loads((results / "time_to_reward.json").read_text())
    assert sorted(r["contestant"] for r in reward["runs"]) == ["sb3", "workbench", "zoo"]
    assert all(r["evals"] and r["thresholds"] == [0.0] for r in reward["runs"])

    bench = json.loads((results / "bench.json").read_text())
    assert bench["quick"] is True
    assert bench["parts"] == ["physics", "train", "tracking", "reward"]
    measures = [row["measure"] for row in bench["summary"]]
    assert measures[:3] == ["best R_env at 16 envs (HalfCheetah-v5)", "lowest R_train",
                            "tracking overhead (workbench/bare wall time)"]
