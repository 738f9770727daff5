"""Rollout videos: frames rendered off-screen from one environment copy, encoded as an MP4
(H.264) and a small animated GIF preview.

Training records in its evaluation env (:func:`record_vec`, driven by SB3's deterministic
``predict``), the export in its replay env (:func:`record_episode`, driven by the ONNX
session); both hand each frame to a :class:`VideoEncoder` as it is rendered, which pipes it
to ffmpeg at once and keeps only the GIF preview's frames (at most 100, half size): a video
of any length (``video=hd``: whole episodes at 640x480) holds a bounded amount of memory,
not every frame. Frames come from gymnasium's ``rgb_array``
render mode: for MuJoCo tasks through ``MUJOCO_GL`` (``egl`` or ``osmesa``, chosen by
:func:`workbench.envs.robots.rendering.prefer_offscreen_backend` before the first OpenGL
import); a backend that cannot make a context raises :class:`RenderingUnavailable` at the
first frame, with what to install. The encoder is imageio-ffmpeg's bundled ffmpeg (libx264).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from PIL import Image

from workbench.config import VideoConfig
from workbench.envs import opengl
from workbench.envs.robots.rendering import (
    BACKEND_HINT,
    NotRenderable,
    RenderingUnavailable,
    prefer_offscreen_backend,
    render_or_explain,
)

__all__ = ["NotRenderable", "RenderingUnavailable"]

VIDEO_SUFFIX = ".mp4"
PREVIEW_SUFFIX = ".gif"
DEFAULT_FPS = 30  # tasks that declare no render_fps
PREVIEW_FPS = 10  # the GIF keeps every k-th frame to at most this rate ...
PREVIEW_SECONDS = 10  # ... for at most this long, at half the video's size
CRF = 28  # x264 quality: small files, smooth enough for a robot on a plain floor

Policy = Callable[[np.ndarray], np.ndarray]  # observation batch -> action batch
FrameSink = Callable[[np.ndarray], None]  # receives each frame as it is rendered


@dataclass(frozen=True)
class VideoSettings:
    """Plain values of ``video.*`` that rendering and encoding need."""

    width: int = 320
    height: int = 240
    fps: int | None = None
    episodes: int = 1
    max_steps: int | None = 500
    shadows: bool = False

    @classmethod
    def from_config(cls, video: VideoConfig) -> VideoSettings:
        return cls(width=video.width, height=video.height, fps=video.fps,
                   episodes=video.episodes, max_steps=video.max_steps, shadows=video.shadows)


@dataclass
class Recording:
    """One or more episodes: their frames (kept only when recorded without a sink), what
    they returned, and what recording took."""

    fps: float
    frames: list[np.ndarray] = field(default_factory=list)
    count: int = 0  # frames rendered
    returns: list[float] = field(default_factory=list)  # of the rendered steps, per episode
    lengths: list[int] = field(default_factory=list)
    seconds: float = 0.0  # stepping and rendering (encoding is timed by the caller)
    cut: bool = False  # stopped at the time budget, before its episodes' ends


@dataclass(frozen=True)
class VideoFiles:
    """An encoded recording."""

    video: Path
    preview: Path
    frames: int
    size: tuple[int, int]  # (width, height)
    fps: float


def render_kwargs(env_id: str, settings: VideoSettings) -> dict[str, Any]:
    """``gymnasium.make`` keywords for an env that renders frames; MuJoCo tasks render at the
    configured size (other tasks at theirs, resized on capture)."""
    prefer_offscreen_backend()  # before the first OpenGL import of the process
    if not renders_rgb_array(env_id):
        return {}  # the recording then says why there is no video; the run goes on
    kwargs: dict[str, Any] = {"render_mode": "rgb_array"}
    if is_mujoco(env_id):
        kwargs.update(width=settings.width, height=settings.height)
    elif not os.environ.get("DISPLAY"):
        # Classic control draws with pygame (SDL), which otherwise probes for a window system
        # and prints an error line about it; off-screen frames need none.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    return kwargs


def env_creator(env_id: str) -> Any:
    """The registered entry point of ``env_id`` (``module:Id`` ids: the module registers the
    id, as ``gymnasium.make`` does it), or None for an id ``gymnasium.make`` will reject with
    its own message."""
    from gymnasium.envs.registration import load_env_creator

    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        entry = gymnasium.spec(name).entry_point
        return load_env_creator(entry) if isinstance(entry, str) else entry
    except Exception:
        return None


def is_mujoco(env_id: str) -> bool:
    """True when the registered entry point is a gymnasium ``MujocoEnv``."""
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

    creator = env_creator(env_id)
    return isinstance(creator, type) and issubclass(creator, MujocoEnv)


def renders_rgb_array(env_id: str) -> bool:
    """Whether the env declares ``rgb_array`` among its ``metadata["render_modes"]`` (an env
    that does not may not even accept a ``render_mode`` argument)."""
    creator = env_creator(env_id)
    metadata = getattr(creator, "metadata", None)
    return isinstance(metadata, dict) and "rgb_array" in (metadata.get("render_modes") or ())


class FrameSource:
    """Frames of one gymnasium env at the configured size; the first call makes the OpenGL
    context and raises :class:`RenderingUnavailable` when none can be made."""

    def __init__(self, env: Any, settings: VideoSettings) -> None:
        self.env = env
        self.settings = settings
        self.started = False

    def frame(self) -> np.ndarray:
        if not self.started:
            failure = self.start()
            if failure is not None:
                raise failure
        image = np.asarray(render_or_explain(self.env.render))
        if image.ndim != 3 or image.shape[2] < 3:
            raise RenderingUnavailable(f"render returned an array of shape {image.shape}, "
                                       "not RGB frames")
        image = np.ascontiguousarray(image[:, :, :3], dtype=np.uint8)
        size = (self.settings.width, self.settings.height)
        if (image.shape[1], image.shape[0]) != size:  # a task without a size option
            image = np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BILINEAR))
        return image

    def start(self) -> RenderingUnavailable | None:
        """Make the OpenGL context (the first frame, dropped); why it failed, or None.

        A renderer whose context failed half-way complains again from ``__del__`` when it
        is collected, which happens once the failure's traceback is gone: here, with such
        messages dropped, so the run prints one line about it and not a traceback.
        """
        if opengl.unusable() is not None:
            return RenderingUnavailable(f"{opengl.unusable()}; {BACKEND_HINT}")
        # A closed env's MuJoCo render context (gymnasium frees its OpenGL context on close,
        # its MjrContext only when collected) deletes its framebuffers by id in whatever
        # context is current when it is collected: ours would then render black frames. So
        # what is already garbage goes now, before this context exists.
        gc.collect()
        previous = sys.unraisablehook
        sys.unraisablehook = lambda _: None
        try:
            try:
                render_or_explain(self.env.render)
            except RenderingUnavailable as exc:
                failure: RenderingUnavailable | None = type(exc)(str(exc))  # no traceback
            else:
                failure = None
            gc.collect()
        finally:
            sys.unraisablehook = previous
        self.configure_scene()
        self.started = failure is None
        return failure

    def configure_scene(self) -> None:
        """Shadows and reflections off unless asked for: on a software renderer they take
        most of the frame's time (docs/benchmarks/costs.md#rollout-videos)."""
        if self.settings.shadows:
            return
        import mujoco

        renderer = getattr(self.env.unwrapped, "mujoco_renderer", None)
        viewer = getattr(renderer, "viewer", None)
        scene = getattr(viewer, "scn", None)
        if scene is None:
            return
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION):
            scene.flags[flag] = 0


