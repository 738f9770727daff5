"""What every benchmark script shares: measured child processes, machine load, JSON results.

Every measurement runs in a fresh child process (imports, allocator and torch threads start
clean), and its peak memory is taken two ways: the kernel's exact ``ru_maxrss`` of the child
(``wait4``) and a sampler over the child's process tree (worker processes of ``subproc``).
Machine load is recorded before and after, since on shared machines absolute numbers drift:
compare ratios measured side by side in one run.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]


def results_dir() -> Path:
    """``benchmarks/results`` (git-ignored), or ``WORKBENCH_BENCH_RESULTS``."""
    return Path(os.environ.get("WORKBENCH_BENCH_RESULTS") or ROOT / "benchmarks" / "results")


def write_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``<results>/<name>.json`` with the machine description added; returns the path."""
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2, default=str))
    return path


def machine() -> dict[str, Any]:
    """Cores, CPU model, load averages and library versions at the time of writing."""
    from importlib import metadata

    versions = {}
    for package in ("torch", "stable-baselines3", "gymnasium", "mujoco", "envpool", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "host": platform.node(),
        "cpu": cpu_model(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": psutil.cpu_count(logical=True),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "versions": versions,
    }


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_line() -> str:
    """``load 1/5/15 min: a, b, c on N cores`` for printing next to numbers."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


class TreeSampler(threading.Thread):
    """Samples the RSS of a process and its descendants; keeps each pid's peak."""

    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval_s = interval_s
        self.peaks: dict[int, float] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self.stopped.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for proc in procs:
                try:
                    rss = proc.memory_info().rss / 2**20
                except psutil.Error:
                    continue
                self.peaks[proc.pid] = max(rss, self.peaks.get(proc.pid, 0.0))
            self.stopped.wait(self.interval_s)

    def worker_peak_mb(self) -> float:
        """The largest peak among the descendants (0 when there were none)."""
        return max((rss for pid, rss in self.peaks.items() if pid != self.pid), default=0.0)

    def workers(self) -> int:
        return sum(1 for pid in self.peaks if pid != self.pid)


def run_child(command: Sequence[str], env: dict[str, str] | None = None,
              timeout_s: float | None = None) -> dict[str, Any]:
    """Run one measured process; its stdout, wall time, peak RSS (main and largest worker).

    The child is reaped with ``wait4`` for the kernel's exact peak RSS of the main process;
    the tree sampler adds its workers. A failing child stops the benchmark with its last
    stderr lines: numbers from a broken run are worse than none.
    """
    started = time.perf_counter()
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})}, cwd=ROOT)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    streams: dict[str, str] = {}
    readers = [threading.Thread(target=_drain, args=(pipe, name, streams), daemon=True)
               for name, pipe in (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()
    killer = threading.Timer(timeout_s, proc.kill) if timeout_s else None
    if killer:
        killer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if killer:
        killer.cancel()
    sampler.stopped.set()
    sampler.join()
    for reader in readers:
        reader.join()
    if proc.returncode != 0:
        tail = "\n".join(streams.get("err", "").strip().splitlines()[-15:])
        raise SystemExit(f"benchmark child failed ({proc.returncode}): {' '.join(command)}\n"
                         f"{tail}")
    return {
        "process_s": time.perf_counter() - started,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "worker_peak_rss_mb": sampler.worker_peak_mb(),
        "workers": sampler.workers(),
        "stdout": streams.get("out", ""),
    }


def _drain(pipe: Any, name: str, streams: dict[str, str]) -> None:
    streams[name] = pipe.read()


def last_json(stdout: str) -> dict[str, Any]:
    """The JSON object a child printed as its last line."""
    return json.loads(stdout.strip().splitlines()[-1])


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain fixed-width table (readable in CI logs and terminals)."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    print(f"\n{title}")
    for index, row in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(row, widths, strict=True))))
        if index == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.0f}"
    return str(value)
