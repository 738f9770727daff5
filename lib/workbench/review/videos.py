"""The report's rollout videos: each point's best seed, as the run logged it (``video/``).

The MP4 is embedded in the page as a ``data:`` URI in a ``<video>`` element (no script, nothing
fetched); ``report.md`` shows the GIF preview and links the MP4, both written next to it.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from workbench.console import printable

VIDEO_ARTIFACT = "video/replay.mp4"  # training/video.py's final video and its preview
PREVIEW_ARTIFACT = "video/replay.gif"
MAX_EMBED_BYTES = 8 * 2**20  # per video; a larger one is listed, not embedded
UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class PointVideo:
    """The final video of one point's best seed."""

    point: str  # the point's label
    run_name: str
    run_id: str
    final_reward: float  # the run's final deterministic evaluation
    episode_return: float  # of the recorded episode (its rendered steps)
    mp4: bytes
    gif: bytes

    @property
    def stem(self) -> str:
        """A file name for the Markdown version: ``video-<run name>-<run id>``, safe characters
        only (a run name comes from the store)."""
        name = UNSAFE_NAME.sub("_", self.run_name).strip("._") or "run"
        return f"video-{name}-{UNSAFE_NAME.sub('', self.run_id)[:12]}"

    @property
    def caption(self) -> str:
        shown = "–" if math.isnan(self.episode_return) else f"{self.episode_return:.1f}"
        return (f"{self.point}: best seed {self.run_name}, final evaluation "
                f"{self.final_reward:.1f}; the recorded episode returned {shown}")


def video_html(video: PointVideo) -> str:
    """A ``<figure>`` with the embedded MP4 (plays inline, muted, on a loop)."""
    data = base64.b64encode(video.mp4).decode("ascii")
    title, caption = html.escape(printable(video.run_name)), html.escape(printable(video.caption))
    return (f'<figure class="video"><video controls loop muted playsinline preload="metadata" '
            f'src="data:video/mp4;base64,{data}" title="{title}"></video>'
            f"<figcaption>{caption}</figcaption></figure>")


class RunLike(Protocol):
    """What is read of a run (:class:`workbench.review.records.RunRecord`)."""

    run_id: str
    name: str

    @property
    def final_reward(self) -> float: ...

    def last(self, key: str) -> float: ...


class PointLike(Protocol):
    """What is read of a grid point (:class:`workbench.review.records.Point`)."""

    label: str

    @property
    def runs(self) -> Sequence[RunLike]: ...


def point_videos(client: Any, points: Sequence[PointLike]) -> list[PointVideo]:
    """The final video of each point's best seed (highest final reward) that has one."""
    shown = []
    for point in points:
        ranked = sorted((r for r in point.runs if math.isfinite(r.final_reward)),
                        key=lambda r: -r.final_reward)
        for run in ranked:
            media = load_video(client, run.run_id)
            if media is not None:
                shown.append(PointVideo(point.label, run.name, run.run_id, run.final_reward,
                                        run.last("video/episode_return"), *media))
                break
    return shown


def load_video(client: Any, run_id: str) -> tuple[bytes, bytes] | None:
    """The run's final MP4 and GIF preview, or None (no video, too large or unreadable)."""
    listed = {a.path: a.file_size for a in client.list_artifacts(run_id, "video")}
    if VIDEO_ARTIFACT not in listed or PREVIEW_ARTIFACT not in listed:
        return None
    if (listed[VIDEO_ARTIFACT] or 0) > MAX_EMBED_BYTES:
        return None
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"  # no bar per file; an explicit setting wins
    chosen = key in os.environ
    os.environ.setdefault(key, "false")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            mp4, gif = (Path(client.download_artifacts(run_id, name, tmp)).read_bytes()
                        for name in (VIDEO_ARTIFACT, PREVIEW_ARTIFACT))
    except OSError:
        return None
    finally:
        if not chosen:
            os.environ.pop(key, None)
    return mp4, gif
