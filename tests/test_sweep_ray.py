"""``sweep.executor=ray``: a real local Ray head (127.0.0.1, 2 CPUs, its own temp dir) runs a
2-point sweep as Ray tasks; running it again creates no new run. The head is stopped even
when the test fails."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from .conftest import run_cli
from .test_sweep import CORES_2, POINT_TINY, runs_of

ray = pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def processes_of(temp_dir: Path) -> list[psutil.Process]:
    """Processes of this test's Ray head: their command line names its temp dir."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if str(temp_dir) in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


class RayHead:
    """``ray start --head --block`` in its own session; SIGTERM stops exactly that cluster.

    (``ray stop`` would stop every Ray process on the machine, other users' clusters too.)
    """

    def __init__(self) -> None:
        self.port = free_port()
        # Short path: Ray puts Unix sockets under it (107-character limit).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="wbray", dir="/tmp"))
        self.log_path = self.temp_dir / "head.log"
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
                 "--node-ip-address=127.0.0.1", f"--port={self.port}", "--num-cpus=2",
                 f"--temp-dir={self.temp_dir}", "--include-dashboard=false",
                 "--disable-usage-stats", "--object-store-memory=100000000"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
            )

    def wait_started(self, timeout_s: float = 180) -> bool:
        """True once the head is up; False if it exited (or timed out) while starting."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            if "Ray runtime started" in self.log_path.read_text():
                return True
            time.sleep(1)
        return False

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # SIGTERM is only handled once startup finished
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        time.sleep(2)
        for proc in processes_of(self.temp_dir):  # anything the head left behind
            proc.kill()


@pytest.fixture()
def ray_head() -> Iterator[str]:
    """A running local head's address. On a loaded machine the raylet can die at start-up
    (its wait for the dashboard agent's port file has a hard-coded timeout,
    ray-project/ray#65983), so a head that fails to start is tried again, up to 3 times."""
    heads = []
    try:
        for _ in range(3):
            heads.append(RayHead())
            if heads[-1].wait_started():
                break
            heads[-1].stop()
        else:
            pytest.fail("the Ray head did not start in 3 attempts:\n"
                        + heads[-1].log_path.read_text()[-3000:])
        yield f"127.0.0.1:{heads[-1].port}"
    finally:
        for head in heads:
            if head.process.poll() is None:
                head.stop()
        for head in heads:
            assert processes_of(head.temp_dir) == []
            shutil.rmtree(head.temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_ray_executor_runs_points_as_tasks(store: Path, ray_head: str) -> None:
    args = ["sweep", "sweep.executor=ray", f"sweep.ray.address={ray_head}",
            "sweep.num_envs=[1,2]", "sweep.n_steps=[64]", "sweep.workers=2", *POINT_TINY]
    proc = run_cli(*args, env=CORES_2, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"ray at {ray_head}: up to 2 points at a time x 1 CPU each" in proc.stdout

    (parent,) = runs_of("parent")
    assert parent.info.status == "FINISHED"
    children = runs_of("child")
    assert sorted(r.info.run_name for r in children) == ["halfcheetah-ne1-ns64-s0",
                                                        "halfcheetah-ne2-ns64-s0"]
    for run in children:
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    out_dir = store / "sweeps" / parent.data.tags["sweep_id"]
    assert sorted(p.name for p in out_dir.glob("*.ipynb")) == [
        "halfcheetah-ne1-ns64-s0.ipynb", "halfcheetah-ne2-ns64-s0.ipynb"]

    again = run_cli(*args, env=CORES_2, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(runs_of("child")) == 2  # idempotent: no duplicate runs


def test_unreachable_cluster_is_bad_input(store: Path) -> None:
    proc = run_cli("sweep", "sweep.executor=ray", f"sweep.ray.address=127.0.0.1:{free_port()}",
                   timeout=300)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("workbench: error: sweep.ray.address=127.0.0.1:")
    assert "cannot connect to a Ray cluster" in line
    assert not store.exists()
