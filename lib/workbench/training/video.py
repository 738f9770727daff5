"""A run's rollout videos: recorded in its evaluation env, logged under ``video/``.

:class:`VideoRecorder` plays the deterministic policy in the evaluation env (never in the
training envs), encodes an MP4 and a GIF preview (:mod:`workbench.envs.video`) and logs both
to the MLflow run: ``video/replay.mp4`` and ``video/replay.gif`` after the final evaluation,
``video/step-<N>.*`` every ``video.every_steps`` during training (:class:`VideoCallback`).
The seconds it takes (stepping, rendering, encoding, logging) add up in the metric
``video/render_seconds``, which the console summary prints next to the wall time.

A machine without a working OpenGL backend gets one warning line, and the run goes on
without video.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, sync_envs_normalization

from workbench.config import VideoConfig
from workbench.envs.video import (
    RenderingUnavailable,
    VideoFiles,
    VideoSettings,
    encoding,
    frame_rate,
    record_vec,
    rendering_env,
)
from workbench.training.callbacks import LocalsFreeCallback

ARTIFACT_DIR = "video"
FINAL_STEM = "replay"  # video/replay.mp4, the zoo's name for a policy's replay video
MIN_VIDEO_SECONDS = 2.0  # the final video's budget is never less (video.max_share)


@dataclass(frozen=True)
class RecordedVideo:
    """One logged video."""

    artifact: str  # e.g. video/replay.mp4
    preview: str  # e.g. video/replay.gif
    frames: int
    size: tuple[int, int]
    fps: float
    episode_return: float  # mean over the recorded episodes, of the rendered steps
    cut: bool = False  # stopped at the time budget (video.max_share)


class VideoRecorder:
    """Records and logs the run's videos; remembers after one try that none can be made (no
    OpenGL backend, or an env without rendering)."""

    def __init__(self, cfg: VideoConfig, client: Any, run_id: str) -> None:
        self.settings = VideoSettings.from_config(cfg)
        self.max_share = cfg.max_share
        self.client = client
        self.run_id = run_id
        self.seconds = 0.0
        self.unavailable: str | None = None  # why no video can be made on this machine
        self.reason = ""  # that in one phrase, for the summary (no OpenGL, no rendering)
        self.final: RecordedVideo | None = None

    def record(self, model: Any, train_env: VecEnv, eval_env: VecEnv, stem: str,
               budget_s: float | None = None) -> RecordedVideo | None:
        """Record ``stem``.mp4/.gif (for ``budget_s`` seconds at most) and log them; None
        (after one warning) when no video can be made."""
        if self.unavailable is not None:
            return None
        started = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix="workbench-video-") as tmp:
                try:
                    sync_envs_normalization(train_env, eval_env)  # as evaluation does
                    fps = frame_rate(rendering_env(eval_env), self.settings)
                    with encoding(Path(tmp), stem, fps) as encoder:  # frames streamed to ffmpeg
                        recording = record_vec(
                            eval_env, lambda obs: model.predict(obs, deterministic=True)[0],
                            self.settings, encoder.add, budget_s)
                except RenderingUnavailable as exc:
                    self.unavailable, self.reason = str(exc), exc.reason
                    print(f"workbench: warning: no video: {exc}; the run goes on without "
                          "video", file=sys.stderr, flush=True)
                    return None
                files = encoder.close()
                self.client.log_artifacts(self.run_id, tmp, artifact_path=ARTIFACT_DIR)
        finally:
            self.seconds += time.perf_counter() - started
        returns = recording.returns
        return recorded(files, sum(returns) / len(returns), recording.cut)

    def record_final(self, model: Any, train_env: VecEnv, eval_env: VecEnv, wall_s: float
                     ) -> dict[str, float]:
        """The final video, within its budget (:func:`video_budget` of the ``wall_s`` seconds
        of training); returns its metrics for the run's summary batch."""
        self.final = self.record(model, train_env, eval_env, FINAL_STEM,
                                 video_budget(self.max_share, wall_s))
        metrics = {"video/render_seconds": self.seconds}
        if self.final is not None:
            metrics["video/frames"] = float(self.final.frames)
            if not self.final.cut:  # a cut episode's return depends on the machine's load
                metrics["video/episode_return"] = self.final.episode_return
        return metrics

    def summary(self, wall_s: float) -> str:
        """The console summary's ``video`` row."""
        if self.unavailable is not None:
            return f"none ({self.reason}, see the warning above)"
        if self.final is None:
            return f"none at the end; rendering took {self.seconds:.1f} s"
        v = self.final
        share = f", {100 * self.seconds / wall_s:.0f}% of training time" if wall_s > 0 else ""
        cut = (f"; cut at the video budget ({self.max_share:.0%} of training time, at least "
               f"{MIN_VIDEO_SECONDS:g} s: video.max_share=null records whole episodes)"
               if v.cut and self.max_share is not None else "")
        shown = "episode cut" if v.cut else f"return {v.episode_return:.1f}"
        return (f"{v.artifact} ({v.frames} frames {v.size[0]}x{v.size[1]} at {v.fps:g} fps, "
                f"{shown}); rendering added {self.seconds:.1f} s{share}{cut}")


def video_budget(max_share: float | None, wall_s: float) -> float | None:
    """Seconds the final video may take: ``max_share`` of the training time, at least
    :data:`MIN_VIDEO_SECONDS`; None (no limit) without a share."""
    return None if max_share is None else max(max_share * wall_s, MIN_VIDEO_SECONDS)


def recorded(files: VideoFiles, episode_return: float, cut: bool = False) -> RecordedVideo:
    return RecordedVideo(
        artifact=f"{ARTIFACT_DIR}/{files.video.name}",
        preview=f"{ARTIFACT_DIR}/{files.preview.name}", frames=files.frames, size=files.size,
        fps=files.fps, episode_return=episode_return, cut=cut)


class VideoCallback(LocalsFreeCallback):
    """``video/step-<N>.mp4`` every ``every_steps`` env steps, recorded between rollout and
    dump like the periodic evaluation; ``video/render_seconds`` goes into that iteration's
    log. None is made once the budget is reached: the final video covers it."""

    acts_on_steps = False

    def __init__(self, recorder: VideoRecorder, eval_env: VecEnv, every_steps: int, total: int
                 ) -> None:
        super().__init__()
        self.recorder = recorder
        self.eval_env = eval_env
        self.every_steps = every_steps
        self.total = total
        self.next_video = every_steps

    def _on_training_start(self) -> None:
        while self.next_video <= self.num_timesteps:  # a resumed run: those were made
            self.next_video += self.every_steps

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if self.num_timesteps < self.next_video or self.num_timesteps >= self.total:
            return
        while self.next_video <= self.num_timesteps:
            self.next_video += self.every_steps
        self.recorder.record(self.model, self.training_env, self.eval_env,
                             f"step-{self.num_timesteps:09d}")
        self.logger.record("video/render_seconds", self.recorder.seconds)


def video_callbacks(recorder: VideoRecorder | None, eval_env: VecEnv, cfg: VideoConfig,
                    total: int) -> list[BaseCallback]:
    """``[VideoCallback]`` when videos are recorded during training, else ``[]``."""
    if recorder is None or cfg.every_steps <= 0:
        return []
    return [VideoCallback(recorder, eval_env, cfg.every_steps, total)]
