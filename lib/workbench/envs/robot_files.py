"""The robot description a run's environment loads: its MJCF file and every file it uses.

A run's results depend on the model as much as on the code: a changed mesh, a heavier link in
an included file or another height field changes what was learned. :func:`robot_files` finds
the MJCF file of a run's env (the ``fullpath`` gymnasium's ``MujocoEnv`` loaded, or a
``model_path`` attribute of the unwrapped env), follows its ``<include file=...>`` elements
and collects every file the model names with a ``file`` attribute (meshes, skins and height
fields under ``<compiler meshdir>``, textures and cube-map faces under ``texturedir``, both
defaulting to ``assetdir``; ``strippath`` honoured; an asset ``<model>`` file as it is),
each with its SHA-256 and size. The training records them as the run's inputs
(``manifest.json``'s ``inputs.robot`` and an MLflow run input of context ``robot``,
:mod:`workbench.tracking.inputs`).

A robot file is read as data: parsed with the standard library's ElementTree (no external
entities, no DTD fetching; expat bounds entity expansion), each XML file at most
:data:`MAX_XML_BYTES`, at most :data:`MAX_FILES` files. A path that leaves the model's folder
(``../``, an absolute path, a link pointing elsewhere) is refused in one line (exit code 2)
before the run exists: whatever a model uses must sit under its folder, so that the folder
is the whole robot.

Paths are recorded relative to a root that means the same on every machine: the folder above
the top-level Python package holding the model (``gymnasium/envs/mujoco/assets/
half_cheetah.xml``, ``workbench/envs/robots/assets/mini_duck.xml``), else the project root,
else the model's own folder (its name first).
"""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench import paths
from workbench.config import ConfigError
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env

MAX_XML_BYTES = 16 << 20  # one MJCF file; gymnasium's largest (humanoid) is ~9 KiB
MAX_FILES = 4096  # files of one model, includes and assets together
# Elements whose ``file``-like attributes name an asset, and the compiler folder they are
# resolved against (MuJoCo's XML reference: meshdir holds meshes, skins and height fields;
# an asset ``<model>``, a sub-model, is recorded as a file of its own, relative to the model).
ASSET_FOLDERS = {"mesh": "meshdir", "skin": "meshdir", "hfield": "meshdir",
                 "texture": "texturedir", "model": ""}
TEXTURE_ATTRIBUTES = ("file", "fileright", "fileleft", "fileup", "filedown", "filefront",
                      "fileback")


@dataclass(frozen=True)
class InputFile:
    """One file a run read: its path (relative to the recorded root), SHA-256 and size."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class RobotFiles:
    """The MJCF model of an env and every file it uses, hashed."""

    env_id: str
    model: str  # the main MJCF file, relative to the root
    files: tuple[InputFile, ...]  # the model first, then the others by path
    location: Path  # the main MJCF file on this machine (the MLflow input's source)

    @property
    def sha256(self) -> str:
        """One digest of the whole robot: SHA-256 of ``sha256sum``-style lines, by path."""
        return combined_sha256(self.files)

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's ``inputs.robot``: env id, model, combined digest, files by path."""
        return {
            "env_id": self.env_id,
            "model": self.model,
            "sha256": self.sha256,
            "files": {f.path: {"sha256": f.sha256, "size": f.size} for f in self.files},
        }


