"""``python -m tests.stop_at POINT OVERRIDE...``: `workbench train` that SIGTERMs itself at POINT.

The signal is real (``os.kill`` of this very process, handled by the CLI's own handler); the
instants are found exactly by wrapping the function that runs there, so a test can stop a
training at each step from its start to its first iteration, and at its end, every time
(tests/test_stop_points.py). Nothing else of the training is changed.
"""

from __future__ import annotations

import functools
import multiprocessing.process
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from stable_baselines3 import PPO
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from workbench import cli
from workbench.tracking import manifest
from workbench.training import lifecycle, trainer


def sigterm() -> None:
    print(f"stop_at: SIGTERM to {os.getpid()}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


def signal_in(owner: Any, name: str, *, after: bool = False) -> None:
    """Replace ``owner.name`` by a wrapper that sends SIGTERM (before or after the call), once."""
    original: Callable[..., Any] = getattr(owner, name)
    sent = False

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal sent
        if not after and not sent:
            sent = True
            sigterm()
        result = original(*args, **kwargs)
        if after and not sent:
            sent = True
            sigterm()
        return result

    setattr(owner, name, wrapper)


def signal_after_outbox() -> None:
    """The run's outbox (a class, checked with isinstance) signals once it is open."""

    class Signalling(lifecycle.RunWriter):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            sigterm()

    lifecycle.RunWriter = Signalling  # type: ignore[misc]


POINTS: dict[str, Callable[[], None]] = {
    # before the run exists: the store is being opened
    "setup": lambda: signal_in(lifecycle, "make_client"),
    # the store has just created the run; nothing has written to it yet
    "run_created": lambda: signal_in(lifecycle, "create_run", after=True),
    # the run's outbox has just been opened
    "outbox_opened": signal_after_outbox,
    # MLflow's system metrics sampler is being started
    "system_metrics": lambda: signal_in(lifecycle, "start_system_metrics"),
    # the environment manifest is being collected and recorded
    "manifest": lambda: signal_in(manifest, "record_manifest"),
    # the first subprocess worker of the training envs has just started
    "env_build": lambda: signal_in(multiprocessing.process.BaseProcess, "start", after=True),
    # PPO's policy and optimizer are being built
    "model_build": lambda: signal_in(PPO, "_setup_model"),
    # the first rollout begins
    "first_rollout": lambda: signal_in(OnPolicyAlgorithm, "collect_rollouts"),
    # training is over; the model is being saved
    "model_save": lambda: signal_in(trainer, "save_model"),
    # the run's final status is being written
    "final_status": lambda: signal_in(lifecycle.RunWriter, "set_terminated"),
}


def main(argv: list[str]) -> int:
    point, overrides = argv[0], argv[1:]
    POINTS[point]()
    return cli.main(["train", *overrides])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
