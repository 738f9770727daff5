"""Smoke tier: real MuJoCo, real SB3 PPO, a real (temporary) MLflow SQLite store."""

from __future__ import annotations

import ast
import getpass
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import gymnasium
import papermill
import psutil
import pytest
from mlflow.tracking import MlflowClient
from workbench import console
from workbench.notebook import check_parameters
from workbench.training import load_config, train
from workbench.training.describe import (
    checkpoint_plan,
    run_source_tags,
    untested_defaults_note,
)
from workbench.training.trainer import TrainResult, summary_rows

from .conftest import ROOT, TINY, run_cli
from .support.envs import ExplodingEnv

ITERATION_KEYS = [
    "rollout/ep_rew_mean", "rollout/ep_len_mean", "train/entropy_loss", "train/approx_kl",
    "train/clip_fraction", "train/policy_gradient_loss", "train/value_loss",
    "train/explained_variance", "train/std", "train/learning_rate", "time/fps",
    "train/entropy", "time/rollout_s", "time/update_s", "eval/mean_reward", "eval/std_reward",
]


def metric_steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return [m.step for m in client.get_metric_history(run_id, key)]


@pytest.mark.unit
def test_the_header_says_when_the_shipped_defaults_are_untested_on_a_task() -> None:
    assert untested_defaults_note(load_config(["env=hopper"])) is None  # measured
    assert untested_defaults_note(load_config(["env=halfcheetah"])) is None
    assert untested_defaults_note(load_config(["env=swimmer"])) is None  # its tuning file
    assert untested_defaults_note(load_config(["env=reacher"])) is None  # untuned, measured
    assert untested_defaults_note(load_config(["env=ant"])) is None
    assert untested_defaults_note(load_config(["env=humanoid"])) is None
    assert untested_defaults_note(load_config(["env=walker2d"])) is None  # its tuning file
    assert untested_defaults_note(load_config(["experiment=zoo_walker2d"])) is None  # a preset
    assert untested_defaults_note(load_config(["env=humanoid_standup"])) == (
        "the shipped defaults are untested on humanoid_standup (measured on halfcheetah, "
        "hopper, swimmer, inverted_double_pendulum, reacher, ant, humanoid, inverted_pendulum "
        "and walker2d only, docs/benchmarks.md); rl-baselines3-zoo's tuned values: "
        "experiment=zoo_humanoid_standup")
    duck = untested_defaults_note(load_config(["env=duck"]))
    assert duck is not None and "experiment=" not in duck  # no zoo preset to point at