def combined_sha256(files: tuple[InputFile, ...] | list[InputFile]) -> str:
    """SHA-256 over ``<sha256>  <path>`` lines sorted by path (what ``sha256sum`` prints):
    any changed, added, removed or renamed file changes it."""
    lines = "".join(f"{f.sha256}  {f.path}\n" for f in sorted(files, key=lambda f: f.path))
    return hashlib.sha256(lines.encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


# --------------------------------------------------------------------------- the env's model


def robot_files(spec: EnvSpec) -> RobotFiles | None:
    """The model files of ``spec``'s env, hashed; None for an env without an MJCF file
    (CartPole, Pendulum...). Builds one copy of the env to ask it (MuJoCo compiles the
    model in milliseconds) and closes it."""
    env = make_env(spec)
    try:
        model = model_file(env)
    finally:
        env.close()
    return None if model is None else collect(model, spec.env_id)


def model_file(env: Any) -> Path | None:
    """The MJCF file an env loaded: ``fullpath`` (gymnasium's ``MujocoEnv``) or
    ``model_path`` of the unwrapped env; None when it has neither (not a MuJoCo env)."""
    unwrapped = getattr(env, "unwrapped", env)
    for name in ("fullpath", "model_path"):
        value = getattr(unwrapped, name, None)
        if isinstance(value, str | Path) and str(value).endswith((".xml", ".mjcf")):
            return Path(value).expanduser().resolve()
    return None


# --------------------------------------------------------------------------- the files


def collect(model: Path, env_id: str) -> RobotFiles:
    """Every file of the MJCF model ``model``, hashed; :class:`ConfigError` (one line) for
    a file that leaves the model's folder, is missing or is not readable XML."""
    model = model.resolve()
    folder = model.parent
    found: list[Path] = [model]
    trees = _read_models(model, folder, env_id, found)
    compiler = _compiler([tree for _, tree in trees])
    for source, tree in trees:
        for element in tree.iter():
            where = ASSET_FOLDERS.get(str(element.tag))
            if where is None:
                continue
            names = TEXTURE_ATTRIBUTES if element.tag == "texture" else ("file",)
            base = (compiler.get(where) or compiler.get("assetdir") or "") if where else ""
            for attribute in names:
                value = element.get(attribute)
                if value:
                    name = Path(value).name if compiler.get("strippath") == "true" else value
                    _add(found, _confined(folder, base, name, source, env_id), env_id)
    root = display_root(folder)
    files = [InputFile(path.relative_to(root).as_posix(), file_sha256(path),
                       path.stat().st_size) for path in found]
    return RobotFiles(env_id, files[0].path,
                      (files[0], *sorted(files[1:], key=lambda f: f.path)), model)


def _read_models(model: Path, folder: Path, env_id: str, found: list[Path]
                 ) -> list[tuple[Path, ElementTree.Element]]:
    """The parsed main file and, transitively, every file it includes (each once), with
    their paths."""
    trees: list[tuple[Path, ElementTree.Element]] = []
    todo = [model]
    while todo:
        path = todo.pop(0)
        tree = _parse(path, folder, env_id)
        trees.append((path, tree))
        for element in tree.iter("include"):
            if element.get("file"):
                included = _included(folder, str(element.get("file")), path, env_id)
                if included not in found:
                    _add(found, included, env_id)
                    todo.append(included)
    return trees


def _parse(path: Path, folder: Path, env_id: str) -> ElementTree.Element:
    """One MJCF file as an element tree, read as bounded data."""
    shown = _shown(path, folder)
    size = path.stat().st_size
    if size > MAX_XML_BYTES:
        raise ConfigError(f"env.id={env_id}: robot file {shown} is {size} bytes, more than "
                          f"the {MAX_XML_BYTES} an MJCF file may have here; split it with "
                          "<include>")
    try:
        return ElementTree.fromstring(path.read_bytes())
    except ElementTree.ParseError as exc:
        raise ConfigError(f"env.id={env_id}: robot file {shown} is not readable XML ({exc}); "
                          "fix the file") from None


def _included(folder: Path, name: str, referrer: Path, env_id: str) -> Path:
    """An ``<include>``d file: relative to the main model's folder (MuJoCo's rule), else to
    the including file's folder (a nested include written relative to its own file)."""
    nested = (referrer.parent / name).resolve()
    if not (folder / name).resolve().is_file() and nested.is_file():
        return _confined(referrer.parent, "", name, referrer, env_id, folder)
    return _confined(folder, "", name, referrer, env_id)


def _compiler(trees: list[ElementTree.Element]) -> dict[str, str]:
    """The ``<compiler>`` attributes that place files; a later element overrides an earlier."""
    settings: dict[str, str] = {}
    for tree in trees:
        for element in tree.iter("compiler"):
            for key in ("meshdir", "texturedir", "assetdir", "strippath"):
                if element.get(key) is not None:
                    settings[key] = str(element.get(key))
    return settings


def _confined(base_folder: Path, base: str, name: str, referrer: Path, env_id: str,
              folder: Path | None = None) -> Path:
    """``base_folder/base/name`` resolved, refused unless it is a file inside ``folder`` (the
    model's folder; ``base_folder`` itself by default)."""
    folder = folder or base_folder
    target = (base_folder / base / name).resolve()
    if not target.is_relative_to(folder):
        raise ConfigError(
            f"env.id={env_id}: robot file {_shown(referrer, folder)} references {name!r} "
            f"(via {base or 'the model folder'}), which is outside the model's folder "
            f"{folder}; keep every file the model uses under that folder")
    if not target.is_file():
        raise ConfigError(f"env.id={env_id}: robot file {_shown(referrer, folder)} references "
                          f"{name!r}, which is not a file ({target}); fix the path")
    return target


def _add(found: list[Path], path: Path, env_id: str) -> None:
    if path in found:
        return
    if len(found) >= MAX_FILES:
        raise ConfigError(f"env.id={env_id}: the robot model uses more than {MAX_FILES} "
                          "files; merge meshes or textures")
    found.append(path)


def _shown(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix() if path.is_relative_to(folder) else str(path)


def display_root(folder: Path) -> Path:
    """What recorded paths are relative to: the folder above the top-level package holding
    ``folder``, else the project root, else ``folder``'s parent (its name starts the path)."""
    package = next((p for p in (folder, *folder.parents) if (p / "__init__.py").is_file()),
                   None)
    if package is not None:
        while (package.parent / "__init__.py").is_file():
            package = package.parent
        return package.parent
    project = paths.project_root().resolve()
    return project if folder.is_relative_to(project) else folder.parent
