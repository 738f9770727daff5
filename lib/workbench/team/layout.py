"""Where the team server keeps its files (``experiments/server/``), and its error type."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench import paths


class ServerError(RuntimeError):
    """The server could not be started or stopped (exit code 1); the message says why."""


@dataclass(frozen=True)
class Layout:
    """The files of one server instance, all under ``root`` (``experiments/server``)."""

    root: Path

    @property
    def pgdata(self) -> Path:
        return self.root / "pgdata"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def auth_config(self) -> Path:
        return self.root / "basic_auth.ini"

    @property
    def state_file(self) -> Path:
        return self.root / "server.json"


def default_layout() -> Layout:
    """The server files under the project's experiments directory."""
    return Layout(paths.experiments_dir() / "server")
