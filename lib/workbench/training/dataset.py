"""``init.dataset=ORG/NAME@COMMIT``: a Hugging Face Hub dataset pulled at a pinned commit
before training, checked as data, and made available to the run.

The value is checked when the config is (``workbench.config.checks.check_dataset``: a branch or
tag name, a short sha or a malformed value is one line, exit code 2, before any run exists).
:func:`pull_dataset` then downloads exactly that commit (``snapshot_download(repo_type=
"dataset", revision=<commit>)``; ``HF_HUB_OFFLINE=1`` uses the local Hub cache only) and holds
it to the same data-only rules as a policy bundle (:mod:`workbench.training.bundle_format`):

- only data files are fetched and kept: the kinds in :data:`DATA_SUFFIXES` (tables, arrays,
  text, images, video, meshes); a pickle, a checkpoint, a script or a notebook never reaches
  this machine, and a cached snapshot holding one is refused by name;
- ``.npy``/``.npz`` arrays must not hold Python objects (those load through pickle);
- every path is plain (each part a plain file name, no hidden files, at most
  :data:`MAX_DEPTH` folders deep), every cache entry a file inside the repository's own cache
  folder; sizes are bounded (:data:`MAX_FILE_BYTES` a file, :data:`MAX_TOTAL_BYTES` in all,
  :data:`MAX_FILES` files).

A checked commit is copied into ``experiments/datasets/<org>/<name>/<commit>/`` (regular files,
installed by a rename, so a refused pull leaves nothing), with ``<commit>.sha256`` beside it
listing every file; a later run of the same commit checks the folder against that list, so a
changed or added file is caught. The run reads its data there: the folder is the environment
variable ``WORKBENCH_DATASET_DIR`` while the run trains (:func:`dataset_environment`), and it
is recorded in the manifest's ``inputs.dataset`` with every file's SHA-256 and as the run's
MLflow input of context ``dataset`` (:mod:`workbench.tracking.inputs`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench import paths
from workbench.config import ConfigError
from workbench.config.checks import check_dataset
from workbench.envs.robot_files import InputFile, combined_sha256, file_sha256
from workbench.training.bundle import check_repo_id
from workbench.training.bundle_format import COMMIT_SHA, FILE_NAME, HUB_FILES

DATASET_DIR_VARIABLE = "WORKBENCH_DATASET_DIR"
# The kinds of file a dataset may hold: data that is read, never run or unpickled.
DATA_SUFFIXES = (
    ".parquet", ".arrow", ".csv", ".tsv", ".json", ".jsonl", ".txt", ".md", ".yaml", ".yml",
    ".npy", ".npz", ".safetensors", ".h5", ".hdf5", ".png", ".jpg", ".jpeg", ".mp4", ".xml",
    ".stl", ".obj",
)
MAX_FILES = 10_000
MAX_FILE_BYTES = 4 << 30
MAX_TOTAL_BYTES = 32 << 30
MAX_DEPTH = 8  # folders below the dataset's root
MAX_NPZ_MEMBERS = 256
INDEX_SUFFIX = ".sha256"


@dataclass(frozen=True)
class PulledDataset:
    """A checked dataset commit in its fixed local folder, every file hashed."""

    repo_id: str
    commit: str
    directory: Path
    files: tuple[InputFile, ...]  # paths relative to ``directory``, sorted

    @property
    def url(self) -> str:
        """The commit's page on the Hub (``HF_ENDPOINT`` where one is set)."""
        from huggingface_hub import constants

        return f"{constants.ENDPOINT}/datasets/{self.repo_id}/tree/{self.commit}"

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's ``inputs.dataset``."""
        return {
            "repo_id": self.repo_id,
            "commit": self.commit,
            "url": self.url,
            "sha256": combined_sha256(self.files),
            "local_dir": str(self.directory),
            "files": {f.path: {"sha256": f.sha256, "size": f.size} for f in self.files},
        }


def dataset_directory(repo_id: str, commit: str) -> Path:
    """``experiments/datasets/<org>/<name>/<commit>``: where a pulled commit is kept."""
    return paths.experiments_dir() / "datasets" / repo_id / commit


# --------------------------------------------------------------------------- pulling


def pull_for_run(value: str | None) -> PulledDataset | None:
    """The dataset ``init.dataset`` names, pulled and checked; None without one."""
    if not value:
        return None
    repo_id, commit = check_dataset(value)
    dataset = pull_dataset(repo_id, commit)
    print(f"init: dataset {repo_id}@{commit} ({len(dataset.files)} files, {dataset.directory})")
    return dataset


