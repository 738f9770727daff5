"""Command line: ``workbench <command> [HYDRA_OVERRIDES...]`` (also ``python -m workbench``).

Exit codes (DESIGN.md): 0 success; 2 bad input, reported in one line before any compute;
130/143 interrupted (SIGINT/SIGTERM); 1 anything else.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_SIGINT, EXIT_SIGTERM = 130, 143


class BadInput(Exception):
    """A command-line argument that is not usable (exit code 2)."""


def cmd_train(args: argparse.Namespace) -> int:
    """Train one run and print its MLflow run id."""
    from workbench.config import load_config

    cfg = load_config(args.overrides)
    from workbench.training import train

    run_info = {
        "started_by": "cli",
        "command": shlex.join(["workbench", *sys.argv[1:]]),
        "argv": list(sys.argv),
        "overrides": list(args.overrides),
    }
    result = train(cfg, run_info=run_info)
    print(result.run_id)
    return EXIT_OK


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run a sweep of notebooks/train.ipynb; exit 1 listing the points that did not finish."""
    from workbench.sweeps.sweep import run_sweep

    result = run_sweep(args.overrides)
    if result.failures:
        listed = ", ".join(f"{o.point} ({o.error})" for o in result.failures)
        print(f"workbench: {len(result.failures)} of {len(result.outcomes)} points did not "
              f"finish: {listed}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_ui(args: argparse.Namespace) -> int:
    """Start the MLflow UI against the configured store, on 127.0.0.1."""
    from workbench import tracking
    from workbench.config import load_config

    cfg = load_config(args.overrides)
    uri = tracking.resolve_tracking_uri(cfg.tracking.uri)
    tracking.make_client(uri)  # creates the embedded store's folder if needed
    print(f"MLflow UI on http://{args.host}:{args.port}  (store {tracking.redact_uri(uri)})")
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
               "--host", args.host, "--port", str(args.port),
               # One user, one machine: one worker starts fast (mlflow defaults to four).
               "--workers", str(args.workers)]
    return subprocess.call(command)


def cmd_server(args: argparse.Namespace) -> int:
    """Team mode: start, stop or report the shared MLflow server (workbench.team.server)."""
    from workbench.team import server

    return server.run_command(args)


def cmd_runs(args: argparse.Namespace) -> int:
    """Operations on recorded runs: ``runs copy`` (workbench.team.migrate)."""
    return int(args.runs_func(args))


def add_runs_arguments(parser: argparse.ArgumentParser) -> None:
    """``workbench runs ACTION``: one sub-parser per action, each setting ``runs_func``."""
    from workbench.team import migrate

    actions = parser.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    copy = actions.add_parser("copy", help=migrate.COPY_HELP, description=migrate.COPY_HELP)
    migrate.add_cli_arguments(copy)
    copy.set_defaults(runs_func=migrate.run_command)
    from workbench.tracking import runs

    runs.add_cli_actions(actions)


def cmd_manifest(args: argparse.Namespace) -> int:
    """Print this machine's manifest, or diff two runs' (exit 1 when they differ)."""
    from workbench.tracking import manifest

    return manifest.run_command(args)


def cmd_report(args: argparse.Namespace) -> int:
    """Write reports/<name>/ (index.html, report.md, figures) for a sweep or a set of runs."""
    from workbench.review import report

    return report.run_command(args)


def cmd_export(args: argparse.Namespace) -> int:
    """Export a run's policy to TorchScript + ONNX and verify it (workbench.deploy.export)."""
    from workbench.deploy import export

    return export.main(args.overrides)


def cmd_hub(args: argparse.Namespace) -> int:
    """Push a run's policy bundle to the Hugging Face Hub, or pull one (workbench.deploy.hub)."""
    from workbench.deploy import hub

    return hub.main(args.overrides)


