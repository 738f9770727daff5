"""Where the embedded store's CPU goes: the training process, or its helper process.

Runs ``workbench train`` (HalfCheetah as shipped, EnvPool) with the embedded SQLite store's
metric rows written by the helper process from the start (``tracking.store_process_after_s=0``)
and in the training process (``=null``), alternating, and samples each process's own CPU
seconds (psutil: user + system of its own threads, children apart) over a window of steady
iterations read from the console's iteration lines (past start-up and the helper's start).
CPU seconds do not depend on what else the machine runs, unlike wall time; wall time per
iteration is printed too.

    python benchmarks/store_process.py                      # 3 repetitions of each
    python benchmarks/store_process.py --reps 2 --window 100 400
    python benchmarks/store_process.py --alternate 10       # one training, switched every 10 s

``--alternate S`` trains once, in this process, with the helper running from the start and
the outbox's metric batches going through it in every other ``S``-second window and written
in the training process in the others: the machine's drift over minutes then falls on both
alike. Printed: the mean wall time of an iteration in each kind of window (iterations that
straddle a switch left out) and their ratio per pair of adjacent windows.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

ITERATION = re.compile(r"^it (\d+)/\d+ \|")
SETTINGS = {"helper": "0", "in-process": "null"}


def cpu_s(process: psutil.Process | None) -> float:
    """User + system CPU seconds of the process's own threads (0 when there is none)."""
    if process is None:
        return 0.0
    times = process.cpu_times()
    return float(times.user + times.system)


def helper_of(train: psutil.Process) -> psutil.Process | None:
    """The training process's store helper, if it runs one."""
    for child in train.children():
        if "workbench.tracking.store_worker" in " ".join(child.cmdline()):
            return child
    return None


def measure(setting: str, steps: int, window: tuple[int, int]) -> dict[str, Any]:
    """One training; CPU seconds of both processes and wall seconds over ``window``."""
    folder = Path(tempfile.mkdtemp(prefix="workbench-store-process-"))
    env = {**os.environ, "WORKBENCH_EXPERIMENTS": str(folder),
           "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "workbench", "train", "env.vec_env=envpool",
               f"total_timesteps={steps}", "video=off", "eval.final_episodes=0",
               "console.progress_bar=false", f"tracking.store_process_after_s={setting}"]
    child = subprocess.Popen(command, cwd=harness.ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    train = psutil.Process(child.pid)
    marks: dict[int, tuple[float, float, float]] = {}
    lines: list[str] = []

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line)
            found = ITERATION.match(line)
            if found and int(found.group(1)) in window:
                marks[int(found.group(1))] = (time.perf_counter(), cpu_s(train),
                                              cpu_s(helper_of(train)))

    reader = threading.Thread(target=read)
    reader.start()
    code = child.wait()
    reader.join()
    if code != 0 or len(marks) != 2:
        tail = "".join(lines[-15:])
        raise SystemExit(f"store_process: the {setting} run failed (exit {code}):\n{tail}")
    (t0, main0, helper0), (t1, main1, helper1) = marks[window[0]], marks[window[1]]
    n = window[1] - window[0]
    return {"main_cpu_ms": 1e3 * (main1 - main0) / n,
            "helper_cpu_ms": 1e3 * (helper1 - helper0) / n, "wall_ms": 1e3 * (t1 - t0) / n}


