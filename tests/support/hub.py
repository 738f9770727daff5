"""A Hugging Face Hub cache written offline, and the settings that make the Hub client use it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import huggingface_hub.constants
import pytest


def populate_cache(cache: Path, repo_id: str, files: dict[str, bytes],
                   refs: dict[str, str] | None = None, repo_type: str = "model") -> str:
    """Write ``files`` as one commit of ``repo_id`` (a ``repo_type`` repository: model or
    dataset) into a Hub cache; returns the commit."""
    commit = hashlib.sha1(b"".join(n.encode() + files[n] for n in sorted(files))).hexdigest()
    storage = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    for name, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = storage / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref, target in (refs or {}).items():
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / ref).write_text(target.replace("HEAD", commit))
    return commit


def offline_cache(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """HF_HUB_OFFLINE=1 and a cache dir for in-process calls (huggingface_hub reads both
    environment variables once, at import, into ``huggingface_hub.constants``)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
