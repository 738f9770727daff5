"""Optuna's samplers and pruners as ``tune.sampler`` and ``tune.pruner`` name them.

The driver builds the sampler (only it samples); the pruner is built by the driver and, from
the settings stored in the study, by each trial's kernel, which asks it whether to stop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workbench.config import TuneConfig
from workbench.tuning.space import SearchSpace

PRUNER_ATTR = "workbench.pruner"  # study user attr: the pruner's settings for the kernels


def build_sampler(tune: TuneConfig, space: SearchSpace) -> Any:
    """TPE (default; constant liar so parallel workers spread out), random, grid or CMA-ES."""
    import optuna

    name, seed = str(tune.sampler), tune.seed
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    if name == "cmaes":
        # Choices have no CMA-ES encoding: Optuna samples them independently (at random).
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def pruner_settings(tune: TuneConfig) -> dict[str, Any]:
    """The pruner as plain values (stored in the study for the trials' kernels)."""
    return {"name": str(tune.pruner), "startup_trials": tune.startup_trials,
            "warmup_steps": tune.warmup_steps}


def build_pruner(settings: Mapping[str, Any]) -> Any:
    """Median (Optuna's default), successive halving, Hyperband, Wilcoxon or none."""
    import optuna

    name = settings.get("name", "median")
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=int(settings["startup_trials"]),
                                           n_warmup_steps=int(settings["warmup_steps"]))
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    if name == "wilcoxon":
        # Reports are per-seed values (step = the seed's index): a trial stops once it is
        # significantly worse than the best trial on the same seeds. Two-sided, 3 seeds can
        # never reach p < 0.1 (the smallest p of 3 pairs is 0.25); 5 can (0.0625).
        return optuna.pruners.WilcoxonPruner(p_threshold=0.1)
    return optuna.pruners.NopPruner()
