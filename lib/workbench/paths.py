"""Fixed locations of the project: config, the embedded MLflow store, run outputs.

Keep data, code and outputs in fixed places and never move them mid-training.
Everything is resolved to absolute paths from the project root so a notebook executed by
papermill from any working directory writes to the same store as the CLI.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The checkout holding ``conf/`` (``WORKBENCH_ROOT`` overrides, e.g. for a copied tree)."""
    env = os.environ.get("WORKBENCH_ROOT")
    if env:
        return Path(env).resolve()
    # lib/workbench/paths.py -> project root; the package is installed editable (pip -e).
    return Path(__file__).resolve().parents[2]


def experiments_dir() -> Path:
    """Where runs write: the MLflow store, artifacts, sweeps (``WORKBENCH_EXPERIMENTS``)."""
    env = os.environ.get("WORKBENCH_EXPERIMENTS")
    return Path(env).resolve() if env else project_root() / "experiments"


def default_tracking_uri() -> str:
    """The embedded SQLite store ``experiments/mlflow.db``."""
    return f"sqlite:///{experiments_dir() / 'mlflow.db'}"


def reports_dir() -> Path:
    """Where ``workbench report`` writes ``<name>/`` (``WORKBENCH_REPORTS`` moves it)."""
    env = os.environ.get("WORKBENCH_REPORTS")
    return Path(env).resolve() if env else project_root() / "reports"