def alternate(period_s: float, steps: int) -> None:
    """One training whose metric batches go through the helper in every other window."""
    import tempfile as tmp

    from stable_baselines3.common.callbacks import BaseCallback
    from workbench.tracking import outbox
    from workbench.training import load_config, train

    folder = Path(tmp.mkdtemp(prefix="workbench-store-alternate-"))
    os.environ["WORKBENCH_EXPERIMENTS"] = str(folder)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
    started = time.perf_counter()

    def window() -> int:
        return int((time.perf_counter() - started) // period_s)

    original = outbox.DeliveryClient._worker

    def switched(self: Any) -> Any:
        worker = original(self)  # started at once (after_s=0) and kept alive throughout
        return worker if window() % 2 == 0 else None

    outbox.DeliveryClient._worker = switched  # type: ignore[method-assign]
    marks: list[tuple[float, int]] = []

    class Marks(BaseCallback):
        def _on_rollout_start(self) -> None:
            marks.append((time.perf_counter(), window()))

        def _on_step(self) -> bool:
            return True

    train(load_config(["env.vec_env=envpool", f"total_timesteps={steps}", "video=off",
                       "eval.final_episodes=0", "console.progress_bar=false",
                       "console.iteration_lines=false", "tracking.store_process_after_s=0"]),
          callbacks=[Marks()])
    per_window: dict[int, list[float]] = {}
    for (t0, w0), (t1, w1) in zip(marks, marks[1:], strict=False):
        if w0 == w1 and w0 > 0:  # the first window holds start-up and the helper's start
            per_window.setdefault(w0, []).append(t1 - t0)
    means = {w: statistics.mean(v) for w, v in sorted(per_window.items()) if len(v) >= 3}
    ratios = [means[w] / means[w + 1] if w % 2 == 1 else means[w + 1] / means[w]
              for w in means if w + 1 in means]
    helper = [1e3 * m for w, m in means.items() if w % 2 == 0]
    inside = [1e3 * m for w, m in means.items() if w % 2 == 1]
    print(f"iteration wall ms, helper windows: {', '.join(f'{m:.1f}' for m in helper)}")
    print(f"iteration wall ms, in-process windows: {', '.join(f'{m:.1f}' for m in inside)}")
    print(f"in-process / helper, adjacent windows: {', '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f} (> 1: the helper's windows were faster)")
    harness.write_results("store_process_alternate", {
        "period_s": period_s, "steps": steps, "means_s": means, "ratios": ratios})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=245_760)
    parser.add_argument("--window", type=int, nargs=2, default=(60, 360), metavar=("FROM", "TO"),
                        help="iterations between which CPU is counted")
    parser.add_argument("--alternate", type=float, metavar="S",
                        help="one training, the helper used in every other S-second window")
    args = parser.parse_args()
    if args.alternate:
        print(f"store process, alternating: {harness.load_line()}", flush=True)
        alternate(args.alternate, args.steps)
        return
    window = (args.window[0], args.window[1])
    print(f"store process: {harness.load_line()}", flush=True)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in SETTINGS}
    for rep in range(args.reps):
        order = list(SETTINGS) if rep % 2 == 0 else list(reversed(SETTINGS))
        for name in order:
            row = measure(SETTINGS[name], args.steps, window)
            rows[name].append(row)
            print(f"rep {rep + 1}/{args.reps} {name:10s} training process "
                  f"{row['main_cpu_ms']:.2f} ms CPU/iteration, helper {row['helper_cpu_ms']:.2f}, "
                  f"wall {row['wall_ms']:.2f} ms/iteration ({harness.load_line()})", flush=True)
    summary = {name: {key: statistics.median(r[key] for r in found) for key in found[0]}
               for name, found in rows.items()}
    harness.print_table(
        f"per iteration, iterations {window[0]}-{window[1]}, medians of {args.reps}",
        ["store writes", "training process CPU ms", "helper CPU ms", "wall ms"],
        [[name, f"{s['main_cpu_ms']:.2f}", f"{s['helper_cpu_ms']:.2f}", f"{s['wall_ms']:.2f}"]
         for name, s in summary.items()])
    moved = summary["in-process"]["main_cpu_ms"] - summary["helper"]["main_cpu_ms"]
    print(f"the helper takes {moved:.2f} ms of CPU per iteration off the training process "
          f"({100 * moved / summary['in-process']['main_cpu_ms']:.1f} % of its CPU)")
    path = harness.write_results("store_process", {"rows": rows, "summary": summary,
                                                   "args": vars(args)})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
