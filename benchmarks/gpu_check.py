"""GPU server check: one command, at most 8 minutes, one table and a JSON file.

    make gpu-check                               # or: python benchmarks/gpu_check.py
    python benchmarks/gpu_check.py --quick       # smaller: num_envs 1 and 2, 3 iterations
    python benchmarks/gpu_check.py --num-envs 1 16 64 env=hopper

What it runs, each training a fresh child process (``workbench.training.train`` over
``workbench.training.load_config``) on a temporary MLflow store:

1. **throughput**: device=cpu and device=cuda at each num_envs (HalfCheetah, dummy vec env,
   64-step rollouts, the workbench's PPO defaults): steps/s and the update's share of the
   time, from the runs' own ``time/rollout_s``/``time/update_s`` (first iteration left out:
   it carries CUDA's start-up), and the cuda/cpu ratio;
2. **fp16 export**: the cuda run exported as ``workbench export`` does; the FP16 TorchScript
   actor on the GPU (``fp16_variant``): max |diff| against the FP32 actions and end-to-end
   latency, next to FP32 TorchScript on the CPU;
3. **deterministic**: two device=cuda runs with ``repro.deterministic=true``, every metric
   series compared bit for bit (the wall-clock keys aside, as in docs/tracking.md);
4. **system metrics**: MLflow's GPU metrics and the workbench's temperature/clock sampler
   (``system/gpu_*``) present in the cuda run;
5. **manifest**: driver, CUDA, cuDNN and GPU fields of the cuda run's manifest filled;
6. **memory after Ctrl-C**: SIGINT to the process group of a device=cuda training (subproc
   workers), as a terminal sends it; then ``torch.cuda.memory_allocated`` in the interrupted
   process (the traceback kept alive, as a notebook keeps it, and after dropping it) and
   ``nvidia-smi``'s compute processes: none of the training's processes may be left.

Without a GPU it says so in one line, runs the CPU half (cpu throughput, the FP32 export
checks) and exits 0. Exit 1 when a check fails, 2 for bad arguments. Results:
``benchmarks/results/gpu_check.json`` (``WORKBENCH_BENCH_RESULTS`` moves it).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import io
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

ROOT = harness.ROOT
BUDGET_S = 480.0  # the whole check, 8 minutes
BASE = ["env=halfcheetah", "env.vec_env=dummy", "algo.n_steps=64", "seed=0",
        "eval.every_steps=0", "eval.final_episodes=1", "checkpoint.every_steps=0",
        "console.progress_bar=false", "console.iteration_lines=true",
        "tracking.system_metrics_interval_s=1", "tracking.experiment=gpu-check"]
# Keys that measure the wall clock or the machine: not compared for determinism.
WALL_CLOCK_PREFIXES = ("time/", "system/")
WALL_CLOCK_KEYS = {"summary/fps", "summary/wall_time_s", "summary/peak_rss_mb"}
# What the cuda run must carry: MLflow's GPU monitor, then the workbench's NVML sampler.
GPU_METRICS = ("gpu_0_utilization_percentage", "gpu_0_memory_usage_megabytes",
               "gpu_0_temperature_celsius", "gpu_0_sm_clock_mhz")
MANIFEST_FIELDS = (("cuda", "driver"), ("cuda", "driver_cuda"), ("cuda", "torch_cuda"),
                   ("cuda", "cudnn"), ("gpu", "name"), ("gpu", "compute_capability"))
# Left allocated in the interrupted process with its traceback alive: the interrupted step's
# few tensors. The default policy with its Adam state is > 1 MiB, so more means it stayed.
KEPT_LIMIT_BYTES = 2**20
CHILD_TIMEOUT_S = 300


# --------------------------------------------------------------------------- children


def child_train(overrides: list[str]) -> None:
    """One training; its run id on the last stdout line."""
    from workbench.training import load_config, train

    result = train(load_config(overrides))
    print(json.dumps({"run_id": result.run_id}), flush=True)


def child_interrupt(overrides: list[str]) -> None:
    """A cuda training that the parent interrupts; reports what is left on the GPU.

    Waits on stdin after reporting, so the parent can read nvidia-smi while this process,
    the one that held the GPU, is still alive.
    """
    import torch
    from workbench.training import load_config, train

    kept = None
    try:
        train(load_config(overrides))
    except KeyboardInterrupt as exc:
        kept = exc.__traceback__  # a notebook keeps it too (sys.last_traceback)
    interrupted = kept is not None
    gc.collect()
    with_traceback = torch.cuda.memory_allocated()
    kept = None
    gc.collect()
    print(json.dumps({"interrupted": interrupted,
                      "allocated_with_traceback": with_traceback,
                      "allocated_after": torch.cuda.memory_allocated(),
                      "reserved_after": torch.cuda.memory_reserved()}), flush=True)
    sys.stdin.read()
    del kept


# --------------------------------------------------------------------------- measurements


def train_run(overrides: list[str], env: Mapping[str, str]) -> str:
    """Run :func:`child_train` in a fresh process; its run id."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", "train", *overrides], cwd=ROOT,
        env={**os.environ, **env}, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise RuntimeError(f"training failed ({' '.join(overrides)}):\n{done.stderr[-2000:]}")
    return str(json.loads(done.stdout.strip().splitlines()[-1])["run_id"])


