"""Time-to-reward: training seconds until a deterministic evaluation reaches a return threshold.

Side by side, on the same machine in the same run, interleaved seed by seed (the order rotates
each seed so no contestant always runs first), each run in a fresh process:

- ``workbench``: the workbench's default configuration for the task (``workbench train
  env=<task>``, i.e. ``conf/`` as shipped), through ``workbench.training.trainer.train``;
- ``sb3``: bare stable-baselines3 at its defaults: ``PPO("MlpPolicy", make_vec_env(id, 1))``;
- ``zoo``: rl-baselines3-zoo itself (``rl_zoo3``, the ``zoo`` extra): its own
  ``ExperimentManager`` builds the model, the env wrappers and the normalization from its own
  ``hyperparams/ppo.yml`` entry for the task (the ``-v4``/``-v2`` entry, on the ``-v5`` task:
  the entry is copied under the ``-v5`` id into the manager's ``config`` file, nothing else
  changes); ``--contestant preset=experiment=zoo_<task>`` runs the workbench's preset made
  from the same entry (scripts/zoo_presets.py);
- ``--algos sac td3 tqc crossq a2c``: one contestant per algorithm, named after it, with
  rl-baselines3-zoo's tuned values for the task (``experiment=zoo_<algo>_<task>``, generated
  from the zoo's files: docs/algorithms.md) or, where the zoo has none, the library's
  defaults on one env (``algo=<algo> env.num_envs=1``).

Protocol (the same for every contestant): every ``--eval-every`` environment steps, at the end
of a rollout, ``--episodes`` deterministic episodes run on a separate gymnasium env (seed
10000 + seed, VecNormalize statistics synced and frozen). The clock counts training only:
evaluation time is excluded. A threshold's time is the training time at the first evaluation
whose mean return reaches it (so it is resolved to one evaluation interval). A run stops when
it has reached every threshold, or after ``--budget-s`` training seconds or ``--max-steps``.

Thresholds: quick mode uses a low one (HalfCheetah 0, reached within seconds by a learning
configuration), the full mode HalfCheetah 1000 / 3000 / 5000 (the targets of
docs/benchmarks.md; the zoo
publishes 5819 +- 664 at 1M steps) and Hopper 1500 / 2000 (the zoo publishes 2410 +- 10 at 1M
steps; 1000 is not a threshold there: standing still for the 1000 steps of an episode earns
~1000, a plateau PPO often sits on before it hops).

    python benchmarks/time_to_reward.py --quick
    python benchmarks/time_to_reward.py --tasks halfcheetah --seeds 0 1 2 --budget-s 600
    python benchmarks/time_to_reward.py --tasks all --only workbench zoo   # the suite table
    python benchmarks/time_to_reward.py --tasks halfcheetah --contestant \\
        wide=env.num_envs=16,algo.n_steps=64 --only workbench wide
    python benchmarks/time_to_reward.py --tasks halfcheetah --only workbench \
        --algos sac td3 tqc crossq --seeds 0 1 2 --budget-s 300   # docs/benchmarks.md
    python benchmarks/time_to_reward.py --rescore benchmarks/results/time_to_reward.json \\
        --thresholds 500 900   # re-read finished runs' evaluation curves at other thresholds

Rescoring reads the recorded evaluations again (no training): a run stopped at its last
threshold or budget, so only thresholds at or below what it reached are meaningful.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from workbench.review.references import PUBLISHED_PPO

# Last threshold: rl-baselines3-zoo's published PPO return at 1M steps (the one table:
# workbench.review.references.PUBLISHED_PPO) or a stated fraction where PPO falls short of it
# (HalfCheetah: 5000 of 5819) or plateaus (Hopper: 2000 of 2410); the zoo publishes no PPO
# figure for the last three, whose targets are the workbench's own (Humanoid: upright, walking;
# InvertedDoublePendulum: ~all 1000 steps upright; Reacher: gymnasium's reward_threshold).
THRESHOLDS = {"halfcheetah": [1000.0, 3000.0, 5000.0], "hopper": [1500.0, 2000.0],
              "walker2d": [2000.0, PUBLISHED_PPO["walker2d"]],
              "ant": [1000.0, PUBLISHED_PPO["ant"]], "swimmer": [100.0, PUBLISHED_PPO["swimmer"]],
              "humanoid": [500.0, 1000.0, 3000.0], "inverted_double_pendulum": [9000.0],
              "reacher": [-3.75]}
QUICK_THRESHOLDS = {"halfcheetah": [0.0], "hopper": [200.0]}
ENV_IDS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5", "walker2d": "Walker2d-v5",
           "ant": "Ant-v5", "swimmer": "Swimmer-v5", "humanoid": "Humanoid-v5",
           "inverted_double_pendulum": "InvertedDoublePendulum-v5", "reacher": "Reacher-v5"}
BUILTIN = ("workbench", "sb3", "zoo")


# --------------------------------------------------------------------------- child process


def note_reached(reached: dict[str, dict[str, float]], thresholds: list[float], mean: float,
                 train_s: float, steps: int) -> None:
    """Record the training seconds and steps at which ``mean`` first passes each threshold."""
    for threshold in thresholds:
        if str(threshold) not in reached and mean >= threshold:
            reached[str(threshold)] = {"train_s": train_s, "steps": steps}


def make_callback(env_id: str, seed: int, normalize: bool, args: dict[str, Any]) -> Any:
    """The time-to-reward callback with its own evaluation env (built here, in the child)."""
    from stable_baselines3.common.callbacks import BaseCallback
    from workbench.envs.spec import EnvSpec
    from workbench.envs.vector import make_eval_env
    from workbench.training.callbacks import evaluate

    eval_env = make_eval_env(EnvSpec(env_id, 1, seed=seed, normalize=normalize))

    class TimeToReward(BaseCallback):
        """Evaluates every ``eval_every`` steps with the clock paused; stops when done."""

        def __init__(self) -> None:
            super().__init__()
            self.thresholds = sorted(args["thresholds"])
            self.reached: dict[str, dict[str, float]] = {}
            self.evals: list[dict[str, float]] = []
            self.next_eval = args["eval_every"]
            self.paused = self.rollout_s = 0.0
            self.started = self.rollout_started = 0.0
            self.done = False

        def _on_training_start(self) -> None:
            self.started = time.perf_counter()

        def _on_rollout_start(self) -> None:
            self.rollout_started = time.perf_counter()

        def _on_step(self) -> bool:
            return not self.done

        def _on_rollout_end(self) -> None:
            now = time.perf_counter()
            self.rollout_s += now - self.rollout_started
            train_s = now - self.started - self.paused
            if train_s >= args["budget_s"] or self.num_timesteps >= args["max_steps"]:
                self.done = True
            if self.num_timesteps < self.next_eval and not self.done:
                return
            while self.next_eval <= self.num_timesteps:
                self.next_eval += args["eval_every"]
            mean, _ = evaluate(self.model, self.training_env, eval_env, args["episodes"])
            self.evals.append({"steps": self.num_timesteps, "train_s": round(train_s, 3),
                               "return": round(mean, 2)})
            note_reached(self.reached, self.thresholds, mean, train_s, self.num_timesteps)
            if len(self.reached) == len(self.thresholds):
                self.done = True
            self.paused += time.perf_counter() - now

        def result(self) -> dict[str, Any]:
            train_s = (self.evals[-1]["train_s"] if self.evals else float("nan"))
            steps = self.evals[-1]["steps"] if self.evals else 0
            return {"reached": self.reached, "evals": self.evals, "train_s": train_s,
                    "steps": steps, "rollout_s": self.rollout_s,
                    "fps": steps / train_s if train_s else float("nan")}

    return TimeToReward()


def child(spec: dict[str, Any]) -> None:
    """One contestant, one seed: train until the thresholds or the budget; print JSON."""
    env_id, seed = ENV_IDS[spec["task"]], spec["seed"]
    if spec["contestant"] == "sb3":
        result = bare_sb3(env_id, seed, spec)
    elif spec["contestant"] == "zoo":
        result = zoo_run(spec["task"], seed, spec)
    else:
        result = workbench_run(spec["overrides"], seed, spec)
    result["update_share"] = 1.0 - result.pop("rollout_s") / result["train_s"]
    print(json.dumps(result))


def bare_sb3(env_id: str, seed: int, spec: dict[str, Any]) -> dict[str, Any]:
    """stable-baselines3 at its defaults: the baseline every user starts from."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env(env_id, n_envs=1, seed=seed)
    model = PPO("MlpPolicy", venv, seed=seed, device=spec["device"], verbose=0)
    callback = make_callback(env_id, seed, False, spec)
    model.learn(spec["max_steps"], callback=callback)
    venv.close()
    return callback.result()