@pytest.mark.unit
def test_the_header_says_when_the_shipped_defaults_trail_the_zoo(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A task measured and found behind rl-baselines3-zoo (none today) gets its own note."""
    monkeypatch.setattr("workbench.training.describe.TRAILING_TASKS", ("humanoid_standup",))
    monkeypatch.setattr("workbench.training.describe.MEASURED_TASKS", ("hopper",))
    assert untested_defaults_note(load_config(["env=humanoid_standup"])) == (
        "the shipped defaults trail rl-baselines3-zoo on humanoid_standup "
        "(docs/benchmarks.md#at-a-glance); rl-baselines3-zoo's tuned values: "
        "experiment=zoo_humanoid_standup")
    assert untested_defaults_note(load_config(["env=ant"])) == (
        "the shipped defaults are untested on ant (measured on hopper and humanoid_standup "
        "only, docs/benchmarks.md); rl-baselines3-zoo's tuned values: experiment=zoo_ant")


def test_the_notebooks_first_run_is_a_measured_configuration() -> None:
    """What notebooks/train.ipynb runs before anything is changed (its parameters' defaults,
    as papermill reads them) is a configuration docs/benchmarks.md measured: no header note."""
    defaults = {name: ast.literal_eval(p["default"]) for name, p in
                papermill.inspect_notebook(str(ROOT / "notebooks" / "train.ipynb")).items()}
    params = check_parameters(defaults, ["", "params = notebook.check_parameters(globals(), In)"])
    assert untested_defaults_note(load_config(params.config_overrides())) is None


@pytest.mark.unit
def test_the_run_says_where_its_model_and_checkpoints_are_saved() -> None:
    """The header says when checkpoints are written and where; the summary names the model's
    folder and the newest checkpoint, each with the command that uses it."""
    assert checkpoint_plan(load_config(["checkpoint.every_steps=10000"])) == (
        "every 10000 steps, at the end and on a stop -> artifacts/checkpoints/step-<N>/ "
        "(newest 3 kept)")
    assert checkpoint_plan(load_config(["checkpoint.every_steps=0", "checkpoint.keep_last=0"])
                           ) == "at the end and on a stop -> artifacts/checkpoints/step-<N>/ " \
        "(all kept)"
    result = TrainResult(run_id="r1", run_name="n", experiment_id="1", tracking_uri="sqlite://",
                         status="FINISHED", num_timesteps=384, eval_mean_reward=1.0,
                         eval_std_reward=0.0, fps=1.0, wall_time_s=1.0, peak_rss_mb=1.0,
                         artifact_uri="file:///a", checkpoint="checkpoints/step-000000000384")
    rows = dict(summary_rows(result))
    assert rows["model"].startswith("artifacts/model/ (model.zip")
    assert "workbench export --run r1" in rows["model"]
    assert rows["checkpoint"] == ("artifacts/checkpoints/step-000000000384/ (workbench train "
                                  "resume=r1 total_timesteps=<more> continues it)")


@pytest.mark.unit
def test_progress_to_a_log_is_a_line_now_and_then_not_a_redrawn_bar() -> None:
    """Output redirected (a log file, CI): no carriage-return refreshes, a line every minute
    and one at the end; on a terminal the live tqdm bar."""
    log = io.StringIO()
    bar = console.progress(4096, "training", "step", file=log)
    assert isinstance(bar, console.ProgressLines)
    for _ in range(4096):
        bar.update(1)  # thousands of updates within the minute: nothing printed yet
    assert log.getvalue() == ""
    bar.every_s = 0.0
    bar.update(0)
    bar.write("it 1/2 | ...")
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 3
    assert lines[0].startswith("training: 4096/4096 steps (100%), 0m")
    assert lines[1] == "it 1/2 | ..."

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert not isinstance(console.progress(10, "x", "step", file=Terminal()),
                          console.ProgressLines)


@pytest.mark.unit
def test_run_source_names_the_notebook_or_command_and_the_team_login(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    cli = run_source_tags({"command": "workbench train seed=3"})
    assert cli["mlflow.source.name"] == "workbench train seed=3"
    assert cli["mlflow.source.type"] == "LOCAL"
    assert cli["mlflow.user"] == getpass.getuser()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")  # team mode: the server login
    notebook = run_source_tags({"notebook": "notebooks/train.ipynb", "command": "ignored"})
    assert notebook["mlflow.source.name"] == "notebooks/train.ipynb"
    assert notebook["mlflow.source.type"] == "NOTEBOOK"
    assert notebook["mlflow.user"] == "alice"


def test_tiny_training_logs_everything(store: Path) -> None:
    result = train(load_config(TINY))
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "halfcheetah-ne2-ns64-s0"
    assert run.data.tags["mlflow.source.name"] == "workbench (Python API)"  # "Source" column
    assert run.data.tags["mlflow.user"] == getpass.getuser()  # "Created by"
    # 384 steps / 128 per rollout = 3 iterations at steps 128, 256, 384.
    for key in ITERATION_KEYS:
        steps = metric_steps(client, result.run_id, key)
        assert len(steps) >= 2, (key, steps)
        assert set(steps) <= {128, 256, 384}, (key, steps)
    for key in ["train/approx_kl", "train/entropy", "time/update_s", "rollout/ep_rew_mean"]:
        assert sorted(metric_steps(client, result.run_id, key)) == [128, 256, 384], key
    entropy = client.get_metric_history(result.run_id, "train/entropy")
    entropy_loss = client.get_metric_history(result.run_id, "train/entropy_loss")
    assert [m.value for m in entropy] == [-m.value for m in entropy_loss]
    params = run.data.params
    assert params["env.id"] == "HalfCheetah-v5"
    assert params["algo.n_steps"] == "64"
    assert params["derived.rollout_size"] == "128"
    assert params["derived.env_seeds"] == "[0, 1]"
    artifacts = {a.path for a in client.list_artifacts(result.run_id)}
    assert {"config.yaml", "model"} <= artifacts
    model_files = {a.path for a in client.list_artifacts(result.run_id, "model")}
    assert {"model/model.zip", "model/config.yaml"} <= model_files
    assert result.num_timesteps == 384


def test_system_metrics_use_mlflow_sampler(store: Path) -> None:
    # a run shorter than one sampling interval still logs its one (partial) sample
    overrides = ["total_timesteps=1280", "eval.every_steps=0",
                 "tracking.system_metrics_interval_s=600"]
    result = train(load_config([*TINY, *overrides]))
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    keys = set(client.get_run(result.run_id).data.metrics)
    assert any(k.startswith("system/cpu_utilization") for k in keys), keys


def test_normalized_run_saves_statistics(store: Path) -> None:
    result = train(load_config([*TINY, "env.normalize=true", "tracking.system_metrics=false"]))
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    files = {a.path for a in client.list_artifacts(result.run_id, "model")}
    assert "model/vecnormalize.pkl" in files


def test_failing_env_marks_run_failed(store: Path) -> None:
    gymnasium.register("WorkbenchTest/Exploding-v0", entry_point=ExplodingEnv)
    cfg = load_config([*TINY, "env.id=WorkbenchTest/Exploding-v0", "eval.every_steps=0"])
    with pytest.raises(RuntimeError, match="simulator exploded"):
        train(cfg)
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("workbench").experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags["error"] == "RuntimeError: simulator exploded at step 21"


def test_cli_subproc_training_leaves_no_processes(store: Path) -> None:
    proc = psutil.Popen(
        [sys.executable, "-m", "workbench", "train", *TINY, "env.vec_env=subproc"],
        cwd=Path(__file__).resolve().parents[1], start_new_session=True,
        stdout=-1, stderr=-1, text=True, env={**os.environ},
    )
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    run_id = out.strip().splitlines()[-1]
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    assert client.get_run(run_id).info.status == "FINISHED"
    assert client.get_run(run_id).data.params["env.vec_env"] == "subproc"
    time.sleep(0.5)
    leftovers = [p for p in psutil.process_iter(["pid"]) if _session(p.pid) == proc.pid]
    assert leftovers == [], leftovers


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def test_python_m_workbench_is_the_same_program() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "train" in proc.stdout and "workbench" in proc.stdout


PEAK_PROBE = """
import sys
from workbench.training import load_config, train
result = train(load_config(sys.argv[1:]))
status = open("/proc/self/status").read()
print(result.run_id, [int(line.split()[1]) for line in status.splitlines()
                      if line.startswith("VmHWM")][0] / 1024)
"""


# Starts the probe from a parent holding 1 GiB: an exec'd process inherits its parent's peak
# in ru_maxrss, which a training started from a big process (a test runner) must not report.
LARGE_PARENT = """
import subprocess, sys
held = b"x" * (1 << 30)
sys.exit(subprocess.run(sys.argv[1:]).returncode)
"""


@pytest.mark.parametrize("backend", ["dummy", "subproc"])
def test_peak_memory_is_the_process_trees(store: Path, backend: str) -> None:
    """summary/peak_rss_mb against the kernel's own peak of the training process (VmHWM):
    the same with in-process envs, more with subprocess workers (their memory counts too),
    and never the memory of the process that started the training."""
    done = subprocess.run(
        # No video: its encoder is an ffmpeg child process, rightly part of the tree's memory.
        [sys.executable, "-c", LARGE_PARENT, sys.executable, "-c", PEAK_PROBE, *TINY,
         f"env.vec_env={backend}", "video.enabled=false", "tracking.system_metrics=false",
         "console.iteration_lines=false"],
        capture_output=True, text=True, timeout=300, env=os.environ)
    assert done.returncode == 0, done.stderr[-2000:]
    run_id, vm_hwm = done.stdout.strip().splitlines()[-1].split()
    metrics = MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(run_id).data.metrics
    peak, own = metrics["summary/peak_rss_mb"], float(vm_hwm)
    if backend == "dummy":
        assert 0.95 * own <= peak <= own + 1  # VmHWM can only grow after the summary
    else:
        assert peak > own  # the workers' resident memory is part of the tree's


BUSY_WORKER = """
import time
start = time.process_time()
while time.process_time() - start < 0.3:
    pass
print("spent", flush=True)
time.sleep(120)
"""


def test_the_process_tree_counts_its_workers_cpu() -> None:
    """time/rollout_cpu_s and time/update_cpu_s include subprocess env workers: a child's CPU
    seconds are in the tree's, though its list of children is kept between reads."""
    from workbench.training.callbacks import ProcessTree

    worker = subprocess.Popen([sys.executable, "-c", BUSY_WORKER], stdout=subprocess.PIPE,
                              text=True)
    try:
        tree = ProcessTree(refresh_s=3600.0)
        tree.cpu_seconds()  # lists the worker
        assert worker.stdout is not None and worker.stdout.readline().strip() == "spent"
        own = psutil.Process().cpu_times()
        assert tree.cpu_seconds() - (own.user + own.system) >= 0.25
    finally:
        worker.kill()
        worker.wait()


def test_callbacks_that_skip_sb3s_per_step_locals_copy_see_the_same_locals() -> None:
    """In a callback list a LocalsFreeCallback's ``locals`` are the list's, updated every step
    as an ordinary callback's are; no workbench callback that skips the copy reads
    ``self.locals`` itself (alone, it would read stale values)."""
    import inspect

    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from workbench.training import callbacks, checkpoint, faults, progress, video
    from workbench.training.callbacks import LocalsFreeCallback

    class Seen(BaseCallback):
        def _on_step(self) -> bool:
            self.saw.append((self.locals["n_steps"], id(self.locals["infos"])))
            return True

    class Lean(LocalsFreeCallback):
        def _on_step(self) -> bool:
            self.saw.append((self.locals["n_steps"], id(self.locals["infos"])))
            return True

    seen, lean = Seen(), Lean()
    seen.saw, lean.saw = [], []
    PPO("MlpPolicy", "Pendulum-v1", n_steps=8, batch_size=8, n_epochs=1, seed=0,
        device="cpu").learn(8, callback=[seen, lean])
    assert lean.saw == seen.saw and [n for n, _ in lean.saw] == list(range(8))  # never stale
    lean_classes = [cls for module in (callbacks, checkpoint, faults, progress, video)
                    for _, cls in inspect.getmembers(module, inspect.isclass)
                    if issubclass(cls, LocalsFreeCallback) and cls is not LocalsFreeCallback
                    and cls.__module__ == module.__name__]
    assert len(lean_classes) >= 7
    for cls in lean_classes:
        assert "self.locals" not in inspect.getsource(cls), cls.__name__
    assert "self.locals" in inspect.getsource(callbacks.RewardComponentsCallback)
    assert not issubclass(callbacks.RewardComponentsCallback, LocalsFreeCallback)


def test_a_callback_chain_skips_only_per_step_work_nobody_needs() -> None:
    """The chain the trainer passes to SB3 calls ``on_step`` only on children that act on
    steps and copies the rollout's locals only when a child may read them; every hook of a
    skipped child reads the step counters a plain ``CallbackList`` would have given it."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList
    from workbench.training.callbacks import CallbackChain, LocalsFreeCallback

    class Boundaries(LocalsFreeCallback):
        acts_on_steps = False

        def _init_callback(self) -> None:
            self.seen: list[tuple[str, int, int]] = []
            self.steps = 0

        def _on_step(self) -> bool:
            self.steps += 1
            return True

        def _on_rollout_start(self) -> None:
            self.seen.append(("start", self.n_calls, self.num_timesteps))

        def _on_rollout_end(self) -> None:
            self.seen.append(("end", self.n_calls, self.num_timesteps))

        def _on_training_end(self) -> None:
            self.seen.append(("training end", self.n_calls, self.num_timesteps))

    class Stepped(LocalsFreeCallback):
        def _init_callback(self) -> None:
            self.steps = 0

        def _on_step(self) -> bool:
            self.steps += 1
            return True

    class Reader(BaseCallback):
        def _init_callback(self) -> None:
            self.saw: list[int] = []

        def _on_step(self) -> bool:
            self.saw.append(self.locals["n_steps"])
            return True

    def learn(callback: BaseCallback) -> None:
        PPO("MlpPolicy", "Pendulum-v1", n_steps=8, batch_size=8, n_epochs=1, seed=0,
            device="cpu").learn(24, callback=callback)

    plain, lean = Boundaries(), Boundaries()
    learn(CallbackList([plain]))
    stepped, reader = Stepped(), Reader()
    learn(CallbackChain([lean, stepped, reader]))
    assert plain.steps == 24 and lean.steps == 0 and stepped.steps == 24
    assert lean.seen == plain.seen and len(plain.seen) == 7  # 3 rollouts, then training end
    assert plain.seen[-1] == ("training end", 24, 24)
    assert reader.saw == [0, 1, 2, 3, 4, 5, 6, 7] * 3  # the locals copied at every step

    alone = CallbackChain([Boundaries(), Stepped()])  # nobody reads the locals: no copy
    learn(alone)
    assert "infos" not in alone.locals and "n_steps" not in alone.locals


def test_a_run_leaves_the_process_tracking_uri_alone(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The system-metrics sampler gets the run's store directly: ``mlflow.set_tracking_uri``
    would export MLFLOW_TRACKING_URI, and a notebook's next run would log into this store
    whatever its tracking.uri says."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    first, second = (f"sqlite:///{tmp_path / name}" for name in ("first.db", "second.db"))
    train(load_config([*TINY, f"tracking.uri={first}", "tracking.system_metrics=true"]))
    assert "MLFLOW_TRACKING_URI" not in os.environ
    result = train(load_config([*TINY, f"tracking.uri={second}", "tracking.system_metrics=false"]))
    assert result.tracking_uri == second


def test_artifacts_live_beside_a_store_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other" / "dir"
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{other / 'm.db'}")
    result = train(load_config([*TINY, "tracking.system_metrics=false"]))
    assert result.artifact_uri.startswith((other / "mlartifacts").as_uri())
    assert (other / "mlartifacts").is_dir()
    assert not (tmp_path / "experiments" / "mlartifacts").exists()
    header = capsys.readouterr().out  # says where the artifacts are
    assert re.search(rf"^artifacts +: {re.escape(result.artifact_uri)}$", header, re.M), header


@pytest.mark.unit
def test_the_progress_bar_counts_the_steps_training_runs() -> None:
    """SB3 trains whole rollouts: 40,000 steps at 4 x 256 run 40,960, which the bar's total
    is (it read '40960/40000 steps (102%)')."""
    from workbench.envs.spec import EnvSpec
    from workbench.envs.vector import make_eval_env
    from workbench.training.progress import ProgressBarCallback
    from workbench.training.trainer import build_callbacks

    cfg = load_config(["env=inverted_pendulum", "env.num_envs=4", "algo.n_steps=256",
                       "total_timesteps=40000"])
    env = make_eval_env(EnvSpec.from_config(cfg))
    try:
        (bar,) = [c for c in build_callbacks(cfg, env, env, 1024)
                  if isinstance(c, ProgressBarCallback)]
    finally:
        env.close()
    assert bar.total == 40960


@pytest.mark.unit
def test_the_pace_line_tells_the_budget_s_training_time_once(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """SAC on one env runs ~30 steps/s on 2 cores: 15 s in, the run says what its budget takes."""
    from types import SimpleNamespace

    from workbench.training import progress

    clock = iter([100.0, 110.0, 115.0, 130.0])  # training start, then three rollout ends
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    line = progress.PaceLine(total=20000)
    line.model = SimpleNamespace(num_timesteps=0)  # type: ignore[assignment]
    line._on_training_start()
    for steps in (300, 450, 900):
        line.model.num_timesteps = steps
        line._on_rollout_end()
    assert capsys.readouterr().out == (
        "pace: 30 steps/s over the first 15 s: 20,000 steps take about 11 min of "
        "training\n")
    assert console.duration(40) == "40 s" and console.duration(3 * 3600) == "3.0 h"
