"""``workbench export`` and ``workbench hub``: their arguments and what they run.

    workbench export --run RUN_ID | --bundle DIR | --repo-id ORG/NAME --revision REV
                     [--allow-module MODULE]... [--observations N] [--episodes N] [--calls N]
                     [--warmup N]
    workbench hub push --run RUN_ID --repo-id ORG/NAME [--public]
    workbench hub pull --repo-id ORG/NAME --revision REV [--allow-module MODULE]...

A bundle is data: its ``config.yaml`` may name an env as ``module:Id`` (gymnasium would import
the module) only when that module is allowed with ``--allow-module`` (repeatable; a package
allows its submodules).
"""

from __future__ import annotations

import argparse
import sys

from workbench.config import ConfigError
from workbench.deploy import export, hub
from workbench.training.bundle import check_repo_id
from workbench.training.bundle_format import BundleError

EXPORT_HELP = ("export a run's policy (or a pulled Hub bundle's) to TorchScript + ONNX and "
               "verify it: parity, replay and latency")
HUB_HELP = ("Hugging Face Hub: push a run's policy bundle, or pull one by a pinned revision")


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """The policy to export (exactly one source) and the size of each check."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", metavar="RUN_ID", help="a finished run of the configured store")
    source.add_argument("--bundle", metavar="DIR", help="a bundle pulled by `workbench hub pull`")
    source.add_argument("--repo-id", metavar="ORG/NAME", help="pull this Hub bundle first")
    parser.add_argument("--revision", metavar="SHA|TAG", help="with --repo-id: the revision")
    add_allow_module(parser)
    budget = parser.add_argument_group("check sizes")
    budget.add_argument("--observations", type=int, default=export.DEFAULT_OBSERVATIONS,
                        metavar="N", help="recorded observations for the parity check "
                        f"(default {export.DEFAULT_OBSERVATIONS})")
    budget.add_argument("--episodes", type=int, default=export.DEFAULT_EPISODES, metavar="N",
                        help="episodes replayed by ONNX Runtime "
                        f"(default {export.DEFAULT_EPISODES})")
    budget.add_argument("--calls", type=int, default=export.DEFAULT_CALLS, metavar="N",
                        help=f"timed calls per latency backend (default {export.DEFAULT_CALLS})")
    budget.add_argument("--warmup", type=int, default=export.DEFAULT_WARMUP, metavar="N",
                        help=f"untimed calls before timing (default {export.DEFAULT_WARMUP})")


def export_command(args: argparse.Namespace) -> int:
    """Export and verify; exit 1 when the parity check fails.

    With ``--run`` the files and the report are logged to the run; with a pulled Hub bundle
    (``--bundle`` its directory, or ``--repo-id``/``--revision`` to pull it first) the same
    checks run on the bundle's weights, and the report is written next to it.
    """
    budget = {"observations": args.observations, "episodes": args.episodes,
              "calls": args.calls, "warmup": args.warmup}
    export.check_budget(**budget)
    if args.revision and not args.repo_id:
        raise ConfigError("--revision: only with --repo-id ORG/NAME")
    allowed = allowed_modules(args.allow_module)
    if allowed and args.run:
        raise ConfigError("--allow-module: only with --bundle or --repo-id (a bundle's env)")
    export.quiet_downloads()
    try:
        if args.run:
            result = export.export_run(args.run, **budget)
        else:
            directory = (pull_verified(args.repo_id, args.revision, allowed).directory
                         if args.repo_id else hub.bundle_directory(args.bundle))
            result = hub.verify_export(directory, allowed, **budget)
    except BundleError as exc:
        print(f"workbench: bundle verification failed: {exc}", file=sys.stderr)
        return 1
    print(export.format_report(result.report))
    print(f"files: {result.directory}")
    if not result.passed:
        print("workbench: export parity check failed (see the report above)", file=sys.stderr)
        return 1
    return 0


def add_hub_arguments(parser: argparse.ArgumentParser) -> None:
    """``hub push`` and ``hub pull``, each with its own flags."""
    actions = parser.add_subparsers(dest="hub_action", required=True, metavar="ACTION")
    push = actions.add_parser("push", help="upload a run's bundle as one commit (prints its SHA)",
                              description="Upload run RUN_ID's policy bundle as one commit; "
                              "the run is exported and verified first if it has no export.")
    push.add_argument("--run", metavar="RUN_ID", required=True)
    push.add_argument("--repo-id", metavar="ORG/NAME", required=True)
    push.add_argument("--public", action="store_true",
                      help="create the repository public (default: private)")
    pull = actions.add_parser("pull", help="download one commit and verify it (prints its folder)",
                              description="Download exactly one commit of a bundle into "
                              "experiments/hub/ORG/NAME/COMMIT and verify every file.")
    pull.add_argument("--repo-id", metavar="ORG/NAME", required=True)
    pull.add_argument("--revision", metavar="SHA|TAG", required=True,
                      help="a commit SHA or a tag (resolved once, then pinned)")
    add_allow_module(pull)


def add_allow_module(parser: argparse.ArgumentParser) -> None:
    """``--allow-module MODULE``: the only way a bundle's ``module:Id`` env gets imported."""
    parser.add_argument(
        "--allow-module", action="append", default=[], metavar="MODULE",
        help="let a bundle's config.yaml name env.id=MODULE:Id (or a submodule of MODULE); "
        "importing it runs its code, so name only modules you trust (repeatable)")


def allowed_modules(names: list[str]) -> list[str]:
    """The ``--allow-module`` values, each checked to be a dotted Python module name."""
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ConfigError(f"--allow-module {name!r}: not a Python module name (e.g. "
                              "--allow-module yourpkg.robots)")
    return names


def hub_command(args: argparse.Namespace) -> int:
    """Push or pull; exit 1 when a bundle fails verification."""
    export.quiet_downloads()
    try:
        if args.hub_action == "push":
            hub.print_push(hub.push(args.run, check_repo_id(args.repo_id), private=not args.public))
        else:
            allowed = allowed_modules(args.allow_module)
            hub.print_pull(pull_verified(args.repo_id, args.revision, allowed))
    except BundleError as exc:
        print(f"workbench: bundle verification failed: {exc}", file=sys.stderr)
        return 1
    return 0


def pull_verified(repo_id: str, revision: str, allowed: list[str]) -> hub.PulledBundle:
    """``hub.pull`` with the repository id checked first (one line on a bad id)."""
    return hub.pull(check_repo_id(repo_id), revision, allowed)
