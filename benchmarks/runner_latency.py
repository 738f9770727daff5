"""The standalone runner's latency against the mini duck's 50 Hz control period.

Trains the duck's standing preset (``experiment=duck``, in a fresh store; ``--run RUN_ID``
takes an exported run of the configured store instead), exports it (``workbench export``,
1000 timed calls after 100 warm-up ones), then runs ``workbench deploy verify``: the runner in
its own process, MuJoCo in real time on the other end of a local socket. It prints the
verification and one table: per stage, the runner's steps, its first call, its latency p50,
p99 and max after warm-up, its cycle max and its overruns of the period, and beside them the
export's in-process ONNX Runtime figures (numpy observation to numpy action).

    python benchmarks/runner_latency.py                 # train, export, verify (~2 min, 2 cores)
    python benchmarks/runner_latency.py --episodes 5
    python benchmarks/runner_latency.py --run RUN_ID    # an exported run of the configured store
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

TRAIN = ["experiment=duck", "video=off", "console.progress_bar=false",
         "console.iteration_lines=false"]


def workbench(*args: str) -> dict[str, Any]:
    """``python -m workbench ARGS`` as a measured child process."""
    return harness.run_child([sys.executable, "-m", "workbench", *args])


def trained_and_exported() -> str:
    """A fresh store with the duck's standing preset trained and exported; its run id."""
    experiments = Path(tempfile.mkdtemp(prefix="runner-latency-")) / "experiments"
    os.environ["WORKBENCH_EXPERIMENTS"] = str(experiments)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{experiments / 'mlflow.db'}"
    run_id = workbench("train", *TRAIN)["stdout"].strip().splitlines()[-1]
    workbench("export", "--run", run_id)
    return run_id


def export_report(run_id: str) -> dict[str, Any]:
    """The run's ``export/export_report.json``."""
    from workbench.deploy import export

    client = export.open_store()
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, f"{export.ARTIFACT_DIR}/{export.REPORT_NAME}",
                                         tmp)
        report: dict[str, Any] = json.loads(Path(path).read_text())
    return report


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", metavar="RUN_ID",
                        help="an exported run of the configured store (default: train one)")
    parser.add_argument("--episodes", type=int, default=3,
                        help="closed-loop real-time episodes (default 3)")
    args = parser.parse_args(argv)
    print(f"runner latency: {harness.load_line()}", flush=True)
    run_id = args.run or trained_and_exported()
    from workbench.deploy import export, verification

    export.quiet_downloads()

    result = verification.verify_run(run_id, episodes=args.episodes)
    print(verification.format_verification(result))
    onnx = verification.onnx_latency(export_report(run_id)["latency"])
    period_ms = result.contract["control"]["period_s"] * 1e3
    rows = [[stage.name, stage.timing["steps"], stage.timing["first_call_ms"],
             stage.timing["latency_ms"]["p50"], stage.timing["latency_ms"]["p99"],
             stage.timing["latency_ms"]["max"], stage.timing["cycle_ms"]["max"],
             stage.timing["overruns"] if stage.timing["paced"] else "unpaced"]
            for stage in result.stages if stage.timing is not None]
    rows.append(["export, in process", 1000, float("nan"), onnx["p50"], onnx["p99"], onnx["max"],
                 float("nan"), "-"])
    harness.print_table(f"Runner latency (ms) against the {period_ms:g} ms period, "
                        f"{harness.load_line()}",
                        ["stage", "steps", "first", "p50", "p99", "max", "cycle max",
                         "overruns"], rows)
    command = shlex.join(["python", "benchmarks/runner_latency.py", *argv])
    path = harness.write_results("runner_latency", {
        "command": command, "run_id": run_id, "episodes": args.episodes,
        "period_ms": period_ms, "passed": result.passed,
        "stages": {stage.name: {"passed": stage.passed, "line": stage.line,
                                "timing": stage.timing} for stage in result.stages},
        "export_onnxruntime_end_to_end_ms": dict(onnx)})
    print(f"command: {command}")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
