"""A run's inputs as MLflow run inputs: the robot description and a pulled Hub dataset.

The manifest's ``inputs`` section (``manifest.json``, :mod:`workbench.tracking.manifest`) is
the full record: every file with its path, SHA-256 and size. This module logs the same inputs
where MLflow shows lineage, as dataset inputs of the run (``run.inputs.dataset_inputs``, the
UI's "Datasets used"), one per input, each a :class:`FileSetDataset` (an MLflow
``MetaDataset``: metadata only, nothing uploaded):

- ``context=robot``: name = the main MJCF file (``gymnasium/envs/mujoco/assets/
  half_cheetah.xml``), source = its ``file://`` location on the machine that trained, digest =
  the combined SHA-256 of all its files;
- ``context=dataset``: name = ``ORG/NAME``, source = the Hub URL of the pinned commit
  (``<endpoint>/datasets/ORG/NAME/tree/<commit>``), digest = the commit.

MLflow keeps at most 36 characters of a digest (``MAX_DATASET_DIGEST_SIZE``), so the digest
holds the first 36 hex digits; the profile (``{"sha256" or "commit": <full value>, "files",
"bytes"}``) and the manifest hold the full values.

Run inputs go through the run's writer (:mod:`workbench.tracking.outbox`), journaled like its
metrics and artifacts: a store that cannot take them when the run starts (down, locked,
refusing) gets them when it is back, or from ``workbench runs sync``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow.data.dataset_source import DatasetSource
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import DatasetInput, InputTag
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from workbench.tracking.outbox import RunWriter
from workbench.tracking.redaction import redact_uri

DIGEST_LENGTH = 36  # MLflow's MAX_DATASET_DIGEST_SIZE
ROBOT_CONTEXT = "robot"
DATASET_CONTEXT = "dataset"


class FileSetDataset(MetaDataset):
    """An MLflow ``MetaDataset`` with a profile: what a set of files amounts to."""

    def __init__(self, source: DatasetSource, name: str, digest: str,
                 profile: Mapping[str, Any]) -> None:
        self._profile = dict(profile)
        super().__init__(source=source, name=name, digest=digest[:DIGEST_LENGTH])

    @property
    def profile(self) -> dict[str, Any]:
        return self._profile

    def to_dict(self) -> dict[str, str]:
        return {**super().to_dict(), "profile": json.dumps(self._profile, sort_keys=True)}


def robot_dataset(robot: Mapping[str, Any], model_path: Path | None) -> FileSetDataset:
    """The ``context=robot`` input from a manifest's ``inputs.robot``."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    uri = (model_path.resolve().as_uri() if model_path is not None
           else f"file:{robot['model']}")
    with warnings.catch_warnings():  # MLflow registers its local source twice and says so
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(uri)
    files = robot["files"]
    profile = {"sha256": robot["sha256"], "env_id": robot["env_id"], "files": len(files),
               "bytes": sum(int(f["size"]) for f in files.values())}
    return FileSetDataset(source, robot["model"], robot["sha256"], profile)


def hub_dataset(dataset: Mapping[str, Any]) -> FileSetDataset:
    """The ``context=dataset`` input from a manifest's ``inputs.dataset``."""
    from mlflow.data.http_dataset_source import HTTPDatasetSource

    files = dataset["files"]
    profile = {"commit": dataset["commit"], "files": len(files),
               "bytes": sum(int(f["size"]) for f in files.values()), "sha256": dataset["sha256"]}
    return FileSetDataset(HTTPDatasetSource(redact_uri(dataset["url"])), dataset["repo_id"],
                          dataset["commit"], profile)


def dataset_inputs(inputs: Mapping[str, Any], model_path: Path | None = None
                   ) -> list[DatasetInput]:
    """MLflow dataset inputs for a manifest's ``inputs`` section (robot, then dataset)."""
    found: list[tuple[MetaDataset, str]] = []
    if inputs.get("robot"):
        found.append((robot_dataset(inputs["robot"], model_path), ROBOT_CONTEXT))
    if inputs.get("dataset"):
        found.append((hub_dataset(inputs["dataset"]), DATASET_CONTEXT))
    return [DatasetInput(dataset._to_mlflow_entity(),
                         tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])
            for dataset, context in found]


def log_run_inputs(writer: RunWriter, run_id: str, inputs: Mapping[str, Any],
                   model_path: Path | None = None) -> None:
    """Log ``inputs`` as the run's MLflow dataset inputs, through the run's writer (journaled:
    a store that is down now gets them later, ``workbench runs sync`` after a crash)."""
    if inputs.get("robot") or inputs.get("dataset"):
        writer.log_inputs(run_id, dataset_inputs(inputs, model_path))
