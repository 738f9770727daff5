"""Does the walking duck go where it is told? Command tracking and falls of a trained policy.

Trains ``experiment=duck_walk`` as shipped for each seed (in a fresh store; ``--overrides``
for a probe), or takes ``--run RUN_ID`` of the configured store, and evaluates its final
policy, deterministic, on 10-s episodes with a fixed command (the env's own ranges narrowed
to one value, no resampling) and the preset's one-step action delay
(``workbench.deploy.walking``):

- forward: 0.2 m/s ahead, no turn: the mean forward speed and its error;
- turns: 0.5 rad/s left and right at 0.1 m/s: the mean yaw rate and its error;
- robust: a random command from the preset's ranges, under the ``duck`` eval profile's
  ranges (conf/eval/duck.yaml) sampled per episode: friction 0.5-1.5x, masses 0.8-1.2x,
  servo gain 0.7-1.15x, observation noise 0.03, one control step of delay: the share of
  episodes that end without a fall;
- the gait: each foot's share of steps on the ground and the share of steps with exactly
  one foot down (a stepping gait alternates; a shuffle or a slide keeps both down), and the
  torso's mean height (standing: 0.20 m; on the knees it drops toward 0.12);
- a policy that holds the standing pose under the forward command: the speed walking is
  measured against.

    python benchmarks/duck_walk.py --seeds 0 1 2            # train each (~30 min), evaluate
    python benchmarks/duck_walk.py --run RUN_ID             # evaluate a trained run
    python benchmarks/duck_walk.py --run RUN_ID --seeds 1 2 # add seeds to a trained run

A ``--run`` is read from the configured store (``MLFLOW_TRACKING_URI``), with its seed and
training seconds as that run logged them; it is evaluated before any training starts.

The goals it reports against: speed within 0.04 m/s of 0.2, yaw rate within 0.15 rad/s of
0.5, 95 % of 20 robust episodes without a fall.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

SPEED, TURN, TURN_SPEED = 0.2, 0.5, 0.1
GOALS = {"speed_error": 0.04, "yaw_error": 0.15, "no_fall": 0.95}
ROBUST = {"friction": [0.5, 1.5], "mass_scale": [0.8, 1.2], "actuator_gain": [0.7, 1.15],
          "obs_noise_std": 0.03, "action_delay": 1}  # conf/eval/duck.yaml's ranges


def train(seed: int, overrides: list[str]) -> tuple[str, float]:
    """``workbench train experiment=duck_walk seed=S`` in a fresh store: its run id and its
    training seconds (``model.learn``)."""
    from mlflow.tracking import MlflowClient

    experiments = Path(tempfile.mkdtemp(prefix="duck-walk-")) / "experiments"
    os.environ["WORKBENCH_EXPERIMENTS"] = str(experiments)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{experiments / 'mlflow.db'}"
    done = harness.run_child([sys.executable, "-m", "workbench", "train",
                              "experiment=duck_walk", f"seed={seed}", "console.progress_bar=false",
                              "console.iteration_lines=false", *overrides])
    run_id = str(done["stdout"]).strip().splitlines()[-1]
    metrics = MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(run_id).data.metrics
    return run_id, float(metrics["summary/wall_time_s"])


def trained(run_id: str) -> tuple[int, float]:
    """A trained run's seed and training seconds, as the configured store holds them."""
    from workbench.deploy import export

    run = export.open_store().get_run(run_id)
    return int(run.data.params["seed"]), float(run.data.metrics["summary/wall_time_s"])


def evaluate(run_id: str, count: int) -> dict[str, Any]:
    """The walking figures of one run's final policy, and of a policy that holds the
    standing pose under the forward command (what walking is measured against)."""
    from workbench.deploy import evaluation, export
    from workbench.deploy.walking import command_episodes, fixed_command, standing_actor

    client = export.open_store()
    with tempfile.TemporaryDirectory() as work:
        policy = evaluation.policy_of_run(client, run_id, Path(work))
        cfg = policy.config

        def run(actor: Any, kwargs: dict[str, Any], seed: int, n: int = 5,
                perturbation: dict[str, Any] | None = None) -> list[Any]:
            return command_episodes(actor, cfg, kwargs, perturbation, n, seed)

        forward = run(policy.actor, fixed_command(SPEED, 0.0), 100)
        left = run(policy.actor, fixed_command(TURN_SPEED, TURN), 200)
        right = run(policy.actor, fixed_command(TURN_SPEED, -TURN), 300)
        robust = run(policy.actor, {}, 400, count, ROBUST)
        standing = run(standing_actor(cfg), fixed_command(SPEED, 0.0), 100)
    speed = float(np.mean([e.speed for e in forward]))
    yaw = float(np.mean([e.yaw_rate for e in left] + [-e.yaw_rate for e in right]))
    return {
        "run_id": run_id, "speed": speed, "speed_error": abs(speed - SPEED), "yaw_rate": yaw,
        "yaw_error": abs(yaw - TURN),
        "no_fall": 1.0 - float(np.mean([e.fell for e in robust])),
        "one_foot_down": float(np.mean([e.one_foot_down for e in forward])),
        "height": float(np.mean([e.height for e in forward])),
        "forward_falls": float(np.mean([e.fell for e in forward + left + right])),
        "standing_speed": float(np.mean([e.speed for e in standing])),
    }


def row(label: str, r: dict[str, Any]) -> list[str]:
    """One line of the table: a seed's figures, or their medians."""
    return [label, f"{r['train_s'] / 60:.1f}", f"{r['speed']:.3f} ({r['speed_error']:.3f})",
            f"{r['yaw_rate']:.3f} ({r['yaw_error']:.3f})", f"{r['no_fall']:.0%}",
            f"{r['one_foot_down']:.0%}", f"{r['height']:.3f}", f"{r['standing_speed']:.3f}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", help="train these (default 0 "
                        "without --run)")
    parser.add_argument("--run", nargs="+", default=[],
                        help="evaluate these runs of the configured store too")
    parser.add_argument("--episodes", type=int, default=20, help="robust episodes (default 20)")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="Hydra overrides for the trainings (a probe), e.g. algo.n_epochs=3")
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else ([] if args.run else [0])
    print(harness.load_line(), flush=True)
    started = time.perf_counter()
    runs = [(run_id, *trained(run_id)) for run_id in args.run]
    rows = []
    for run_id, seed, train_s in runs:
        rows.append({"seed": seed, "train_s": train_s, **evaluate(run_id, args.episodes)})
        print(rows[-1], flush=True)
    for seed in seeds:
        run_id, train_s = train(seed, args.overrides)
        rows.append({"seed": seed, "train_s": train_s, **evaluate(run_id, args.episodes)})
        print(rows[-1], flush=True)
    table = [row(str(r["seed"]), r) for r in rows]
    if len(rows) > 1:  # the goals are judged on the median over seeds
        table.append(row("median", {key: float(np.median([r[key] for r in rows]))
                                    for key in rows[0] if key not in ("seed", "run_id")}))
    headers = ["seed", "training (min)", f"speed at {SPEED} m/s (error)",
               f"yaw rate at {TURN} rad/s (error)", "no fall, robust", "one foot down",
               "torso height (m)", "standing policy's speed"]
    harness.print_table("walking duck", headers, table)
    harness.write_results("duck_walk", {
        "rows": rows, "goals": GOALS, "overrides": args.overrides,
        "seconds": time.perf_counter() - started,
        "tables": {"walking": {"headers": headers, "rows": table}}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
