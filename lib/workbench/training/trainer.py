"""The training core: ``train(cfg)`` runs one training (PPO, A2C, SAC, TD3, TQC or CrossQ:
``training/algorithms.py``) and records it in MLflow.

It reads top to bottom: validate, prepare the start (fresh, resume, Hub bundle), set the run
up, open it, build envs and the model, learn with callbacks, evaluate deterministically, save. The
run's lifecycle (status, last checkpoint, closing envs, freeing the GPU, draining the outbox)
is :func:`workbench.training.lifecycle.open_run`'s. The CLI, the notebooks and the tests all
call this function; nothing forks it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlflow.entities import Metric
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import VecEnv

import workbench.training.algorithms as algorithms
from workbench import console
from workbench.config import OffPolicyConfig, WorkbenchConfig, derive
from workbench.envs.vector import make_envs, make_eval_env
from workbench.envs.video import VideoSettings
from workbench.tracking.logged_models import BestCheckpoint
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import RunWrites
from workbench.tracking.writer import MlflowWriter, late_prefixes
from workbench.training.callbacks import (
    IterationCallback,
    MemoryPeak,
    OffPolicyIterationCallback,
    evaluate,
    reward_component_callbacks,
)
from workbench.training.dataset import dataset_environment
from workbench.training.describe import header_lines, run_source_tags
from workbench.training.faults import UpdateCheck
from workbench.training.lifecycle import open_run, setup_run
from workbench.training.model import build_model, save_model
from workbench.training.progress import ConsoleWriter, PaceLine, ProgressBarCallback
from workbench.training.start import Start, prepare, validate
from workbench.training.video import VideoRecorder, video_callbacks


@dataclass
class TrainResult:
    """What one training produced, for printing, notebooks and sweeps."""

    run_id: str
    run_name: str
    experiment_id: str
    tracking_uri: str
    status: str
    num_timesteps: int
    eval_mean_reward: float
    eval_std_reward: float
    fps: float
    wall_time_s: float
    peak_rss_mb: float
    artifact_uri: str
    video: str | None = None  # artifact path of the final video (video/replay.mp4), if any
    video_seconds: float = 0.0  # what recording videos added to the run
    video_line: str = ""  # the summary's video row
    checkpoint: str | None = None  # artifact path of the newest checkpoint, to resume from
    # checkpoint.keep=best: the best-evaluated checkpoint's step and mean deterministic return
    best_checkpoint: BestCheckpoint | None = None


def train(
    cfg: WorkbenchConfig | Mapping[str, Any],
    *,
    tags: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
    run_info: Mapping[str, Any] | None = None,
    callbacks: Sequence[BaseCallback] = (),
) -> TrainResult:
    """Train the configured algorithm and record the run; returns its summary.

    ``tags`` are added to the MLflow run; ``parent_run_id`` nests it under a sweep's run.
    ``run_info`` (command line, or notebook path and papermill parameters, overrides) goes
    into the manifest's ``run`` section; without it the manifest detects what it can.
    ``callbacks`` are extra SB3 callbacks run after the workbench's own (e.g. live plots).
    With ``cfg.resume`` the run continues from its last checkpoint (training/resume.py).
    The run ends FINISHED, FAILED (error message in the ``error`` tag) or KILLED; a
    checkpoint of the last good state is kept in every case.
    """
    cfg = validate(cfg)  # bad input raises here or in the next lines: nothing written yet
    start = prepare(cfg)  # fresh, the run's own checkpoint (resume=) or a Hub bundle (init.*);
    # the inputs: the robot files, the init.dataset pulled (WORKBENCH_DATASET_DIR in the run)
    with start.claimed():  # resume=: no other process continues the run meanwhile
        return train_prepared(cfg, start, tags=tags, parent_run_id=parent_run_id,
                              run_info=run_info, callbacks=callbacks)


def train_prepared(
    cfg: WorkbenchConfig,
    start: Start,
    *,
    tags: Mapping[str, str] | None,
    parent_run_id: str | None,
    run_info: Mapping[str, Any] | None,
    callbacks: Sequence[BaseCallback],
) -> TrainResult:
    """:func:`train` once its config is checked and its start prepared (and claimed)."""
    setup = setup_run(cfg, start, tags={**run_source_tags(run_info), **(tags or {})},
                      parent_run_id=parent_run_id)
    with dataset_environment(start.dataset), open_run(setup, start) as run:
        run.record(setup, start, run_info)  # manifest, params, config.yaml
        train_env = run.own(make_envs(setup.env_spec))
        eval_env = run.own(make_eval_env(setup.env_spec, randomization=cfg.eval.randomization,
                                         video=video_settings(cfg)))
        recorder = VideoRecorder(cfg.video, run.client, run.run_id) if cfg.video.enabled else None
        model = run.own_model(build_model(cfg, train_env))
        start.initialize(model, train_env)  # a Hub bundle's weights
        console.print_header(header_lines(cfg, setup.derived, model, setup.torch_threads,
                                          setup.uri, run.run_id, setup.run_name,
                                          setup.vec_choice, run.run.info.artifact_uri))
        model.set_logger(build_logger(run.client, run.run_id, cfg, setup.derived.iterations))
        off_policy = cfg.algo.off_policy
        recovery = run.checkpoints(
            cfg, train_env, eval_env, start.checkpoint_steps(),
            capture_every=setup.derived.log_every_steps if off_policy else 0,
            keep_buffer=buffer_kept(cfg, model))
        start.restore(model, train_env, eval_env, run.client)  # a resumed run's state
        memory = MemoryPeak(cfg.tracking.system_metrics_interval_s)
        started = time.perf_counter()
        run.learn(model, cfg.total_timesteps,
                  [*build_callbacks(cfg, train_env, eval_env, setup.derived.log_every_steps),
                   *video_callbacks(recorder, eval_env, cfg.video, cfg.total_timesteps),
                   memory, *callbacks, recovery],
                  resumed=start.resumed is not None, off_policy=off_policy)
        wall = time.perf_counter() - started
        mean, std = evaluate(model, train_env, eval_env, cfg.eval.final_episodes)
        videos = recorder.record_final(model, train_env, eval_env, wall) if recorder else {}
        summary = summarize(mean, std, model.num_timesteps, wall, memory.peak_mb) | videos
        log_summary(run.client, run.run_id, summary, model.num_timesteps)
        save_model(run.client, run.run_id, cfg, model, train_env, run.manifest)
    stored = run.client.store_run_id  # a run the store lost was re-created under a new id
    info = run.run.info if stored == run.run_id else setup.client.get_run(stored).info
    result = TrainResult(
        run_id=stored, run_name=setup.run_name, experiment_id=info.experiment_id,
        tracking_uri=setup.uri, status="FINISHED", num_timesteps=model.num_timesteps,
        eval_mean_reward=mean, eval_std_reward=std, fps=summary["summary/fps"], wall_time_s=wall,
        peak_rss_mb=summary["summary/peak_rss_mb"], artifact_uri=info.artifact_uri,
        video=recorder.final.artifact if recorder and recorder.final else None,
        video_seconds=recorder.seconds if recorder else 0.0,
        video_line=recorder.summary(wall) if recorder else "off (video.enabled=false)",
        checkpoint=recovery.last_saved,
        best_checkpoint=(BestCheckpoint(recovery.best.step, recovery.best.mean)
                         if recovery.best_step is not None and recovery.best else None),
    )
    if cfg.console.summary:
        print_result(result)
    return result


# --------------------------------------------------------------------------- building blocks


def video_settings(cfg: WorkbenchConfig) -> VideoSettings | None:
    """What the evaluation env renders at, when the run records videos."""
    return VideoSettings.from_config(cfg.video) if cfg.video.enabled else None


def build_logger(
    client: RunWrites, run_id: str, cfg: WorkbenchConfig, iterations: int
) -> Logger:
    """SB3 logger whose writers are MLflow (always) and the console line (optional)."""
    late = late_prefixes(cfg.algo.off_policy)
    writers: list[Any] = [MlflowWriter(client, run_id, late)]
    if cfg.console.iteration_lines:
        writers.append(ConsoleWriter(iterations, late))
    return Logger(folder=None, output_formats=writers)


def build_callbacks(cfg: WorkbenchConfig, train_env: VecEnv, eval_env: VecEnv,
                    log_every: int) -> list[Any]:
    """The workbench's own callbacks, in order: the update check first (before anything
    dumps the logger), timing, entropy and periodic evaluation (off-policy: a logged point
    every ``log_every`` steps), reward components when the env declares them, the progress
    bar when enabled."""
    timing = IterationCallback(eval_env, cfg.eval.every_steps, cfg.eval.n_episodes,
                               cfg.total_timesteps)
    if cfg.algo.off_policy:
        timing = OffPolicyIterationCallback(eval_env, cfg.eval.every_steps, cfg.eval.n_episodes,
                                            cfg.total_timesteps, log_every)
    callbacks: list[Any] = [
        UpdateCheck(params_every=50 if isinstance(timing, OffPolicyIterationCallback) else 1),
        timing,
        *reward_component_callbacks(train_env),
    ]
    callbacks.append(PaceLine(cfg.total_timesteps))
    if cfg.console.progress_bar:  # over the steps it will run: whole rollouts, past the budget
        rollout = derive(cfg).rollout_size
        callbacks.append(ProgressBarCallback(-(-cfg.total_timesteps // rollout) * rollout))
    return callbacks


def buffer_kept(cfg: WorkbenchConfig, model: Any) -> bool:
    """Whether the checkpoints carry the replay buffer (``checkpoint.replay_buffer_max_mb``)."""
    if not isinstance(cfg.algo, OffPolicyConfig):
        return True
    size = algorithms.replay_buffer_bytes(cfg.algo, model.observation_space, model.action_space)
    return size <= cfg.checkpoint.replay_buffer_max_mb * 2**20


def summarize(mean: float, std: float, num_timesteps: int, wall_s: float, peak_rss_mb: float
              ) -> dict[str, float]:
    """The final evaluation and the run's summary figures (``summary/*``)."""
    return {
        "eval/mean_reward": mean,
        "eval/std_reward": std,
        "summary/eval_mean_reward": mean,
        "summary/eval_std_reward": std,
        "summary/fps": num_timesteps / wall_s,
        "summary/wall_time_s": wall_s,
        "summary/peak_rss_mb": peak_rss_mb,  # the training process tree
    }