def throughput(client: Any, run_id: str, samples_per_iteration: int) -> dict[str, float]:
    """steps/s and update share over the iterations after the first."""
    rollout = [m.value for m in sorted(client.get_metric_history(run_id, "time/rollout_s"),
                                       key=lambda m: m.step)]
    update = [m.value for m in sorted(client.get_metric_history(run_id, "time/update_s"),
                                      key=lambda m: m.step)]
    return split_figures(rollout, update, samples_per_iteration)


def split_figures(rollout: Sequence[float], update: Sequence[float],
                  samples_per_iteration: int) -> dict[str, float]:
    """steps/s and update share, leaving out the first iteration (start-up costs)."""
    pairs = list(zip(rollout, update, strict=False))[1:] or list(zip(rollout, update,
                                                                     strict=False))
    seconds = sum(r + u for r, u in pairs)
    update_s = sum(u for _, u in pairs)
    return {
        "steps_per_s": samples_per_iteration * len(pairs) / seconds if seconds else math.nan,
        "update_share": update_s / seconds if seconds else math.nan,
        "iterations": float(len(pairs)),
    }


def compared_series(client: Any, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric but the wall-clock ones, as [(step, value)] in step order."""
    out = {}
    for key in client.get_run(run_id).data.metrics:
        if key.startswith(WALL_CLOCK_PREFIXES) or key in WALL_CLOCK_KEYS:
            continue
        history = client.get_metric_history(run_id, key)
        out[key] = sorted((m.step, m.value) for m in history)
    return out


def first_difference(a: Mapping[str, list[tuple[int, float]]],
                     b: Mapping[str, list[tuple[int, float]]]) -> str | None:
    """Where two runs' series first differ (NaN equals NaN), None when bit-identical."""
    if set(a) != set(b):
        return f"keys differ: {sorted(set(a) ^ set(b))[:5]}"
    for key in sorted(a):
        if len(a[key]) != len(b[key]):
            return f"{key}: {len(a[key])} vs {len(b[key])} values"
        for (step, x), (_, y) in zip(a[key], b[key], strict=True):
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return f"{key} at step {step}: {x!r} vs {y!r}"
    return None


def gpu_processes() -> dict[int, float] | None:
    """pid -> MiB of every compute process nvidia-smi lists; None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_compute_apps(done.stdout) if done.returncode == 0 else None


def parse_compute_apps(text: str) -> dict[int, float]:
    """``12345, 1024`` lines -> {12345: 1024.0} (values nvidia-smi cannot tell are NaN)."""
    found = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[0].strip().isdigit():
            value = row[1].strip()
            found[int(row[0])] = float(value) if value.replace(".", "").isdigit() else math.nan
    return found


class Lines(threading.Thread):
    """Collects a stream's lines; :meth:`wait` for one that starts with a prefix."""

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True)
        self.stream, self.lines = stream, []
        self.start()

    def run(self) -> None:
        for line in self.stream:
            self.lines.append(line.rstrip("\n"))

    def wait(self, prefix: str, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = next((ln for ln in self.lines if ln.startswith(prefix)), None)
            if hit is not None or not self.is_alive():
                return hit
            time.sleep(0.1)
        return None


def interrupt_check(overrides: list[str], env: Mapping[str, str]) -> dict[str, Any]:
    """SIGINT to a cuda training's process group; what it leaves on the GPU."""
    import psutil

    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", "interrupt", *overrides], cwd=ROOT,
        env={**os.environ, **env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        if out.wait("it 2/", CHILD_TIMEOUT_S) is None:
            raise RuntimeError(f"training did not start:\n{chr(10).join(err.lines[-20:])}")
        tree = {proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))}
        during = gpu_processes()
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        line = out.wait("{", 120)
        if line is None:
            raise RuntimeError(f"no report after SIGINT:\n{chr(10).join(err.lines[-20:])}")
        report = json.loads(line)
        interrupted = gpu_processes()
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=60)
        deadline = time.monotonic() + 15  # its forkserver and resource tracker follow it
        while any(is_running(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # the driver reclaims a context after the process is gone
        after = gpu_processes()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    alive = [p for p in tree if is_running(p)]
    report.update({
        "pids": sorted(tree),
        "gpu_processes_during": during, "gpu_processes_interrupted": interrupted,
        "gpu_processes_after_exit": after,
        "left_on_gpu": sorted(set(after or {}) & tree), "processes_alive": alive,
        "workers_on_gpu": sorted(set(interrupted or {}) & (tree - {proc.pid})),
    })
    report["ok"] = (report["interrupted"] and report["allocated_after"] == 0
                    and report["allocated_with_traceback"] <= KEPT_LIMIT_BYTES
                    and not report["left_on_gpu"] and not alive
                    and not report["workers_on_gpu"])
    return report


def is_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def fp16_export(client: Any, run_id: str, quick: bool) -> dict[str, Any]:
    """``workbench export``'s checks on the run, FP16 TorchScript on the GPU included."""
    from workbench.deploy.export import MIN_CALLS, export_policy, load_run

    with tempfile.TemporaryDirectory(prefix="gpu-check-export-") as tmp:
        source = load_run(client, run_id, Path(tmp) / "download")
        result = export_policy(source, Path(tmp) / "export", observations=256, episodes=1,
                               calls=MIN_CALLS if quick else 2 * MIN_CALLS, warmup=100)
    report = result.report
    return {"parity": report["parity"], "fp16": report["fp16"],
            "torchscript_cpu_ms": report["latency"]["backends"]["torchscript"]["end_to_end_ms"]}


def manifest_fields(client: Any, run_id: str) -> dict[str, Any]:
    """The driver/CUDA/cuDNN/GPU facts of the run's manifest.json."""
    with tempfile.TemporaryDirectory() as tmp:
        manifest = json.loads(Path(client.download_artifacts(run_id, "manifest.json", tmp))
                              .read_text())
    gpus = manifest["hardware"]["gpus"]
    sections = {"cuda": manifest["cuda"], "gpu": gpus[0] if gpus else {}}
    return {f"{s}.{k}": sections[s].get(k) for s, k in MANIFEST_FIELDS}


# --------------------------------------------------------------------------- the check


class Check:
    """Rows of the table and the JSON, and the time budget."""

    def __init__(self, budget_s: float) -> None:
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.rows: list[dict[str, Any]] = []

    def row(self, check: str, result: str, figures: str, **data: Any) -> None:
        self.rows.append({"check": check, "result": result, "figures": figures, **data})
        print(f"  {check}: {result} {figures}", flush=True)

    def time_left(self, check: str) -> bool:
        """False (and a skipped row) once the budget is spent."""
        if time.monotonic() - self.started < self.budget_s:
            return True
        self.row(check, "skipped", f"the {self.budget_s / 60:.0f}-minute budget is spent")
        return False

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """A part that fails becomes a FAILED row; the other parts still run."""
        try:
            yield
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
            self.row(name, "FAILED", str(exc).strip().splitlines()[-1][:300],
                     error=str(exc)[-3000:])

    @property
    def failed(self) -> list[str]:
        return [r["check"] for r in self.rows if r["result"] == "FAILED"]


def run_throughput(check: Check, client: Any, env: Mapping[str, str], devices: list[str],
                   num_envs: list[int], iterations: int, overrides: list[str]
                   ) -> dict[tuple[str, int], str]:
    """One run per device and num_envs; a row per num_envs; the run ids."""
    runs: dict[tuple[str, int], str] = {}
    for n in num_envs:
        if not check.time_left(f"throughput num_envs={n}"):
            break
        figures: dict[str, dict[str, float]] = {}
        for device in devices:
            run = train_run([*BASE, f"env.num_envs={n}", f"device={device}",
                             f"total_timesteps={n * 64 * iterations}", *overrides], env)
            runs[(device, n)] = run
            figures[device] = throughput(client, run, n * 64)
        text = ", ".join(f"{d} {f['steps_per_s']:.0f} steps/s (update {f['update_share']:.0%})"
                         for d, f in figures.items())
        if "cuda" in figures:
            ratio = figures["cuda"]["steps_per_s"] / figures["cpu"]["steps_per_s"]
            text += f": cuda/cpu x{ratio:.2f}"
        check.row(f"throughput num_envs={n}", "measured", text, runs=figures)
    return runs


def run_gpu_checks(check: Check, client: Any, env: Mapping[str, str], run_id: str,
                   overrides: list[str], quick: bool) -> None:
    """Determinism, system metrics, manifest and the interrupt, on the GPU."""
    if check.time_left("deterministic on cuda"):
        steps = 8 * 64 * (2 if quick else 4)
        pair = [train_run([*BASE, "env.num_envs=8", f"total_timesteps={steps}", "device=cuda",
                           "repro.deterministic=true", *overrides], env) for _ in range(2)]
        a, b = (compared_series(client, r) for r in pair)
        diff = first_difference(a, b)
        check.row("deterministic on cuda", "ok" if diff is None else "FAILED",
                  f"2 runs, {len(a)} series, bit-identical" if diff is None else diff)
    logged = set(client.get_run(run_id).data.metrics)
    missing = [k for k in GPU_METRICS if f"system/{k}" not in logged]
    gpu_keys = sorted(k for k in logged if k.startswith("system/gpu_"))
    check.row("system metrics", "FAILED" if missing else "ok",
              f"missing {', '.join(missing)}" if missing else f"{len(gpu_keys)} system/gpu_* "
              "series (utilization, memory, power, temperature, clocks)", keys=gpu_keys)
    fields = manifest_fields(client, run_id)
    empty = [k for k, v in fields.items() if v in (None, "")]
    check.row("manifest", "FAILED" if empty else "ok",
              f"empty: {', '.join(empty)}" if empty else
              ", ".join(f"{k.split('.')[1]} {v}" for k, v in fields.items()), fields=fields)
    if check.time_left("memory after Ctrl-C"):
        report = interrupt_check([*BASE, "env.num_envs=4", "env.vec_env=subproc",
                                  "total_timesteps=10000000", "device=cuda", *overrides], env)
        left = report["left_on_gpu"] or report["processes_alive"] or report["workers_on_gpu"]
        seen = ("" if report["gpu_processes_during"] else
                " (nvidia-smi lists no processes here: a container's PID namespace?)")
        check.row("memory after Ctrl-C", "ok" if report["ok"] else "FAILED",
                  f"allocated {report['allocated_with_traceback'] / 2**20:.2f} MiB with the "
                  f"traceback kept, {report['allocated_after']} B after; "
                  + (f"left: {left}" if left else f"no process left{seen}"), report=report)


def report_export(check: Check, export: Mapping[str, Any]) -> None:
    """The export row: FP16 on the GPU where there is one, FP32 parity and CPU latency."""
    fp16, parity = export["fp16"], export["parity"]
    fp32 = (f"FP32 TorchScript/ONNX parity {'ok' if parity['passed'] else 'FAILED'}, "
            f"CPU e2e p99 {export['torchscript_cpu_ms']['p99']:.3f} ms")
    result = "ok" if parity["passed"] else "FAILED"
    if "skipped" in fp16:
        check.row("export", result, f"{fp32}; FP16 skipped: {fp16['skipped']}", export=export)
        return
    check.row("fp16 export", result,
              f"FP16 on {fp16['device']}: max |diff| vs FP32 "
              f"{fp16['max_abs_diff_vs_fp32_reference']:.1e}, e2e p99 "
              f"{fp16['end_to_end_ms']['p99']:.3f} ms; {fp32}", export=export)


def no_gpu_line(torch: Any) -> str | None:
    """The one line for a machine where torch sees no CUDA device; None when it does."""
    if torch.cuda.is_available():
        return None
    build = (f"torch {torch.__version__} is the CPU build" if torch.version.cuda is None else
             f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU or "
             "driver")
    return (f"no GPU: {build}; ran the CPU half only (cpu throughput, FP32 export checks); "
            "on a GPU server: make setup (picks the CUDA build), then make gpu-check")


def render(rows: Sequence[Mapping[str, Any]]) -> str:
    """The one table: check, result, figures."""
    width = max(len(r["check"]) for r in rows)
    result_width = max(len(r["result"]) for r in rows)
    lines = [f"{'check':<{width}}  {'result':<{result_width}}  figures"]
    lines += [f"{r['check']:<{width}}  {r['result']:<{result_width}}  {r['figures']}"
              for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="num_envs 1 and 2, 3 iterations")
    parser.add_argument("--num-envs", type=int, nargs="+", metavar="N")
    parser.add_argument("--iterations", type=int, default=None, metavar="K")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    parser.add_argument("--child", choices=("train", "interrupt"), help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = parser.parse_args(argv)
    if args.child == "train":
        child_train(args.overrides)
        return 0
    if args.child == "interrupt":
        child_interrupt(args.overrides)
        return 0
    num_envs = args.num_envs or ([1, 2] if args.quick else [1, 8, 32])
    iterations = args.iterations or (3 if args.quick else 6)
    if min(num_envs) < 1 or iterations < 2:
        parser.error("--num-envs must be >= 1 and --iterations >= 2 (the first one is left "
                     "out of the figures)")
    return run(num_envs, iterations, args.overrides, args.quick, args.budget_s)


def run(num_envs: list[int], iterations: int, overrides: list[str], quick: bool,
        budget_s: float) -> int:
    """The check itself; the exit code."""
    import torch
    from mlflow.tracking import MlflowClient
    from workbench.deploy.export import quiet_downloads

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # the store's set-up notes
    quiet_downloads()
    check = Check(budget_s)
    missing_gpu = no_gpu_line(torch)
    gpu = missing_gpu is None
    if missing_gpu:
        print(missing_gpu, flush=True)
    device = torch.cuda.get_device_name(0) if gpu else "none"
    print(f"GPU check: {device}; torch {torch.__version__}; {harness.load_line()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        experiments = Path(tmp) / "experiments"
        env = {"WORKBENCH_EXPERIMENTS": str(experiments), "PYTHONUNBUFFERED": "1",
               "MLFLOW_TRACKING_URI": f"sqlite:///{experiments / 'mlflow.db'}"}
        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        runs: dict[tuple[str, int], str] = {}
        with check.part("throughput"):
            runs = run_throughput(check, client, env, ["cpu", "cuda"] if gpu else ["cpu"],
                                  num_envs, iterations, overrides)
        largest = (("cuda" if gpu else "cpu"), max(n for _, n in runs)) if runs else None
        if gpu and largest in runs:
            with check.part("gpu checks"):
                run_gpu_checks(check, client, env, runs[largest], overrides, quick)
        if largest in runs and check.time_left("export"):
            with check.part("export"):
                report_export(check, fp16_export(client, runs[largest], quick))
    wall = time.monotonic() - check.started
    print(f"\n{render(check.rows)}\nwall time {wall / 60:.1f} min (budget "
          f"{budget_s / 60:.0f} min)")
    path = harness.write_results("gpu_check", {
        "gpu": gpu, "device": device, "no_gpu": missing_gpu, "quick": quick,
        "num_envs": num_envs, "iterations": iterations, "overrides": overrides,
        "wall_s": wall, "checks": check.rows, "failed": check.failed,
    })
    print(f"results: {path}")
    return 1 if check.failed else 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
