"""Rollout videos: a tiny real training (MuJoCo rendering off-screen through EGL, MLflow store)
logs an MP4 that decodes at the configured size and frame count and a GIF preview; rendering
happens in the evaluation env only; a machine without a usable OpenGL backend gets one warning
line and the run still finishes."""

from __future__ import annotations

import dataclasses
import gc
import math
import os
from collections.abc import Iterator
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image
from stable_baselines3.common.callbacks import BaseCallback
from workbench.config import ConfigError, load_config
from workbench.envs import video
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_eval_env
from workbench.training import train
from workbench.training import video as training_video
from workbench.training.trainer import TrainResult

from .conftest import TINY_VIDEO, embedded_store, run_cli

# 2 episodes of 30 rendered steps each (tiny episodes last 50), 128x96 at 15 fps, and one
# video during training every 128 steps (at 128 and 256; the budget, 384, gets the final one).
VIDEO = ["video.episodes=2", "video.max_steps=30", "video.width=128", "video.height=96",
         "video.fps=15", "video.every_steps=128", "tracking.system_metrics=false",
         "env.vec_env=dummy"]  # in-process training copies, so the test can look into them


class TrainingEnvRenderers(BaseCallback):
    """At training end, whether any training env copy ever made an OpenGL renderer."""

    def __init__(self) -> None:
        super().__init__()
        self.viewers: list[object] = []

    def _on_step(self) -> bool:
        return True

    def _on_training_end(self) -> None:
        for env in self.training_env.unwrapped.envs:  # type: ignore[attr-defined]
            self.viewers.append(env.unwrapped.mujoco_renderer.viewer)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    experiments = tmp_path_factory.mktemp("video") / "experiments"
    uri = f"sqlite:///{experiments / 'mlflow.db'}"
    with embedded_store(experiments):
        yield uri


@pytest.fixture(scope="module")
def probe() -> TrainingEnvRenderers:
    return TrainingEnvRenderers()


@pytest.fixture(scope="module")
def trained(store: str, probe: TrainingEnvRenderers) -> TrainResult:
    return train(load_config([*TINY_VIDEO, *VIDEO]), callbacks=[probe])


def download(client: MlflowClient, run_id: str, path: str, tmp_path: Path) -> Path:
    return Path(client.download_artifacts(run_id, path, str(tmp_path)))


def test_tiny_training_logs_a_playable_mp4_and_a_gif_preview(
        trained: TrainResult, store: str, tmp_path: Path) -> None:
    client = MlflowClient(store)
    assert trained.status == "FINISHED" and trained.video == "video/replay.mp4"
    names = {Path(a.path).name for a in client.list_artifacts(trained.run_id, "video")}
    assert names == {"replay.mp4", "replay.gif", "step-000000128.mp4", "step-000000128.gif",
                     "step-000000256.mp4", "step-000000256.gif"}
    mp4 = download(client, trained.run_id, "video/replay.mp4", tmp_path)
    reader = imageio_ffmpeg.read_frames(str(mp4))
    meta = next(reader)
    frames = [np.frombuffer(f, np.uint8).reshape(96, 128, 3) for f in reader]
    assert (meta["codec"], meta["size"], meta["fps"]) == ("h264", (128, 96), 15.0)
    assert len(frames) == 2 * 30  # episodes x max_steps, every frame decodes
    spread = [round(float(f.std()), 1) for f in frames]
    assert min(spread) > 5, spread  # a rendered scene, not a blank frame
    gif = Image.open(download(client, trained.run_id, "video/replay.gif", tmp_path))
    # Half size; 15 fps becomes every 2nd frame (<= 10 fps), each shown 2/15 s, looping.
    assert (gif.format, gif.size, gif.n_frames) == ("GIF", (64, 48), 30)
    assert gif.info["duration"] == pytest.approx(1000 * 2 / 15, abs=10)  # GIF: centiseconds
    assert gif.info["loop"] == 0
    metrics = client.get_run(trained.run_id).data.metrics
    assert metrics["video/frames"] == 60
    assert metrics["video/render_seconds"] == pytest.approx(trained.video_seconds)
    assert trained.video_seconds > 0
    assert math.isfinite(metrics["video/episode_return"])
    history = sorted(client.get_metric_history(trained.run_id, "video/render_seconds"),
                     key=lambda m: m.step)
    assert [m.step for m in history] == [128, 256, 384]  # two during training, then the end
    assert 0 < history[0].value <= history[1].value <= history[2].value  # a running total
    assert "rendering added" in trained.video_line and "60 frames 128x96 at 15 fps" in \
        trained.video_line


def test_only_the_evaluation_env_renders(trained: TrainResult,
                                        probe: TrainingEnvRenderers) -> None:
    # Videos were made during training (every 128 steps) and after it, all in the evaluation
    # env: no training copy ever created an OpenGL context.
    assert trained.video is not None
    assert len(probe.viewers) == 2 and probe.viewers == [None, None]


