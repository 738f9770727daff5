"""The arguments of ``workbench export`` and ``workbench hub``, and the checks of their values.

Nothing here loads torch, the simulator or a store: the CLI parses and checks a command line
with this module alone, so a typo is answered at once; :mod:`workbench.deploy.commands` runs
the command (the same checks first, see :func:`check_export_arguments`).
"""

from __future__ import annotations

import argparse

from workbench.config import ConfigError

EXPORT_HELP = ("export a run's policy (or a pulled Hub bundle's) to TorchScript + ONNX and "
               "verify it: parity, replay and latency")
HUB_HELP = ("Hugging Face Hub: push a run's policy bundle, or pull one by a pinned revision")

DEFAULT_OBSERVATIONS = 256
DEFAULT_EPISODES = 5
DEFAULT_CALLS = 1000
DEFAULT_WARMUP = 100
DEFAULT_VERIFY_EPISODES = 3  # closed-loop episodes of `deploy verify`'s continuous stage
MAX_VERIFY_EPISODES = 100
MIN_CALLS = 1000  # latency percentiles need enough samples for a meaningful p99
BEST, LAST = "best", "last"  # --checkpoint's named choices (else a step)


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """The policy to export (exactly one source) and the size of each check."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", metavar="RUN_ID", help="a finished run of the configured store")
    source.add_argument("--bundle", metavar="DIR", help="a bundle pulled by `workbench hub pull`")
    source.add_argument("--repo-id", metavar="ORG/NAME", help="pull this Hub bundle first")
    parser.add_argument("--revision", metavar="SHA|TAG", help="with --repo-id: the revision")
    parser.add_argument(
        "--checkpoint", metavar="best|last|STEP",
        help="with --run: export this checkpoint of the run instead of its final policy: the "
        "best-evaluated (checkpoint.keep=best), the newest, or the one of a step")
    parser.add_argument(
        "--show-contract", action="store_true",
        help="print the contract of the policy's existing export (the run's export/policy.onnx, "
        "or the bundle's) as a table, and export nothing")
    add_allow_module(parser)
    budget = parser.add_argument_group("check sizes")
    budget.add_argument("--observations", type=int, default=DEFAULT_OBSERVATIONS,
                        metavar="N", help="recorded observations for the parity check "
                        f"(default {DEFAULT_OBSERVATIONS})")
    budget.add_argument("--episodes", type=int, default=DEFAULT_EPISODES, metavar="N",
                        help="episodes replayed by ONNX Runtime "
                        f"(default {DEFAULT_EPISODES})")
    budget.add_argument("--calls", type=int, default=DEFAULT_CALLS, metavar="N",
                        help=f"timed calls per latency backend (default {DEFAULT_CALLS})")
    budget.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, metavar="N",
                        help=f"untimed calls before timing (default {DEFAULT_WARMUP})")


def check_export_arguments(args: argparse.Namespace) -> list[str]:
    """The checks of ``workbench export``'s values; returns the allowed modules."""
    check_budget(args.observations, args.episodes, args.calls, args.warmup)
    if args.revision and not args.repo_id:
        raise ConfigError("--revision: only with --repo-id ORG/NAME")
    if args.checkpoint is not None:
        if not args.run:
            raise ConfigError(f"--checkpoint {args.checkpoint}: only with --run RUN_ID (a "
                              "bundle holds one policy)")
        check_checkpoint_choice(args.checkpoint)
    if args.show_contract and args.checkpoint is not None:
        raise ConfigError("--show-contract shows the run's existing export; --checkpoint "
                          "chooses what to export: give one of them")
    return allowed_modules(args.allow_module)


def check_checkpoint_choice(choice: str) -> None:
    """``--checkpoint``: ``best``, ``last`` or a step count (whether the run has it is
    checked against the run)."""
    if choice not in (BEST, LAST) and not (choice.isascii() and choice.isdigit()):
        raise ConfigError(f"--checkpoint {choice[:40]!r}: not best, last or a step; use e.g. "
                          "--checkpoint best, --checkpoint last or --checkpoint 50000")