def frame_rate(env: Any, settings: VideoSettings) -> float:
    """The configured fps, else the task's real time (``render_fps``), else 30."""
    if settings.fps:
        return float(settings.fps)
    declared: Any = (getattr(env.unwrapped, "metadata", None) or {}).get("render_fps")
    try:
        fps = float(declared)
    except (TypeError, ValueError):
        return float(DEFAULT_FPS)
    return fps if math.isfinite(fps) and fps > 0 else float(DEFAULT_FPS)


def rendering_env(venv: Any) -> Any:
    """The single gymnasium env inside an evaluation VecEnv (DummyVecEnv of one copy)."""
    inner = venv.unwrapped
    envs = getattr(inner, "envs", None)
    if not envs or len(envs) != 1:
        raise RenderingUnavailable("video needs an in-process evaluation env of one copy")
    check_renders(envs[0])
    return envs[0]


def check_renders(env: Any) -> None:
    """:class:`NotRenderable` unless ``env`` renders ``rgb_array`` frames (an env whose
    ``metadata["render_modes"]`` lacks it is built without a render mode, see
    :func:`render_kwargs`)."""
    if getattr(env, "render_mode", None) == "rgb_array":
        return
    spec = getattr(env, "spec", None)
    name = getattr(spec, "id", None) or type(getattr(env, "unwrapped", env)).__name__
    modes = list((getattr(getattr(env, "unwrapped", env), "metadata", None) or {})
                 .get("render_modes") or [])
    if "rgb_array" in modes:
        raise NotRenderable(f"{name} was built without render_mode='rgb_array', so it gives "
                            "no frames to record")
    raise NotRenderable(f"{name} has no rendering (its metadata's render_modes {modes} have "
                        "no rgb_array), so it gives no frames to record")


