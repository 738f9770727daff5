"""Interruption and hard kills of a real `workbench train` process.

Real signals (``os.kill``) to a real training process with real SubprocVecEnv workers and a
temporary MLflow store; every test checks the run status and tags, the checkpoint files, the
metric steps, and that no process of the training's session survives.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from mlflow.tracking import MlflowClient
from workbench.tracking import runs
from workbench.training import checkpoint

from .conftest import ROOT, TINY, run_cli
from .faulty_envs import HELD, release

BASE = [*TINY, "console.iteration_lines=true",
        "tracking.system_metrics=false", "eval.every_steps=0", "checkpoint.every_steps=128",
        "checkpoint.keep_last=2"]


class Training:
    """A `python -m workbench train` process in its own session, output in files."""

    def __init__(self, tmp: Path, *overrides: str, env: dict[str, str] | None = None) -> None:
        self.out_path, self.err_path = tmp / "stdout.txt", tmp / "stderr.txt"
        self.proc = psutil.Popen(
            [sys.executable, "-m", "workbench", "train", *overrides], cwd=ROOT,
            start_new_session=True, stdout=self.out_path.open("w"),
            stderr=self.err_path.open("w"), env={**os.environ, **(env or {})},
        )

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_for(self, condition: Callable[[], bool], timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.proc.poll() is None, f"training ended early:\n{self.stderr}"
            assert time.monotonic() < deadline, f"timed out; stderr:\n{self.stderr}"
            time.sleep(0.1)

    def run_id(self) -> str:
        line = next(ln for ln in self.stdout.splitlines() if ln.startswith("run "))
        return line.rsplit("(", 1)[1].rstrip(")")

    def survivors(self) -> list[psutil.Process]:
        """Processes of the training's session still alive (zombies included)."""
        found = []
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) == self.proc.pid:
                    found.append(proc)
            except OSError:
                continue
        return found

    def wait_no_survivors(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while self.survivors() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.survivors() == []


def strictly_increasing_steps(client: MlflowClient, run_id: str) -> dict[str, list[int]]:
    steps = {}
    for key in client.get_run(run_id).data.metrics:
        history = [m.step for m in client.get_metric_history(run_id, key)]
        assert history == sorted(set(history)), (key, history)  # no duplicates, no resets
        steps[key] = history
    return steps


# --------------------------------------------------------------------------- SIGTERM / SIGINT


def test_sigterm_checkpoints_closes_workers_and_resume_continues(store: Path, tmp_path: Path
                                                                 ) -> None:
    training = Training(tmp_path, *BASE, "env.vec_env=subproc", "total_timesteps=1280")
    training.wait_for(lambda: "| 384 steps |" in training.stdout)
    sent = time.monotonic()
    training.proc.send_signal(signal.SIGTERM)
    code = training.proc.wait(timeout=120)
    latency = time.monotonic() - sent
    assert code == 143, training.stderr
    run_id = training.run_id()
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"
    error = run.data.tags["error"]
    assert error.startswith("interrupted: SIGTERM received at step "), error
    stopped_at = int(error.rsplit(" ", 1)[1])
    saved = run.data.tags["workbench.checkpoint"]
    saved_step = int(saved.rsplit("-", 1)[1])
    # The last iteration boundary at or before the step the signal was handled at.
    assert saved_step == (stopped_at - 1) // 128 * 128 >= 384
    stored = checkpoint.stored_checkpoints(client, run_id)
    assert [(c.step, c.complete) for c in stored] == [(saved_step - 128, True), (saved_step, True)]
    assert f"KILLED; checkpoint {saved}; resume with: workbench train resume={run_id}" in (
        training.stderr)
    training.wait_no_survivors()
    print(f"interruption latency (SIGTERM -> exit, subproc workers): {latency:.2f} s")

    done = run_cli("train", f"resume={run_id}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    steps = strictly_increasing_steps(client, run_id)
    assert steps["rollout/ep_rew_mean"] == list(range(128, 1281, 128))
    assert steps["train/approx_kl"] == list(range(128, 1281, 128))


@pytest.mark.slow
def test_second_sigint_exits_immediately(store: Path, tmp_path: Path) -> None:
    # Rank 1's simulator hangs for 120 s in its 90th step (num_timesteps 180): the first
    # SIGINT can only wait for that step to end; the second one stops at once.
    training = Training(tmp_path, *BASE, "total_timesteps=1280",
                        "env.id=tests.faulty_envs:WorkbenchTest/HangingCheetah-v0")
    training.wait_for(lambda: "simulator hangs" in training.stderr)
    training.proc.send_signal(signal.SIGINT)
    training.wait_for(lambda: "SIGINT received: stopping after the current step" in
                      training.stderr, timeout=60)
    time.sleep(1.0)
    assert training.proc.poll() is None  # still in the hanging step
    sent = time.monotonic()
    training.proc.send_signal(signal.SIGINT)
    code = training.proc.wait(timeout=60)  # far less than the 120 s hang
    assert code == 130, training.stderr
    print(f"second SIGINT -> exit: {time.monotonic() - sent:.2f} s")
    run = MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(training.run_id())
    assert run.info.status == "KILLED"
    assert run.data.tags["error"] == "interrupted: SIGINT received twice: stopped immediately"
    # No new checkpoint on the way out; the periodic one (step 128) stays.
    assert run.data.tags["workbench.checkpoint"] == "checkpoints/step-000000000128"
    assert "KILLED; checkpoint checkpoints/step-000000000128; resume with" in training.stderr
    training.wait_no_survivors()


# --------------------------------------------------------------------------- hard kill


@pytest.mark.slow
def test_sigkill_leaves_no_process_then_reap_and_resume(store: Path, tmp_path: Path) -> None:
    training = Training(tmp_path, *BASE, "env.vec_env=subproc", "total_timesteps=1280")
    training.wait_for(lambda: "| 512 steps |" in training.stdout)
    run_id = training.run_id()
    training.proc.send_signal(signal.SIGKILL)
    assert training.proc.wait(timeout=30) == -signal.SIGKILL
    # Workers see their pipe close and exit; the forkserver follows.
    training.wait_no_survivors()
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    assert client.get_run(run_id).info.status == "RUNNING"  # what MLflow alone leaves

    # A heartbeat younger than two intervals is live whatever --older-than says: wait it out.
    beat = float(client.get_run(run_id).data.tags["workbench.heartbeat"])
    time.sleep(max(0.0, beat + runs.LIVE_WINDOW_S + 1 - time.time()))
    reap = run_cli("runs", "reap", "--older-than", "1")
    assert reap.returncode == 0, reap.stderr
    assert reap.stdout.splitlines()[0] == (
        f"reaped {run_id}: KILLED (no heartbeat for more than 20 s)")
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags["error"].startswith("reaped: no heartbeat for ")
    assert run.data.tags["error"].endswith(f"resume with: workbench train resume={run_id}")
    assert runs.REAPED_TAG in run.data.tags
    assert run.info.end_time == int(float(run.data.tags["workbench.heartbeat"]) * 1000)

    done = run_cli("train", f"resume={run_id}")
    assert done.returncode == 0, done.stderr
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert runs.REAPED_TAG not in run.data.tags and "error" not in run.data.tags
    steps = strictly_increasing_steps(client, run_id)
    assert steps["rollout/ep_rew_mean"] == list(range(128, 1281, 128))


@pytest.mark.slow
def test_reap_spares_a_live_training_and_a_run_reaped_alive_ends_finished(
    store: Path, tmp_path: Path
) -> None:
    # The training holds mid-rollout (tests/faulty_envs.py) until released: certainly alive.
    hold = tmp_path / "hold" / "training.ipynb"
    hold.parent.mkdir()
    training = Training(tmp_path, *BASE, f"env.id={HELD}", "total_timesteps=1280",
                        env={"WORKBENCH_NOTEBOOK": str(hold)})
    training.wait_for(lambda: hold.with_suffix(".held").exists())
    run_id = training.run_id()
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    live = run_cli("runs", "reap", "--older-than", "0")
    assert live.returncode == 0, live.stderr
    assert live.stdout.splitlines()[0].startswith(f"live {run_id}: heartbeat ")
    assert client.get_run(run_id).info.status == "RUNNING"

    # Suspended (a laptop lid, a stopped container): its heartbeat grows old and it is reaped.
    training.proc.suspend()
    beat = float(client.get_run(run_id).data.tags["workbench.heartbeat"])
    time.sleep(max(0.0, beat + runs.LIVE_WINDOW_S + 1 - time.time()))
    reap = run_cli("runs", "reap", "--older-than", "0")
    assert reap.returncode == 0, reap.stderr
    assert reap.stdout.splitlines()[0].startswith(f"reaped {run_id}: KILLED")
    assert client.get_run(run_id).info.status == "KILLED"
    training.proc.resume()  # it was alive after all: it takes its run back
    release(hold.parent)
    assert training.proc.wait(timeout=600) == 0, training.stderr
    assert f"run {run_id} had been marked KILLED by `workbench runs reap`" in training.stderr
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert "error" not in run.data.tags and runs.REAPED_TAG not in run.data.tags
    assert run.info.end_time > float(run.data.tags["workbench.heartbeat"]) * 1000 - 1
    training.wait_no_survivors()


@pytest.mark.unit
def test_reap_spares_runs_with_a_recent_heartbeat(store: Path) -> None:
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.create_experiment("reap-test", artifact_location=(store / "a").as_uri())
    now = time.time()
    live = client.create_run(experiment, tags={"workbench.heartbeat": f"{now - 15:.3f}"})
    dead = client.create_run(experiment, tags={"workbench.heartbeat": f"{now - 400:.3f}"})
    silent = client.create_run(experiment, start_time=int((now - 900) * 1000))
    finished = client.create_run(experiment, tags={"workbench.heartbeat": f"{now - 999:.3f}"})
    client.set_terminated(finished.info.run_id, "FINISHED")

    reaped = runs.reap_stale_runs(older_than_s=300, now=now)
    assert sorted(reaped) == sorted([dead.info.run_id, silent.info.run_id])
    assert client.get_run(live.info.run_id).info.status == "RUNNING"
    assert client.get_run(finished.info.run_id).info.status == "FINISHED"
    dead_tag = float(dead.data.tags["workbench.heartbeat"])
    assert client.get_run(dead.info.run_id).info.end_time == int(dead_tag * 1000)
    # A filter limits reaping to, e.g., one sweep's points.
    assert runs.reap_stale_runs(older_than_s=10, now=now, filter_string="tags.sweep_id = 'x'"
                                ) == []
    # A heartbeat stamped while the reap runs (after its `now`) is live, not skipped unsaid.
    beating = client.create_run(experiment, tags={"workbench.heartbeat": f"{now + 1:.3f}"})
    report = runs.reap(older_than_s=0, now=now)
    assert (report.reaped, sorted(run_id for run_id, _ in report.live)) == (
        [], sorted([live.info.run_id, beating.info.run_id]))


# --------------------------------------------------------------------------- JupyterLab


def iopub_of(kc: Any, msg_id: str, timeout: float = 60) -> list[dict[str, Any]]:
    """The kernel's output messages for one execution, up to its "idle" status."""
    found = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return found
        found.append(msg)


@pytest.mark.slow
def test_kernel_interrupt_kills_the_run_and_keeps_the_kernel(store: Path) -> None:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT), env={**os.environ})
    try:
        code = (  # what notebooks/train.ipynb does
            "from workbench import notebook\n"
            "from workbench.training import load_config\n"
            "from workbench.training.trainer import train\n"
            "notebook.short_errors()\n"
            f"train(load_config({[*BASE, 'total_timesteps=100000', 'env.vec_env=subproc']!r}),"
            " run_info={'notebook': 'notebooks/train.ipynb'})"
        )
        msg_id = kc.execute(code)
        client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
        deadline = time.monotonic() + 300
        while True:  # wait until the run has its second checkpoint
            assert time.monotonic() < deadline
            found = client.search_experiments()
            run = None
            if len(found) > 1 or (found and found[0].name == "workbench"):
                hits = client.search_runs([e.experiment_id for e in found])
                run = hits[0] if hits else None
            saved = run.data.tags.get("workbench.checkpoint", "") if run else ""
            if saved and int(saved.rsplit("-", 1)[1]) >= 256:  # tags move on every 128 steps
                break
            time.sleep(0.5)
        km.interrupt_kernel()  # what JupyterLab's stop button does: SIGINT to the kernel
        reply = kc.get_shell_msg(timeout=120)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=120)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "TrainingInterrupted"
        shown = iopub_of(kc, msg_id)
        # One line where the traceback was, saying how to resume in the notebook's own terms,
        # and nothing else on stderr.
        (error,) = [m["content"] for m in shown if m["msg_type"] == "error"]
        assert len(error["traceback"]) == 1
        assert error["traceback"][0].startswith("TrainingInterrupted: SIGINT received at step ")
        assert (f'resume with: overrides = ["resume={run.info.run_id}"] in the notebook\'s '
                "parameters") in error["traceback"][0]
        stderr = "".join(m["content"]["text"] for m in shown
                         if m["msg_type"] == "stream" and m["content"]["name"] == "stderr")
        assert "workbench:" not in stderr, stderr
        run = client.get_run(run.info.run_id)
        assert run.info.status == "KILLED"
        assert run.data.tags["error"].startswith("interrupted: SIGINT received at step ")
        assert checkpoint.stored_checkpoints(client, run.info.run_id)[-1].complete
        # The kernel survives; of its children only multiprocessing's forkserver and resource
        # tracker remain (kept for the next run), no environment worker.
        outputs: list[str] = []
        check = kc.execute_interactive(
            "import psutil\n"
            "print(sorted(' '.join(p.cmdline()) for p in psutil.Process().children(True)))",
            timeout=60, output_hook=lambda m: outputs.append(m["content"].get("text", "")))
        assert check["content"]["status"] == "ok"
        children = eval("".join(outputs))  # a printed list of strings
        assert all("forkserver" in c or "resource_tracker" in c for c in children), children
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
