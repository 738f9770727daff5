"""``benchmarks/gpu_check.py`` (make gpu-check): its figures, its verdicts, its CPU half.

This machine has no GPU: the GPU half cannot run here and is not faked. What is tested is
everything the check computes from what it reads (unit), the no-GPU path end to end with
real trainings and the real export (slow), and the Ctrl-C machinery with device=cpu: a real
SIGINT to a real training's process group and the report the interrupted process gives.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from .conftest import ROOT


def load_gpu_check() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its sibling harness
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" /
                                                  "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gc = load_gpu_check()


@pytest.mark.unit
def test_throughput_leaves_out_the_first_iteration() -> None:
    figures = gc.split_figures([5.0, 1.0, 1.0], [3.0, 1.0, 3.0], samples_per_iteration=512)
    assert figures == {"steps_per_s": 1024 / 6.0, "update_share": 4.0 / 6.0, "iterations": 2.0}
    single = gc.split_figures([1.0], [1.0], 64)  # one iteration: nothing else to use
    assert single["steps_per_s"] == 32.0
    assert math.isnan(gc.split_figures([], [], 64)["steps_per_s"])


@pytest.mark.unit
def test_determinism_compares_every_value_bit_for_bit() -> None:
    a = {"train/loss": [(64, 0.5), (128, float("nan"))], "rollout/ep_rew_mean": [(64, 1.0)]}
    assert gc.first_difference(a, json.loads(json.dumps(a))) is None  # NaN equals NaN
    b = {**a, "train/loss": [(64, 0.5), (128, 0.25000000000000006)]}
    assert gc.first_difference(a, b) == "train/loss at step 128: nan vs 0.25000000000000006"
    assert gc.first_difference(a, {"train/loss": a["train/loss"]}).startswith("keys differ")


@pytest.mark.unit
def test_nvidia_smi_compute_processes_are_parsed() -> None:
    text = "12345, 1024\n23456, [N/A]\n"  # --query-compute-apps=pid,used_memory,nounits
    found = gc.parse_compute_apps(text)
    assert found[12345] == 1024.0 and math.isnan(found[23456])
    assert gc.parse_compute_apps("") == {}


@pytest.mark.unit
def test_no_gpu_line_and_table() -> None:
    cpu_build = SimpleNamespace(__version__="2.13.0+cpu", version=SimpleNamespace(cuda=None),
                                cuda=SimpleNamespace(is_available=lambda: False))
    line = gc.no_gpu_line(cpu_build)
    assert line.startswith("no GPU: torch 2.13.0+cpu is the CPU build; ran the CPU half only")
    assert "\n" not in line
    no_driver = SimpleNamespace(__version__="2.13.0+cu128", version=SimpleNamespace(cuda="12.8"),
                                cuda=SimpleNamespace(is_available=lambda: False))
    assert "(CUDA 12.8) finds no usable GPU or driver" in gc.no_gpu_line(no_driver)
    gpu = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True))
    assert gc.no_gpu_line(gpu) is None
    table = gc.render([{"check": "manifest", "result": "ok", "figures": "driver 570"},
                       {"check": "memory after Ctrl-C", "result": "FAILED", "figures": "x"}])
    assert table.splitlines() == [
        "check                result  figures",
        "manifest             ok      driver 570",
        "memory after Ctrl-C  FAILED  x",
    ]


@pytest.mark.slow
@pytest.mark.skipif(gc.no_gpu_line(__import__("torch")) is None, reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_runs_the_cpu_half_and_exits_0(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--quick"], cwd=ROOT,
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "WORKBENCH_BENCH_RESULTS": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("no GPU: ") and sum(ln.startswith("no GPU") for ln in lines) == 1
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["gpu"] is False and data["failed"] == [] and data["no_gpu"] == lines[0]
    assert [r["check"] for r in data["checks"]] == [
        "throughput num_envs=1", "throughput num_envs=2", "export"]
    for row in data["checks"][:2]:
        cpu = row["runs"]["cpu"]
        assert set(row["runs"]) == {"cpu"} and cpu["steps_per_s"] > 0 and cpu["iterations"] == 2
        assert 0 < cpu["update_share"] < 1
    export = data["checks"][2]["export"]
    assert export["parity"]["passed"] is True
    assert export["fp16"] == {"skipped": "no CUDA device (FP16 runs only on a GPU)"}
    table = proc.stdout[proc.stdout.index("\ncheck "):]
    assert "throughput num_envs=2  measured  cpu " in table


@pytest.mark.slow
def test_ctrl_c_report_from_an_interrupted_training(tmp_path: Path) -> None:
    """The GPU half's Ctrl-C check, run with device=cpu: real SIGINT, real report."""
    experiments = tmp_path / "experiments"
    env = {"WORKBENCH_EXPERIMENTS": str(experiments), "PYTHONUNBUFFERED": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{experiments / 'mlflow.db'}"}
    report = gc.interrupt_check([*gc.BASE, "env.num_envs=2", "env.vec_env=subproc",
                                 "total_timesteps=10000000", "device=cpu"], env)
    assert report["interrupted"] is True
    assert report["allocated_with_traceback"] == report["allocated_after"] == 0  # no CUDA
    assert len(report["pids"]) >= 3  # the training and its two env workers at least
    assert report["processes_alive"] == [] and report["left_on_gpu"] == []
    assert report["ok"] is True


def test_an_interrupted_run_keeps_no_snapshot_alive_through_its_traceback(store: Path) -> None:
    """What "memory after Ctrl-C" measures on a GPU, shown with device=cpu: with the
    traceback kept (a notebook's sys.last_traceback), the run's in-memory snapshot (cloned
    on the model's device) is released, and the policy is off any accelerator."""
    import gc as garbage
    import signal

    from stable_baselines3.common.callbacks import BaseCallback
    from workbench.training import load_config, train
    from workbench.training.checkpoint import RecoveryCallback

    from .conftest import TINY

    class CtrlC(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps == 192:  # past the first iteration: a snapshot exists
                os.kill(os.getpid(), signal.SIGINT)
            return True

    kept = None
    try:
        train(load_config([*TINY, "tracking.system_metrics=false",
                           "total_timesteps=100000"]), callbacks=[CtrlC()])
    except KeyboardInterrupt as exc:
        kept = exc.__traceback__
    assert kept is not None
    garbage.collect()
    alive = [o for o in garbage.get_objects() if isinstance(o, RecoveryCallback)]
    assert alive, "the traceback keeps the run's objects alive, as in a notebook"
    assert all(o.snapshot is None for o in alive)
    assert all(p.device.type == "cpu" for o in alive for p in o.model.policy.parameters())