def log_summary(client: RunWrites, run_id: str, values: Mapping[str, float], step: int) -> None:
    """Log the final evaluation and summary figures in one batch."""
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()])


def summary_rows(result: TrainResult) -> list[tuple[str, object]]:
    """The final summary: what the console prints and the notebook shows as a table."""
    return [
        ("run id", result.run_id),
        ("run name", result.run_name),
        ("status", result.status),
        ("steps", result.num_timesteps),
        ("final eval reward",
         f"{result.eval_mean_reward:.1f} +- {result.eval_std_reward:.1f} (deterministic)"),
        ("fps", f"{result.fps:.0f} steps/s"),
        ("training time", f"{result.wall_time_s:.1f} s (model.learn)"),
        ("peak memory", f"{result.peak_rss_mb:.0f} MiB (PSS of the process tree)"),
        *([("video", result.video_line)] if result.video_line else []),
        ("artifacts", redact_uri(result.artifact_uri)),
        ("model", "artifacts/model/ (model.zip, config.yaml; workbench export --run "
                  f"{result.run_id} for ONNX)"),
        *([("checkpoint", f"artifacts/{result.checkpoint}/ (workbench train "
                          f"resume={result.run_id} total_timesteps=<more> continues it)")]
          if result.checkpoint else []),
        *([("best checkpoint", f"{result.best_checkpoint.line()} (workbench export --run "
                               f"{result.run_id} --checkpoint best)")]
          if result.best_checkpoint else []),
        ("tracking", redact_uri(result.tracking_uri)),
    ]


def print_result(result: TrainResult) -> None:
    """The final summary table."""
    console.print_table(summary_rows(result), title="Training summary")