def zoo_presets() -> Any:
    """scripts/zoo_presets.py as a module: the task -> zoo entry table lives there."""
    import importlib.util

    path = harness.ROOT / "scripts" / "zoo_presets.py"
    module_spec = importlib.util.spec_from_file_location("zoo_presets", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def zoo_run(task: str, seed: int, spec: dict[str, Any]) -> dict[str, Any]:
    """rl-baselines3-zoo's own ExperimentManager: its model, wrappers and VecNormalize from its
    ``hyperparams/ppo.yml`` entry, trained by ``model.learn`` with the same callback."""
    env_id = ENV_IDS[task]
    zoo_id, manager, model = zoo_presets().zoo_experiment(
        task, env_id, Path(tempfile.mkdtemp(prefix="wb-ttr-zoo-")),
        n_timesteps=spec["max_steps"], seed=seed, device=spec["device"])
    callback = make_callback(env_id, seed, manager.normalize, spec)
    model.learn(spec["max_steps"], callback=[*manager.callbacks, callback])
    venv = model.get_env()
    assert venv is not None
    venv.close()
    return {**callback.result(), "num_envs": manager.n_envs, "zoo_entry": zoo_id}


def workbench_run(overrides: list[str], seed: int, spec: dict[str, Any]) -> dict[str, Any]:
    """A workbench configuration through ``train()`` (tracking and all) into a temp store."""
    import os

    from workbench.training import load_config, train

    store = Path(tempfile.mkdtemp(prefix="wb-ttr-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store / 'mlflow.db'}"
    os.environ["WORKBENCH_EXPERIMENTS"] = str(store)
    cfg = load_config([*overrides, f"seed={seed}", f"total_timesteps={spec['max_steps']}",
                       f"device={spec['device']}", "eval.every_steps=0",
                       "eval.final_episodes=0", "console.progress_bar=false",
                       "console.iteration_lines=false"])
    callback = make_callback(cfg.env.id, seed, cfg.env.normalize, spec)
    train(cfg, callbacks=[callback])
    return {**callback.result(), "num_envs": cfg.env.num_envs}


# --------------------------------------------------------------------------- parent


def contestants(task: str, extra: list[str], only: list[str] | None,
                algos: Sequence[str] = ()) -> dict[str, list[str]]:
    """Name -> workbench overrides (``sb3`` and ``zoo`` have none: they are bare SB3 and
    rl_zoo3); ``only`` keeps the built-in and ``--contestant`` ones named, ``algos`` adds one
    per algorithm."""
    table: dict[str, list[str]] = {"workbench": [f"env={task}"], "sb3": [], "zoo": []}
    for item in extra:
        name, _, overrides = item.partition("=")
        table[name] = [f"env={task}", *split_overrides(overrides)]
    if only:
        table = {name: table[name] for name in only}
    for algo in algos:
        preset = f"zoo_{algo}_{task}"
        zoo = (Path(__file__).resolve().parents[1] / "conf" / "experiment" / f"{preset}.yaml")
        table[algo] = ([f"experiment={preset}"] if zoo.is_file()
                       else [f"env={task}", f"algo={algo}", "env.num_envs=1"])
    return table


def split_overrides(text: str) -> list[str]:
    """``a=1,b=[2,3]`` -> ``["a=1", "b=[2,3]"]``: commas inside brackets stay."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [p for p in [*parts, current] if p]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run every (task, seed, contestant) interleaved; returns all raw results."""
    runs: list[dict[str, Any]] = []
    for task in args.tasks:
        table = contestants(task, args.contestant, args.only, args.algos)
        quick = QUICK_THRESHOLDS.get(task, THRESHOLDS[task][:1])
        thresholds = args.thresholds or (quick if args.quick else THRESHOLDS[task])
        for index, seed in enumerate(args.seeds):
            names = list(table)
            names = names[index % len(names):] + names[:index % len(names)]
            for name in names:
                spec = {"task": task, "seed": seed, "contestant": name,
                        "overrides": table[name], "thresholds": thresholds,
                        "eval_every": args.eval_every, "episodes": args.episodes,
                        "budget_s": args.budget_s, "max_steps": args.max_steps,
                        "device": args.device}
                load = harness.load_line()
                proc = harness.run_child([sys.executable, __file__, "--child", json.dumps(spec)],
                                         timeout_s=args.budget_s * 4 + 600)
                result = {**spec, **harness.last_json(str(proc.pop("stdout"))), **proc,
                          "load_before": load}
                runs.append(result)
                shown = ", ".join(f">= {t:g}: {_seconds(reach_s(result, t))}s"
                                  for t in thresholds)
                print(f"{task} seed {seed} {name:<10} {shown}  (best "
                      f"{best_return(result):.0f}, {result['fps']:.0f} steps/s; {load})",
                      flush=True)
    return {"runs": runs}


def reach_s(run: dict[str, Any], threshold: float) -> float:
    hit = run["reached"].get(str(float(threshold)))
    return hit["train_s"] if hit else math.inf


def rescore(data: dict[str, Any], thresholds: list[float]) -> dict[str, Any]:
    """The same runs, with ``reached`` recomputed from their evaluations for ``thresholds``."""
    runs = []
    for run in data["runs"]:
        reached: dict[str, dict[str, float]] = {}
        for threshold in thresholds:
            hit = next((e for e in run["evals"] if e["return"] >= threshold), None)
            if hit is not None:
                reached[str(float(threshold))] = {"train_s": hit["train_s"],
                                                  "steps": hit["steps"]}
        runs.append({**run, "thresholds": thresholds, "reached": reached})
    return {"runs": runs, "rescored_from": data.get("args", {})}


def best_return(run: dict[str, Any]) -> float:
    return max((e["return"] for e in run["evals"]), default=float("nan"))


def summarize(data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Medians over seeds per (task, contestant) and the ratios to the zoo and SB3."""
    summary: dict[str, Any] = {}
    for task in args.tasks:
        runs = [r for r in data["runs"] if r["task"] == task]
        thresholds = runs[0]["thresholds"]
        names = list(dict.fromkeys(r["contestant"] for r in runs))
        rows, medians = [], {}
        for name in names:
            mine = [r for r in runs if r["contestant"] == name]
            times = [harness.median([reach_s(r, t) for r in mine]) for t in thresholds]
            medians[name] = times
            rows.append([name, len(mine), *[_seconds(t) for t in times],
                         harness.median([best_return(r) for r in mine]),
                         harness.median([r["evals"][-1]["return"] for r in mine]),
                         harness.median([r["steps"] for r in mine]),
                         harness.median([r["fps"] for r in mine]),
                         harness.median([r["update_share"] for r in mine])])
        harness.print_table(
            f"Time to reward, {ENV_IDS[task]}: median training seconds over seeds "
            f"(not reached within {args.budget_s:.0f} s: '>')",
            ["config", "seeds", *[f">= {t:g}" for t in thresholds], "best return",
             "last return", "steps", "steps/s", "update share"], rows)
        ratios: dict[str, list[float]] = {}
        bounds: dict[str, list[float]] = {}
        for base in ("zoo", "sb3"):
            if "workbench" in medians and base in medians:
                pairs = list(zip(medians["workbench"], medians[base], strict=True))
                ratios[f"workbench/{base}"] = [
                    w / b if math.isfinite(b) else float("nan") for w, b in pairs]
                # a baseline that never got there within the budget: the ratio is below
                # workbench time / budget (when the workbench got there)
                bounds[f"workbench/{base}"] = [
                    w / b if math.isfinite(b) else w / args.budget_s for w, b in pairs]
                shown = ", ".join(
                    f">= {t:g}: {_ratio(w, b, args.budget_s)}"
                    for t, (w, b) in zip(thresholds, pairs, strict=True))
                print(f"  workbench / {base} time ratio: {shown}")
        summary[task] = {"thresholds": thresholds, "median_s": medians, "ratios": ratios,
                         "ratio_upper_bounds": bounds, "budget_s": args.budget_s}
    return summary


def _seconds(value: float) -> str:
    return f"{value:.0f}" if math.isfinite(value) else ">"  # not reached within the budget


def _ratio(workbench_s: float, base_s: float, budget_s: float) -> str:
    """The time ratio, or its bound where one side did not get there within the budget."""
    if math.isfinite(workbench_s) and math.isfinite(base_s):
        return f"{workbench_s / base_s:.2f}"
    if math.isfinite(workbench_s):
        return f"< {workbench_s / budget_s:.2f} (baseline not reached within the budget)"
    if math.isfinite(base_s):
        return f"> {budget_s / base_s:.2f} (workbench not reached within the budget)"
    return "n/a (neither reached)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="low threshold, short budget")
    parser.add_argument("--tasks", nargs="+", choices=[*sorted(ENV_IDS), "all"],
                        help="tasks to measure; all: every task of the suite table")
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--thresholds", nargs="+", type=float,
                        help="override the task's thresholds (all tasks)")
    parser.add_argument("--budget-s", type=float, help="training seconds per run at most")
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--eval-every", type=int, help="environment steps between evaluations")
    parser.add_argument("--episodes", type=int, help="deterministic episodes per evaluation")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto (all contestants)")
    parser.add_argument("--contestant", action="append", default=[],
                        metavar="NAME=OVERRIDE,OVERRIDE",
                        help="add a workbench configuration: env=<task> plus these overrides")
    parser.add_argument("--only", nargs="+", help="run only these contestants")
    parser.add_argument("--algos", nargs="+", default=[],
                        choices=["a2c", "sac", "td3", "tqc", "crossq"],
                        help="add one contestant per algorithm: the zoo's tuned values for "
                        "the task (experiment=zoo_<algo>_<task>)")
    parser.add_argument("--rescore", type=Path, metavar="RESULTS_JSON",
                        help="re-read a finished run's evaluation curves at --thresholds")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rescore is not None:
        if not args.rescore.is_file():
            parser.error(f"--rescore {args.rescore}: no such file; give a time_to_reward.json")
        if not args.thresholds:
            parser.error("--rescore needs --thresholds, e.g. --thresholds 500 900")
    quick = args.quick
    defaults = {"tasks": ["halfcheetah"] if quick else ["halfcheetah", "hopper"],
                "seeds": [0] if quick else [0, 1, 2], "budget_s": 12.0 if quick else 900.0,
                "max_steps": 30_000 if quick else 1_000_000,
                "eval_every": 4096 if quick else 10_000, "episodes": 2 if quick else 5}
    if args.tasks and "all" in args.tasks:
        args.tasks = list(ENV_IDS)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return {}
    if args.rescore is not None:
        data = rescore(json.loads(args.rescore.read_text()), args.thresholds)
        recorded = data["rescored_from"]
        args.tasks = list(dict.fromkeys(r["task"] for r in data["runs"]))
        args.budget_s = recorded.get("budget_s", args.budget_s)
        name = "time_to_reward_rescored"
    else:
        print(f"time to reward: tasks {args.tasks}, seeds {args.seeds}, budget "
              f"{args.budget_s:.0f} training s per run, eval every {args.eval_every} steps x "
              f"{args.episodes} episodes; {harness.load_line()}", flush=True)
        data = measure(args)
        name = "time_to_reward"
    data["summary"] = summarize(data, args)
    data["args"] = {**vars(args), "rescore": str(args.rescore) if args.rescore else None}
    path = harness.write_results(name, data)
    print(f"results: {path}  ({harness.load_line()})")
    return data


if __name__ == "__main__":
    main()