def check_budget(observations: int, episodes: int, calls: int, warmup: int) -> None:
    """Reject sizes the checks cannot work with, before anything runs."""
    if observations < 1:
        raise ConfigError(f"observations={observations}: must be >= 1 (e.g. 256)")
    if episodes < 1:
        raise ConfigError(f"episodes={episodes}: must be >= 1 (e.g. episodes=5)")
    if calls < MIN_CALLS:
        raise ConfigError(
            f"calls={calls}: latency needs at least {MIN_CALLS} timed calls for a p99; "
            f"use calls={MIN_CALLS} or more"
        )
    if warmup < 0:
        raise ConfigError(f"warmup={warmup}: must be >= 0 (e.g. warmup=100)")


def add_hub_arguments(parser: argparse.ArgumentParser) -> None:
    """``hub push`` and ``hub pull``, each with its own flags."""
    actions = parser.add_subparsers(dest="hub_action", required=True, metavar="ACTION")
    push = actions.add_parser("push", help="upload a run's bundle as one commit (prints its SHA)",
                              description="Upload run RUN_ID's policy bundle as one commit; "
                              "the run is exported and verified first if it has no export.")
    what = push.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", metavar="RUN_ID")
    what.add_argument("--model", metavar="NAME@ALIAS",
                      help="the registered model version an alias points at (workbench "
                      "promote); the bundle commit is recorded on that version")
    push.add_argument("--repo-id", metavar="ORG/NAME", required=True)
    push.add_argument("--public", action="store_true",
                      help="create the repository public (default: private)")
    add_allow_module(push)
    pull = actions.add_parser("pull", help="download one commit and verify it (prints its folder)",
                              description="Download exactly one commit of a bundle into "
                              "experiments/hub/ORG/NAME/COMMIT and verify every file.")
    pull.add_argument("--repo-id", metavar="ORG/NAME", required=True)
    pull.add_argument("--revision", metavar="SHA|TAG", required=True,
                      help="a commit SHA or a tag (resolved once, then pinned)")
    add_allow_module(pull)


def add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    """``deploy verify`` and its flags."""
    actions = parser.add_subparsers(dest="deploy_action", required=True, metavar="ACTION")
    verify = actions.add_parser(
        "verify", help="the run's exported runner against the simulator: static, single-step "
        "and real-time closed-loop stages, latency against the control period",
        description="Start the run's standalone runner as a separate process, drive it over a "
        "local socket with MuJoCo in the robot's place, and give one verdict per stage.")
    verify.add_argument("--run", metavar="RUN_ID", required=True,
                        help="a run exported with `workbench export --run RUN_ID`")
    verify.add_argument("--episodes", type=int, default=DEFAULT_VERIFY_EPISODES, metavar="N",
                        help="closed-loop real-time episodes of the continuous stage "
                        f"(default {DEFAULT_VERIFY_EPISODES})")
    add_allow_module(verify)


def check_deploy_arguments(args: argparse.Namespace) -> list[str]:
    """The checks of ``workbench deploy verify``'s values; returns the allowed modules."""
    if not 1 <= args.episodes <= MAX_VERIFY_EPISODES:
        raise ConfigError(f"--episodes {args.episodes}: must be 1 to {MAX_VERIFY_EPISODES} "
                          "(each runs in real time; e.g. --episodes 3)")
    return allowed_modules(args.allow_module)


def add_allow_module(parser: argparse.ArgumentParser) -> None:
    """``--allow-module MODULE``: the only way a bundle's (or a stored run's) ``module:Id``
    env gets imported."""
    parser.add_argument(
        "--allow-module", action="append", default=[], metavar="MODULE",
        help="let a bundle's (or the run's) config.yaml name env.id=MODULE:Id (or a submodule "
        "of MODULE); "
        "importing it runs its code, so name only modules you trust (repeatable)")


def allowed_modules(names: list[str]) -> list[str]:
    """The ``--allow-module`` values, each checked to be a dotted Python module name."""
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ConfigError(f"--allow-module {name!r}: not a Python module name (e.g. "
                              "--allow-module yourpkg.robots)")
    return names
