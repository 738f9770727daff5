"""What every benchmark script shares: measured child processes, machine load, JSON results.

Every measurement runs in a fresh child process (imports, allocator and torch threads start
clean), and its peak memory is taken two ways: the kernel's exact ``ru_maxrss`` of the child
(``wait4``) and a sampler over the child's process tree (worker processes of ``subproc``).
On Linux an exec'd child's ``ru_maxrss`` starts at its parent's memory; when the child never
went above that (this script's own peak), its sampled ``VmHWM`` is used instead.
Machine load is recorded before and after, since on shared machines absolute numbers drift:
compare ratios measured side by side in one run.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]


REFERENCE_DIR = ROOT / "benchmarks" / "reference"  # committed: the figures the docs show


def results_dir() -> Path:
    """Where a run's results go: ``benchmarks/reference`` (committed, rendered into the docs
    by ``scripts/render_docs.py``) with ``WORKBENCH_BENCH_REFERENCE=1``, else
    ``benchmarks/results`` (git-ignored), or ``WORKBENCH_BENCH_RESULTS``."""
    if os.environ.get("WORKBENCH_BENCH_REFERENCE") == "1":
        return REFERENCE_DIR
    return Path(os.environ.get("WORKBENCH_BENCH_RESULTS") or ROOT / "benchmarks" / "results")


def write_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``<results>/<name>.json`` with the machine, the command, the commit and the date
    added; returns the path."""
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({**provenance(), "machine": machine(), **data}, indent=2,
                               default=str) + "\n")
    return path


def provenance() -> dict[str, Any]:
    """The command that measured (as typed from the repository root), the commit it ran
    (``+dirty`` with uncommitted changes) and the date."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short=12", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return {"command": " ".join([".venv/bin/python", str(shown), *sys.argv[1:]]),
            "commit": commit + ("+dirty" if dirty else ""),
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def machine() -> dict[str, Any]:
    """Cores, CPU model, load averages and library versions at the time of writing."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
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


def vm_hwm_mb(pid: int | str = "self") -> float:
    """A process's peak resident memory so far (``VmHWM``, Linux), MiB; 0 where unknown."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    found = [line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(found[0]) / 1024 if found else 0.0


class TreeSampler(threading.Thread):
    """Samples the RSS of a process and its descendants; keeps each pid's peak, and the
    root's own ``VmHWM``."""

    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval_s = interval_s
        self.peaks: dict[int, float] = {}
        # read once now, from the starting thread: a brief child can exit before the
        # thread's first sample, and its ru_maxrss alone would be its parent's peak
        self.root_hwm_mb = vm_hwm_mb(pid)
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
            self.root_hwm_mb = max(self.root_hwm_mb, vm_hwm_mb(self.pid))
            self.stopped.wait(self.interval_s)

    def worker_peak_mb(self) -> float:
        """The largest peak among the descendants (0 when there were none)."""
        return max((rss for pid, rss in self.peaks.items() if pid != self.pid), default=0.0)

    def workers(self) -> int:
        return sum(1 for pid in self.peaks if pid != self.pid)


class Child:
    """One measured process, started at construction and reaped by :meth:`finish`.

    ``core`` pins it (and its threads) to one CPU; ``ready`` is a test over the lines it has
    printed so far that says it is about to start the measured work (see :meth:`wait_ready`).
    """

    def __init__(self, command: Sequence[str], env: dict[str, str] | None = None,
                 timeout_s: float | None = None, core: int | None = None,
                 ready: Callable[[list[str]], bool] | None = None) -> None:
        self.command = list(command)
        self.started = time.perf_counter()
        self.parent_peak_mb = vm_hwm_mb()  # the floor of the child's ru_maxrss (see above)
        pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})}, cwd=ROOT,
                                     preexec_fn=pin)
        self.sampler = TreeSampler(self.proc.pid)
        self.sampler.start()
        self.streams: dict[str, list[str]] = {"out": [], "err": []}
        self.is_ready = threading.Event()
        self.readers = [
            threading.Thread(target=self._drain, args=(self.proc.stdout, "out", ready),
                             daemon=True),
            threading.Thread(target=self._drain, args=(self.proc.stderr, "err", None),
                             daemon=True),
        ]
        for reader in self.readers:
            reader.start()
        self.killer = threading.Timer(timeout_s, self.proc.kill) if timeout_s else None
        if self.killer:
            self.killer.start()

    def wait_ready(self) -> None:
        """Block until the child printed its ready line (or exited: :meth:`finish` says)."""
        self.is_ready.wait()

    def finish(self) -> dict[str, Any]:
        """Reap the child; its stdout, wall time, peak RSS (main and largest worker).

        Reaped with ``wait4`` for the kernel's exact peak RSS of the main process; the tree
        sampler adds its workers. A failing child stops the benchmark with its last stderr
        lines: numbers from a broken run are worse than none.
        """
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        if self.killer:
            self.killer.cancel()
        self.sampler.stopped.set()
        self.sampler.join()
        for reader in self.readers:
            reader.join()
        if self.proc.returncode != 0:
            tail = "".join(self.streams["err"][-15:]).strip()
            raise SystemExit(f"benchmark child failed ({self.proc.returncode}): "
                             f"{' '.join(self.command)}\n{tail}")
        return {
            "process_s": time.perf_counter() - self.started,
            "peak_rss_mb": self.peak_mb(usage.ru_maxrss / 1024),
            "worker_peak_rss_mb": self.sampler.worker_peak_mb(),
            "workers": self.sampler.workers(),
            "stdout": "".join(self.streams["out"]),
        }

    def peak_mb(self, ru_maxrss_mb: float) -> float:
        """The child's own peak: ``ru_maxrss`` when above what it inherited from this process,
        else the sampled ``VmHWM``."""
        if ru_maxrss_mb > self.parent_peak_mb + 1 or not self.sampler.root_hwm_mb:
            return ru_maxrss_mb
        return self.sampler.root_hwm_mb

    def _drain(self, pipe: Any, name: str, ready: Callable[[list[str]], bool] | None) -> None:
        lines = self.streams[name]
        for line in pipe:
            lines.append(line)
            if ready is not None and not self.is_ready.is_set() and ready(lines):
                self.is_ready.set()
        if ready is not None:
            self.is_ready.set()  # EOF: never wait for a child that has gone