def pull_dataset(repo_id: str, commit: str) -> PulledDataset:
    """Exactly ``commit`` of the Hub dataset ``repo_id``, checked, in its local folder.

    Raises :class:`ConfigError` (one line, exit code 2) for anything that is not a pinned,
    reachable, data-only dataset.
    """
    label = f"init.dataset={repo_id}@{commit}"
    directory = dataset_directory(repo_id, commit)
    index = directory.with_name(commit + INDEX_SUFFIX)
    if directory.is_dir() and index.is_file():
        files = check_folder(directory, label)
        if index_text(files) != index.read_text():
            raise ConfigError(f"{label}: {directory} differs from the commit pulled into it "
                              f"({index.name} lists other files or hashes); delete that folder "
                              "to pull it afresh")
        return PulledDataset(repo_id, commit, directory, files)
    snapshot = download(repo_id, commit, label)
    entries = snapshot_entries(snapshot, label)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{commit}.", dir=directory.parent))
    try:
        for relative, source in entries.items():
            target = staged / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        files = check_folder(staged, label)
        install(staged, directory, index)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    if not index.is_file():
        index.write_text(index_text(files))
    return PulledDataset(repo_id, commit, directory, files)


def install(staged: Path, directory: Path, index: Path) -> None:
    """Move a checked staged copy to its fixed folder (a rename). A folder without its index
    is an unfinished earlier pull and is replaced; one with its index was installed by a
    concurrent pull of the same commit, and is kept."""
    if directory.is_dir() and not index.is_file():
        shutil.rmtree(directory, ignore_errors=True)
    try:
        staged.rename(directory)
    except OSError:
        if not directory.is_dir():
            raise


def download(repo_id: str, commit: str, label: str) -> Path:
    """The commit's snapshot folder in the local Hub cache (only data files are fetched)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    check_repo_id(repo_id)
    patterns = [f"*{suffix}" for suffix in DATA_SUFFIXES]
    try:
        snapshot = Path(snapshot_download(repo_id, repo_type="dataset", revision=commit,
                                          allow_patterns=patterns))
    except RevisionNotFoundError as exc:
        raise ConfigError(f"{label}: no such commit in the dataset {repo_id}; pin a commit "
                          "from its history on the Hub") from exc
    except RepositoryNotFoundError as exc:
        raise ConfigError(f"{label}: no such dataset repository on the Hub (or no access: "
                          "log in with `hf auth login` or set HF_TOKEN)") from exc
    except LocalEntryNotFoundError as exc:
        mode = "HF_HUB_OFFLINE=1" if constants.HF_HUB_OFFLINE else "the Hub is unreachable"
        raise ConfigError(f"{label}: not (completely) in the local Hub cache "
                          f"({constants.HF_HUB_CACHE}) and {mode}; pull it once with network "
                          "access") from exc
    if snapshot.name != commit or not COMMIT_SHA.fullmatch(snapshot.name):
        raise ConfigError(f"{label}: {snapshot} is not that commit's snapshot in the Hub cache; "
                          "check the local Hub cache")
    return snapshot


# --------------------------------------------------------------------------- checking


def snapshot_entries(snapshot: Path, label: str) -> dict[str, Path]:
    """The snapshot's data files (relative path -> resolved blob), each checked; the cache's
    links must stay inside the repository's own cache folder."""
    blobs = snapshot.parent.parent.resolve()
    found: dict[str, Path] = {}
    for relative, path in walk(snapshot, label):
        resolved = path.resolve()
        if not resolved.is_relative_to(blobs) or not resolved.is_file():
            raise ConfigError(f"{label}: {relative} points outside the dataset's cache folder "
                              f"({resolved}); check the local Hub cache")
        found[relative] = resolved
    check_sizes({r: p.stat().st_size for r, p in found.items()}, label)
    return found


def check_folder(directory: Path, label: str) -> tuple[InputFile, ...]:
    """A dataset folder of regular data files, each checked and hashed (sorted by path)."""
    files: list[InputFile] = []
    sizes: dict[str, int] = {}
    for relative, path in walk(directory, label):
        if path.is_symlink() or not path.is_file():
            raise ConfigError(f"{label}: {relative} is not a regular file; a dataset folder "
                              "holds only the files pulled into it (delete it to pull afresh)")
        sizes[relative] = path.stat().st_size
    check_sizes(sizes, label)
    for relative in sorted(sizes):
        path = directory / relative
        if path.suffix.lower() in (".npy", ".npz"):
            check_arrays(path, relative, label)
        files.append(InputFile(relative, file_sha256(path), sizes[relative]))
    return tuple(files)