def record_vec(venv: Any, policy: Policy, settings: VideoSettings,
               sink: FrameSink | None = None, budget_s: float | None = None) -> Recording:
    """``settings.episodes`` episodes of ``policy`` in the evaluation VecEnv ``venv``, each
    stopped after ``settings.max_steps`` steps; one frame before every step, handed to
    ``sink`` (a :class:`VideoEncoder`) as it comes, else kept in the recording. Recording
    stops (``cut``) once it has taken ``budget_s`` seconds, after at least one frame."""
    started = time.perf_counter()
    env = rendering_env(venv)
    source = FrameSource(env, settings)
    recording = Recording(fps=frame_rate(env, settings))
    keep = frame_sink(recording, sink)
    limit = settings.max_steps or math.inf
    deadline = math.inf if budget_s is None else started + budget_s
    obs = venv.reset()
    for _ in range(settings.episodes):
        total, steps, done = 0.0, 0, False
        while not done and steps < limit:
            if steps and time.perf_counter() > deadline:
                recording.cut = True
                break
            keep(source.frame())
            obs, reward, dones, _ = venv.step(policy(obs))
            total += float(reward[0])
            steps += 1
            done = bool(dones[0])  # the VecEnv has reset itself for the next episode
        if not done:
            obs = venv.reset()
        recording.returns.append(total)
        recording.lengths.append(steps)
        if recording.cut:
            break
    recording.seconds = time.perf_counter() - started
    return recording


def record_episode(env: Any, policy: Policy, seed: int, settings: VideoSettings,
                   sink: FrameSink | None = None) -> Recording:
    """One seeded episode of ``policy`` in a raw gymnasium ``env`` (the export's replay);
    frames as :func:`record_vec` handles them."""
    started = time.perf_counter()
    check_renders(env)
    source = FrameSource(env, settings)
    recording = Recording(fps=frame_rate(env, settings))
    keep = frame_sink(recording, sink)
    limit = settings.max_steps or math.inf
    obs, _ = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while not done and steps < limit:
        keep(source.frame())
        obs, reward, terminated, truncated, _ = env.step(policy(obs[None])[0])
        total += float(reward)
        steps += 1
        done = bool(terminated or truncated)
    recording.returns.append(total)
    recording.lengths.append(steps)
    recording.seconds = time.perf_counter() - started
    return recording


def frame_sink(recording: Recording, sink: FrameSink | None) -> FrameSink:
    """What a recorder calls with each frame: ``sink`` (counted), else the recording's list."""
    def keep(frame: np.ndarray) -> None:
        recording.count += 1
        if sink is None:
            recording.frames.append(frame)
        else:
            sink(frame)

    return keep