def run_child(command: Sequence[str], env: dict[str, str] | None = None,
              timeout_s: float | None = None, core: int | None = None) -> dict[str, Any]:
    """Run one measured process to its end (see :class:`Child`)."""
    return Child(command, env, timeout_s, core=core).finish()


# Concurrent pairs. On a shared machine the speed drifts by +-20 % within minutes, more than
# the few per cent a ratio such as the tracking overhead is about. Run both sides at the same
# time instead, one core each, and swap the cores every repetition: drift then hits both
# alike. Each side prints that it is about to learn; the bare side then waits for a go file.
READY_LINE = "ready"


def bare_ready(lines: list[str]) -> bool:
    """A bare child built its model and waits (:func:`wait_for_go`)."""
    return lines[-1].strip() == READY_LINE


def workbench_ready(lines: list[str]) -> bool:
    """``workbench train`` printed its run header (two rules of dashes): ``learn`` is next."""
    return sum(line.startswith("-" * 20) for line in lines) >= 2


def wait_for_go(go_file: str | None) -> None:
    """In a bare child: say ready, then wait until the parent creates ``go_file``."""
    if not go_file:
        return
    print(READY_LINE, flush=True)
    while not os.path.exists(go_file):
        time.sleep(0.005)


def run_pair(commands: Mapping[str, Sequence[str]], env: dict[str, str] | None, rep: int,
             concurrent: bool, timeout_s: float | None = None,
             bare_sides: Sequence[str] = ("bare",), pin: int | None = None
             ) -> dict[str, dict[str, Any]]:
    """One repetition of ``{"bare": ..., "workbench": ...}``: one after the other in
    alternating order (bare first in even repetitions), or at the same time on two cores.

    ``pin`` (one after the other only) runs both sides on that one core with a one-core
    budget: nothing of the other side, and no second core for either side's background
    threads, so a side's every extra CPU second shows in its wall time. On an idle machine
    this is the quietest of the three methods.

    ``bare_sides`` take ``--go-file`` (:func:`wait_for_go`); the others are ``workbench train``
    commands, ready once they printed their run header. A control run (two identical bare
    programs, to see the resolution of the method) names both sides here."""
    if not concurrent:
        order = ("bare", "workbench") if rep % 2 == 0 else ("workbench", "bare")
        if pin is not None:
            env = {**(env or {}), "WORKBENCH_CPU_BUDGET": "1"}
        return {name: run_child(commands[name], env, timeout_s, core=pin) for name in order}
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("--concurrent needs two cores (one per side)")
    go_file = Path(tempfile.mkdtemp(prefix="wb-go-")) / "go"
    env = {**(env or {}), "WORKBENCH_CPU_BUDGET": "1"}
    children = {
        name: Child([*commands[name], f"--go-file={go_file}"], env, timeout_s, core=core,
                    ready=bare_ready) if name in bare_sides
        else Child(commands[name], env, timeout_s, core=core, ready=workbench_ready)
        for name, core in (("bare", rep % 2), ("workbench", 1 - rep % 2))
    }
    for child in children.values():
        child.wait_ready()
    go_file.touch()
    try:
        return {name: child.finish() for name, child in children.items()}
    except BaseException:  # a side failed, or Ctrl-C: neither may outlive the benchmark
        for child in children.values():
            child.proc.kill()
            child.proc.wait()
        raise
    finally:
        shutil.rmtree(go_file.parent, ignore_errors=True)


def phase_timer() -> Any:
    """An SB3 callback summing rollout and update seconds (``.spans``), split where the
    workbench's ``IterationCallback`` splits them: the update runs from the end of one rollout
    to the start of the next (or training end). Two clock reads per phase: negligible."""
    from stable_baselines3.common.callbacks import BaseCallback

    class PhaseTimer(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.mark = 0.0
            self.spans = {"rollout_s": 0.0, "update_s": 0.0}

        def _on_rollout_start(self) -> None:
            self._close("update_s")

        def _on_rollout_end(self) -> None:
            self._close("rollout_s")

        def _on_training_end(self) -> None:
            self._close("update_s")

        def _on_step(self) -> bool:
            return True

        def _close(self, phase: str) -> None:
            now = time.perf_counter()
            if self.mark:
                self.spans[phase] += now - self.mark
            self.mark = now

    return PhaseTimer()


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
