"""``workbench export`` and ``workbench hub``: what they run (their arguments and the checks
of their values are :mod:`workbench.deploy.arguments`, which loads no torch).

    workbench export --run RUN_ID [--checkpoint best|last|STEP] | --bundle DIR
                     | --repo-id ORG/NAME --revision REV [--allow-module MODULE]...
                     [--observations N] [--episodes N] [--calls N] [--warmup N]
                     [--show-contract]
    workbench deploy verify --run RUN_ID [--episodes N] [--allow-module MODULE]...
    workbench hub push --run RUN_ID | --model NAME@ALIAS --repo-id ORG/NAME [--public]
                       [--allow-module MODULE]...
    workbench hub pull --repo-id ORG/NAME --revision REV [--allow-module MODULE]...

A bundle, and a run of a store (which may be shared), are data: their ``config.yaml`` may name
an env as ``module:Id`` (gymnasium would import the module) only when that module is allowed
with ``--allow-module`` (repeatable; a package allows its submodules).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from workbench.config import ConfigError
from workbench.console import printable
from workbench.deploy import contract, export, hub, runner, verification
from workbench.deploy.arguments import (
    allowed_modules,
    check_deploy_arguments,
    check_export_arguments,
)
from workbench.training.bundle import check_repo_id
from workbench.training.bundle_format import BundleError


def export_command(args: argparse.Namespace) -> int:
    """Check the arguments, export and verify; exit 1 when the parity check fails, 2 (one
    ``workbench: error:`` line) when a bundle fails verification.

    With ``--run`` the files and the report are logged to the run; with a pulled Hub bundle
    (``--bundle`` its directory, or ``--repo-id``/``--revision`` to pull it first) the same
    checks run on the bundle's weights, and the report is written next to it.
    """
    allowed = check_export_arguments(args)
    budget = {"observations": args.observations, "episodes": args.episodes,
              "calls": args.calls, "warmup": args.warmup}
    export.quiet_downloads()
    try:
        if args.show_contract:
            print(runner.contract_table(exported_contract(args, allowed)))
            return 0
        if args.run:
            result = export.export_run(args.run, allowed_modules=allowed,
                                       checkpoint_choice=args.checkpoint, **budget)
        else:
            directory = (pull_verified(args.repo_id, args.revision, allowed).directory
                         if args.repo_id else hub.bundle_directory(args.bundle))
            result = hub.verify_export(directory, allowed, **budget)
    except BundleError as exc:
        raise verification_failed(exc) from exc
    print(export.format_report(result.report))
    print(f"files: {result.directory}")
    if not result.passed:
        print("workbench: export parity check failed (see the report above)", file=sys.stderr)
        return 1
    return 0


def exported_contract(args: argparse.Namespace, allowed: list[str]) -> runner.Contract:
    """The contract of a run's existing export, or of a (checked) bundle's policy.onnx."""
    if not args.run:
        directory = (pull_verified(args.repo_id, args.revision, allowed).directory
                     if args.repo_id else hub.bundle_directory(args.bundle))
        checked = hub.check_files(directory, str(directory), allowed)
        return contract.read_contract(directory / "policy.onnx", f"bundle {checked.label}")
    client = export.open_store()
    export.get_run(client, args.run)
    listed = {a.path for a in client.list_artifacts(args.run, export.ARTIFACT_DIR)}
    if f"{export.ARTIFACT_DIR}/policy.onnx" not in listed:
        raise ConfigError(f"run {args.run}: has no exported model (export/policy.onnx); export "
                          f"it first: workbench export --run {args.run}")
    with tempfile.TemporaryDirectory(prefix="workbench-contract-") as tmp:
        path = Path(client.download_artifacts(
            args.run, f"{export.ARTIFACT_DIR}/policy.onnx", tmp))
        return contract.read_contract(path, f"run {args.run} export/policy.onnx")


def deploy_command(args: argparse.Namespace) -> int:
    """``deploy verify``: 0 when every stage passes, 1 when one fails or the contract does
    not fit the run, 2 (one line) on bad input."""
    allowed = check_deploy_arguments(args)
    export.quiet_downloads()
    return verification.verify_command(args.run, args.episodes, allowed)


def hub_command(args: argparse.Namespace) -> int:
    """Push or pull; a pulled bundle that fails verification exits 2 (it is bad input, as a
    malformed one is), a run whose own export fails verification on push exits 1."""
    export.quiet_downloads()
    allowed = allowed_modules(args.allow_module)
    if args.hub_action == "push":
        repo_id = check_repo_id(args.repo_id)
        version = hub.model_version(args.model) if args.model else None
        run_id = args.run if version is None else version.run_id
        try:
            result = hub.push(run_id, repo_id, private=not args.public, allowed_modules=allowed)
        except BundleError as exc:
            print(f"workbench: {exc}", file=sys.stderr)
            return 1
        if version is not None:
            hub.record_push_on_version(version, result)
        hub.print_push(result)
        return 0
    try:
        hub.print_pull(pull_verified(args.repo_id, args.revision, allowed))
    except BundleError as exc:
        raise verification_failed(exc) from exc
    return 0


def verification_failed(exc: BundleError) -> ConfigError:
    """A bundle that failed verification as one ``workbench: error:`` line (exit code 2)."""
    return ConfigError(f"bundle verification failed: {printable(str(exc))}")


def pull_verified(repo_id: str, revision: str, allowed: list[str]) -> hub.PulledBundle:
    """``hub.pull`` with the repository id checked first (one line on a bad id)."""
    return hub.pull(check_repo_id(repo_id), revision, allowed)