class VideoEncoder:
    """``<stem>.mp4`` (H.264, yuv420p: plays in browsers, MLflow's UI and the Hub) and
    ``<stem>.gif`` (half size, <= 10 fps, <= 10 s) in ``folder``, from frames given one at
    a time (:meth:`add`, a :data:`FrameSink`).

    Each frame goes to ffmpeg's stdin as it comes (imageio-ffmpeg's ``write_frames``
    generator, started at the first frame, whose size it takes); only the preview's frames
    are kept, already halved. :meth:`close` finishes both files; :meth:`abort` stops ffmpeg
    when the recording failed.
    """

    def __init__(self, folder: Path, stem: str, fps: float) -> None:
        self.video = folder / f"{stem}{VIDEO_SUFFIX}"
        self.preview_path = folder / f"{stem}{PREVIEW_SUFFIX}"
        self.fps = fps
        self.every = max(1, math.ceil(fps / PREVIEW_FPS))  # the GIF's k-th frames
        self.preview: list[Image.Image] = []
        self.frames = 0
        self.size = (0, 0)
        self.writer: Any = None

    def add(self, frame: np.ndarray) -> None:
        """Encode one RGB frame (uint8, height x width x 3)."""
        if self.writer is None:
            self.start(frame)
        self.writer.send(frame)
        if self.frames % self.every == 0 and len(self.preview) < PREVIEW_SECONDS * PREVIEW_FPS:
            width, height = self.size
            self.preview.append(Image.fromarray(frame).resize(
                (max(2, width // 2), max(2, height // 2)), Image.Resampling.BILINEAR))
        self.frames += 1

    def start(self, frame: np.ndarray) -> None:
        import imageio_ffmpeg

        self.video.parent.mkdir(parents=True, exist_ok=True)
        height, width = frame.shape[:2]
        self.size = (width, height)
        self.writer = imageio_ffmpeg.write_frames(
            str(self.video), self.size, fps=self.fps, codec="libx264", pix_fmt_in="rgb24",
            pix_fmt_out="yuv420p", quality=None, macro_block_size=2, ffmpeg_log_level="error",
            output_params=["-crf", str(CRF), "-preset", "veryfast", "-movflags", "+faststart"],
        )
        self.writer.send(None)  # the generator starts ffmpeg here

    def close(self) -> VideoFiles:
        """Finish the MP4 (ffmpeg flushes and exits) and write the GIF."""
        if self.writer is None:
            raise ValueError("no frames to encode")
        self.writer.close()
        self.writer = None
        duration_ms = round(1000 * self.every / self.fps)
        self.preview[0].save(self.preview_path, save_all=True, append_images=self.preview[1:],
                             duration=duration_ms, loop=0, optimize=True)
        return VideoFiles(video=self.video, preview=self.preview_path, frames=self.frames,
                          size=self.size, fps=self.fps)

    def abort(self) -> None:
        """Stop ffmpeg without a preview (the recording failed); no-op once closed."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


@contextlib.contextmanager
def encoding(folder: Path, stem: str, fps: float) -> Iterator[VideoEncoder]:
    """A :class:`VideoEncoder` for a recording; ffmpeg is stopped if the block fails (the
    caller closes it after the block)."""
    encoder = VideoEncoder(folder, stem, fps)
    try:
        yield encoder
    except BaseException:
        encoder.abort()
        raise


def write_video(recording: Recording, folder: Path, stem: str) -> VideoFiles:
    """Encode a recording whose frames were kept in memory (:class:`VideoEncoder`)."""
    encoder = VideoEncoder(folder, stem, recording.fps)
    for frame in recording.frames:
        encoder.add(frame)
    return encoder.close()


def probe(path: Path) -> dict[str, Any]:
    """What a decoder reads from an MP4: codec, size, fps and the frame count (all decoded)."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    meta: dict[str, Any] = dict(next(reader))
    meta["frames"] = sum(1 for _ in reader)
    return meta