def walk(root: Path, label: str) -> Iterator[tuple[str, Path]]:
    """Every file below ``root`` as (relative posix path, path), names and kinds checked;
    links to folders are not followed (and refused: a folder is a plain folder)."""
    count = 0
    for folder, folders, names in os.walk(root, followlinks=False):
        here = Path(folder)
        depth = len(here.relative_to(root).parts)
        for name in folders:
            relative = (here / name).relative_to(root).as_posix()
            if (here / name).is_symlink() or not FILE_NAME.fullmatch(name):
                raise ConfigError(f"{label}: folder {relative!r} is not a plain folder name; "
                                  "a dataset holds plain folders and data files only")
            if depth + 1 > MAX_DEPTH:
                raise ConfigError(f"{label}: {relative} is nested more than {MAX_DEPTH} "
                                  "folders deep")
        folders.sort()
        for name in sorted(names):
            if depth == 0 and name in HUB_FILES:
                continue
            relative = (here / name).relative_to(root).as_posix()
            check_name(relative, name, label)
            count += 1
            if count > MAX_FILES:
                raise ConfigError(f"{label}: more than {MAX_FILES} files; a dataset for a run "
                                  "holds fewer, larger files (e.g. parquet shards)")
            yield relative, here / name


def check_name(relative: str, name: str, label: str) -> None:
    """A plain file name of an allowed data kind."""
    if not FILE_NAME.fullmatch(name):
        raise ConfigError(f"{label}: {relative!r} is not a plain file name; a dataset holds "
                          "plain names only")
    if not name.lower().endswith(DATA_SUFFIXES):
        raise ConfigError(f"{label}: {relative} is not a data file (allowed: "
                          f"{' '.join(DATA_SUFFIXES)}); a dataset for training holds data "
                          "only, never code, pickles or checkpoints")


def check_sizes(sizes: dict[str, int], label: str) -> None:
    """Each file and all together within :data:`MAX_FILE_BYTES` / :data:`MAX_TOTAL_BYTES`."""
    for relative, size in sizes.items():
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{label}: {relative} is {size} bytes, more than the "
                              f"{MAX_FILE_BYTES} a dataset file may have")
    total = sum(sizes.values())
    if total > MAX_TOTAL_BYTES:
        raise ConfigError(f"{label}: {total} bytes in all, more than the {MAX_TOTAL_BYTES} a "
                          "dataset may have")


def check_arrays(path: Path, relative: str, label: str) -> None:
    """A ``.npy`` file or every member of a ``.npz`` holds no Python objects (read from the
    headers only: nothing is loaded, nothing unpickled)."""
    try:
        if path.suffix.lower() == ".npy":
            with path.open("rb") as handle:
                headers = [array_header(handle)]
        else:
            with zipfile.ZipFile(path) as archive:
                members = archive.infolist()
                if len(members) > MAX_NPZ_MEMBERS:
                    raise ValueError(f"more than {MAX_NPZ_MEMBERS} arrays")
                headers = []
                for member in members:
                    with archive.open(member) as handle:
                        headers.append(array_header(handle))
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{label}: {relative} is not a readable NumPy file ({exc})") from exc
    if any(dtype.hasobject for dtype in headers):
        raise ConfigError(f"{label}: {relative} holds Python objects, which load through "
                          "pickle; a dataset holds plain numeric or string arrays only")


def array_header(handle: Any) -> np.dtype[Any]:
    """The dtype in a ``.npy`` header."""
    version = np.lib.format.read_magic(handle)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    _, _, dtype = read(handle)
    return dtype


def index_text(files: tuple[InputFile, ...]) -> str:
    """``sha256sum`` lines of the files (what ``<commit>.sha256`` holds)."""
    return "".join(f"{f.sha256}  {f.path}\n" for f in files)


# --------------------------------------------------------------------------- the run's view


@contextlib.contextmanager
def dataset_environment(dataset: PulledDataset | None) -> Iterator[None]:
    """``WORKBENCH_DATASET_DIR`` = the dataset's folder while the block runs (untouched
    without a dataset), then as it was.

    Subprocess env workers are forked from multiprocessing's forkserver, which keeps the
    environment it started with: a running one is stopped when the variable changes (at the
    start and at the end of the block), so every run's workers start from a server that
    sees that run's value.
    """
    if dataset is None:
        yield
        return
    previous = os.environ.get(DATASET_DIR_VARIABLE)
    changed = previous != str(dataset.directory)
    os.environ[DATASET_DIR_VARIABLE] = str(dataset.directory)
    if changed:
        restart_forkserver()
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(DATASET_DIR_VARIABLE, None)
        else:
            os.environ[DATASET_DIR_VARIABLE] = previous
        if changed:  # a later run's workers must not see this run's folder
            restart_forkserver()


def restart_forkserver() -> None:
    """Stop multiprocessing's forkserver if one runs (the next SubprocVecEnv starts a fresh
    one with this process's environment); CPython's own shutdown hook, as
    :func:`workbench.envs.cores.stop_worker_servers` uses it."""
    import multiprocessing.forkserver as forkserver

    server: Any = forkserver._forkserver  # type: ignore[attr-defined]
    if getattr(server, "_forkserver_pid", None) is not None:
        with contextlib.suppress(Exception):
            server._stop()