def key_value_arguments(
    tokens: Sequence[str], allowed: Mapping[str, Callable[[str], Any]], *, command: str
) -> dict[str, Any]:
    """Parse ``key=value`` arguments of ``command`` into typed values.

    Unknown keys, repeated keys, missing ``=`` and values of the wrong type raise
    ``ConfigError`` with one line naming the argument and the fix.
    """
    from workbench.config import ConfigError

    parsed: dict[str, Any] = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ConfigError(f"{command}: argument {token!r}: write key=value, e.g. run=<run_id>")
        if key not in allowed:
            keys = ", ".join(allowed)
            raise ConfigError(f"{command}: unknown argument {key!r}; valid arguments: {keys}")
        if key in parsed:
            raise ConfigError(f"{command}: argument {key!r} given twice; give it once")
        if not value:
            raise ConfigError(f"{command}: {key}= is empty; give a value, e.g. {key}=...")
        try:
            parsed[key] = allowed[key](value)
        except ValueError as exc:
            kind = getattr(allowed[key], "__name__", "another value")
            raise ConfigError(f"{command}: {key}={value!r}: expected {kind}") from exc
    return parsed


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {
    "train": (cmd_train, "train one PPO run; prints its MLflow run id"),
    "sweep": (cmd_sweep, "sweep notebooks/train.ipynb over sweep.num_envs x sweep.n_steps x "
              "sweep.seeds with papermill"),
    "ui": (cmd_ui, "open the MLflow UI on the configured store (127.0.0.1)"),
    "server": (cmd_server, "team mode: shared MLflow server on PostgreSQL with basic auth: "
               "server start|stop|status"),
    "runs": (cmd_runs, "recorded runs: runs copy --from URI --to URI; runs reap; runs sync"),
    "manifest": (cmd_manifest, "print this machine's environment manifest; "
                 "'manifest diff RUN_A RUN_B' compares two runs"),
    "report": (cmd_report, "write a review report for a sweep, an experiment or runs; "
               "prints the path of its index.html"),
    "export": (cmd_export, "export a run's policy to TorchScript + ONNX, verify parity, "
               "replay and latency: export run=<run_id>"),
    "hub": (cmd_hub, "Hugging Face Hub: hub push run=<run_id> repo_id=<org/name> | "
            "hub pull repo_id=<org/name> revision=<sha|tag>"),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per workbench verb."""
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="Experiment workbench for deep RL on robots (PPO on MuJoCo, MLflow, Hydra).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (func, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        if name == "server":  # start|stop|status with their own flags
            from workbench.team.server import add_cli_arguments

            add_cli_arguments(p)
            continue
        if name == "runs":
            add_runs_arguments(p)
            continue
        if name == "manifest":  # its own arguments, including the 'diff' sub-command
            from workbench.tracking.manifest import add_cli_arguments as add_manifest_args

            add_manifest_args(p)
            continue
        if name == "report":  # selectors, output options, one option per threshold
            from workbench.review.report import add_cli_arguments as add_report_arguments

            add_report_arguments(p)
            continue
        if name == "ui":
            p.add_argument("--host", default="127.0.0.1")
            p.add_argument("--port", type=int, default=5000)
            p.add_argument("--workers", type=int, default=1, help="MLflow server worker processes")
        p.add_argument(
            "overrides", nargs="*", metavar="OVERRIDE",
            help="Hydra overrides, e.g. env=hopper env.num_envs=8 algo.n_steps=256 seed=3",
        )
    return parser


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM (a scheduler's kill) takes the same clean path as Ctrl-C: the run is marked
    # KILLED and the environments are closed; the exit code tells the two apart.
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``workbench`` command; returns the process exit code."""
    from workbench.config import ConfigError

    parser = build_parser()
    args = parser.parse_args(argv)  # argparse itself exits 2 on unknown commands
    received: list[int] = []

    def on_term(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        _raise_interrupt(signum, frame)

    signal.signal(signal.SIGTERM, on_term)
    try:
        return int(args.func(args))
    except (ConfigError, BadInput) as exc:
        print(f"workbench: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        print("workbench: interrupted", file=sys.stderr)
        # workbench.envs.guards.TrainingInterrupted carries the signal that stopped training.
        sigterm = received or getattr(exc, "signum", None) == signal.SIGTERM
        return EXIT_SIGTERM if sigterm else EXIT_SIGINT
    finally:
        if "workbench.envs" in sys.modules:
            sys.modules["workbench.envs"].stop_worker_servers()


if __name__ == "__main__":
    sys.exit(main())
