"""``workbench ui``: MLflow's own UI on the configured store, bound to 127.0.0.1.

The UI runs as a child in its own session, its output in ``<experiments>/logs/ui.log``; the
URL is printed once the server answers. Ctrl-C or SIGTERM stops the whole group (uvicorn, its
workers, MLflow's job runner) quietly, so the port is free when the command returns.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from workbench import paths, processes
from workbench.config import ConfigError, load_config
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import make_client, resolve_tracking_uri, ui_link

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5000
DEFAULT_WORKERS = 1  # one user, one machine: one worker starts fast (mlflow defaults to four)
START_TIMEOUT_S = 240.0  # MLflow's first start migrates the store; slow on a busy machine
STOP_TIMEOUT_S = 20.0


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the UI listens."""
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"interface to bind (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help=f"MLflow server worker processes (default {DEFAULT_WORKERS})")


def ui_command(uri: str, args: argparse.Namespace) -> list[str]:
    """The ``mlflow ui`` command line."""
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
            "--host", args.host, "--port", str(args.port), "--workers", str(args.workers)]


def ui_environment() -> dict[str, str]:
    """The UI's environment: MLflow's job runner off (it serves GenAI jobs, not run tables, and
    starts seven more processes)."""
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def run_command(args: argparse.Namespace) -> int:
    """Start the MLflow UI against the configured store; serve until Ctrl-C or SIGTERM."""
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: not a TCP port; give 1-65535, e.g. 5000")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be at least 1")
    cfg = load_config(args.overrides)
    uri = resolve_tracking_uri(cfg.tracking.uri)
    client = make_client(uri)  # creates the embedded store's folder if needed
    log = paths.experiments_dir() / "logs" / "ui.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://{args.host}:{args.port}"
    print(f"starting the MLflow UI on {url} (store {redact_uri(uri)}, log {log}) ...",
          file=sys.stderr, flush=True)
    with log.open("ab") as output:
        server = subprocess.Popen(ui_command(uri, args), stdout=output, stderr=output,
                                  env=ui_environment(), start_new_session=True)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        problem = processes.wait_until_healthy(url, server, START_TIMEOUT_S)
        if problem is not None:
            print(f"workbench: error: the MLflow UI {problem}: {last_line(log)} (log {log})",
                  file=sys.stderr)
            return 1
        experiment = client.get_experiment_by_name(cfg.tracking.experiment)
        page = ui_link(url, experiment.experiment_id if experiment else None)
        print(f"MLflow UI on {page}  (Ctrl-C stops it)", flush=True)
        return server.wait()
    except KeyboardInterrupt:
        print("stopping the MLflow UI ...", file=sys.stderr, flush=True)
        return 0
    finally:
        processes.terminate_group(server.pid, STOP_TIMEOUT_S)
        server.wait()
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM ends ``workbench ui`` the way Ctrl-C does."""
    raise KeyboardInterrupt


def last_line(log: Path) -> str:
    """The last non-empty line of the UI's log."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"