def test_a_closed_envs_render_context_cannot_blank_the_next_video(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A closed env's MuJoCo render context is freed when the garbage collector gets to it, and
    # frees its framebuffers by id in whatever OpenGL context is current then. The collector
    # is made to run right after the next video's context is made (the worst moment): that
    # video must still show the scene (a notebook's second run, a test session).
    cfg = load_config(TINY_VIDEO)
    spec, settings = EnvSpec.from_config(cfg), video.VideoSettings.from_config(cfg.video)
    def policy(obs: np.ndarray) -> np.ndarray:
        return np.zeros((len(obs), 6), np.float32)

    first = make_eval_env(spec, video=settings)
    assert len(video.record_vec(first, policy, settings).frames) == 20
    first.close()
    cycle: list[object] = [first]  # as in a run: the env is reachable from a reference cycle,
    cycle.append(cycle)  # so only the collector frees it
    del first, cycle
    configure = video.FrameSource.configure_scene
    monkeypatch.setattr(video.FrameSource, "configure_scene",
                        lambda source: (gc.collect(), configure(source)))
    second = make_eval_env(spec, video=settings)
    try:
        frames = video.record_vec(second, policy, settings).frames
    finally:
        second.close()
    spread = [round(float(f.std()), 1) for f in frames]
    assert len(spread) == 20 and min(spread) > 5, spread


def test_the_final_video_stops_at_its_budget_and_says_so() -> None:
    """A short run's video may cost more than its training: it stops once it has taken
    video.max_share of the training time (at least 2 s), and the summary says so."""
    assert training_video.video_budget(0.25, 100.0) == 25.0
    assert training_video.video_budget(0.25, 0.4) == training_video.MIN_VIDEO_SECONDS
    assert training_video.video_budget(None, 100.0) is None
    cfg = load_config(TINY_VIDEO)
    spec, settings = EnvSpec.from_config(cfg), video.VideoSettings.from_config(cfg.video)
    venv = make_eval_env(spec, video=settings)
    try:
        cut = video.record_vec(venv, lambda obs: np.zeros((len(obs), 6), np.float32), settings,
                               budget_s=0.0)
    finally:
        venv.close()
    assert (cut.cut, len(cut.frames), cut.lengths) == (True, 1, [1])
    recorder = training_video.VideoRecorder(load_config(TINY_VIDEO).video, None, "r")
    recorder.max_share, recorder.seconds = 0.25, 3.0
    recorder.final = training_video.RecordedVideo("video/replay.mp4", "video/replay.gif", 40,
                                                  (96, 64), 20.0, 1.0, cut=True)
    assert recorder.summary(4.0).endswith(
        "rendering added 3.0 s, 75% of training time; cut at the video budget (25% of training "
        "time, at least 2 s: video.max_share=null records whole episodes)")
    assert "episode cut" in recorder.summary(4.0)
    # A cut episode's return depends on how loaded the machine was: it is not logged.
    for cut_short, logged in ((True, set()), (False, {"video/episode_return"})):
        shown = dataclasses.replace(recorder.final, cut=cut_short)
        recorder.record = lambda *args, shown=shown, **kw: shown  # type: ignore[method-assign]
        metrics = recorder.record_final(None, None, None, 4.0)
        assert set(metrics) - {"video/render_seconds", "video/frames"} == logged


@pytest.mark.unit
def test_odd_frame_size_is_refused_before_any_run() -> None:
    with pytest.raises(ConfigError, match=r"video.height=95: must be even .*video.height=96"):
        load_config([*TINY_VIDEO, "video.height=95"])
    with pytest.raises(ConfigError, match=r"video.episodes=0: must be in \[1, 10\]"):
        load_config([*TINY_VIDEO, "video.episodes=0"])


def no_gl_run(tmp_path: Path, gl_env: dict[str, str]) -> None:
    """A tiny run with an unusable OpenGL backend: one warning line, FINISHED, no video."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli("train", *TINY_VIDEO, "tracking.system_metrics=false",
                   env={"MLFLOW_TRACKING_URI": uri, "WORKBENCH_EXPERIMENTS": str(tmp_path),
                        **gl_env})
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "no video" in line]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("workbench: warning: no video: ")
    assert "apt-get install libegl1" in warnings[0]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert "none (no OpenGL backend, see the warning above)" in proc.stdout
    run_id = proc.stdout.strip().splitlines()[-1]
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert client.list_artifacts(run_id, "video") == []
    assert "model" in {a.path for a in client.list_artifacts(run_id)}
    assert "video/frames" not in run.data.metrics


def test_no_egl_driver_warns_once_and_the_run_finishes(tmp_path: Path) -> None:
    # libEGL is installed but finds no driver (glvnd reads its vendor list from this file):
    # what a headless server without Mesa's or a GPU's EGL library has.
    no_gl_run(tmp_path, {"MUJOCO_GL": "egl", "__EGL_VENDOR_LIBRARY_FILENAMES": "/nonexistent"})


@pytest.mark.slow
def test_unknown_backend_warns_once_and_the_run_finishes(tmp_path: Path) -> None:
    # MuJoCo itself refuses to import with such a value; the workbench disables OpenGL instead.
    assert "MUJOCO_GL" not in os.environ or os.environ["MUJOCO_GL"] != "none-such"
    no_gl_run(tmp_path, {"MUJOCO_GL": "none-such"})
