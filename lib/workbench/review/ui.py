"""``workbench ui``: MLflow's own UI on the configured store, bound to 127.0.0.1."""

from __future__ import annotations

import argparse
import subprocess
import sys

from workbench.config import load_config
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import make_client, resolve_tracking_uri

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5000
DEFAULT_WORKERS = 1  # one user, one machine: one worker starts fast (mlflow defaults to four)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the UI listens."""
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"interface to bind (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help=f"MLflow server worker processes (default {DEFAULT_WORKERS})")


def run_command(args: argparse.Namespace) -> int:
    """Start the MLflow UI against the configured store; returns its exit code."""
    uri = resolve_tracking_uri(load_config(args.overrides).tracking.uri)
    make_client(uri)  # creates the embedded store's folder if needed
    print(f"MLflow UI on http://{args.host}:{args.port}  (store {redact_uri(uri)})")
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
               "--host", args.host, "--port", str(args.port), "--workers", str(args.workers)]
    return subprocess.call(command)
