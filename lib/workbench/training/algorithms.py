"""The algorithms the training core builds, one entry each: SB3 class, constructor arguments,
the metrics it logs per update and how its run describes itself.

Everything that differs between PPO, A2C, SAC, TD3, TQC and CrossQ lives here, so
``train()``, checkpoints, export and reports ask this registry instead of branching on
``algo.name``. The schemas (keys, defaults, ranges) are :mod:`workbench.config.algorithms`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sb3_contrib import TQC, CrossQ
from stable_baselines3 import A2C, PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.noise import NormalActionNoise
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import VecEnv

from workbench.config import (
    A2CConfig,
    AlgoConfig,
    CrossQConfig,
    OffPolicyConfig,
    OnPolicyConfig,
    PPOConfig,
    SACConfig,
    Schedule,
    TD3Config,
    TQCConfig,
    WorkbenchConfig,
)

ACTIVATIONS = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "elu": torch.nn.ELU}


@dataclass(frozen=True)
class Algorithm:
    """What the training core needs to know about one algorithm."""

    name: str  # algo.name
    label: str  # as people write it: "SAC"
    cls: type[BaseAlgorithm]
    arguments: Callable[[Any], dict[str, Any]]  # the schema -> constructor keyword arguments
    policy_kwargs: Callable[[Any], dict[str, Any]]
    # the train/* keys SB3 logs per update
    metrics: tuple[str, ...]
    # the notebook's three live panels beside the reward: (logger key, title)
    curves: tuple[tuple[str, str], ...]

    @property
    def off_policy(self) -> bool:
        """True for the replay-buffer algorithms (SB3's off-policy base class)."""
        return issubclass(self.cls, OffPolicyAlgorithm)


def scheduled(value: float, schedule: Schedule) -> Any:
    """``value`` itself, or SB3's linear schedule from ``value`` to 0 over training (the zoo's
    ``lin_<value>``: SB3 calls it with the remaining progress, 1 -> 0)."""
    if schedule == Schedule.linear:
        return LinearSchedule(value, 0.0, 1.0)
    return value


def _on_policy(a: OnPolicyConfig) -> dict[str, Any]:
    return {"n_steps": a.n_steps, "gae_lambda": a.gae_lambda, "ent_coef": a.ent_coef,
            "vf_coef": a.vf_coef, "max_grad_norm": a.max_grad_norm,
            "normalize_advantage": a.normalize_advantage, "use_sde": a.use_sde,
            "sde_sample_freq": a.sde_sample_freq}


def _ppo(a: PPOConfig) -> dict[str, Any]:
    return {**_on_policy(a), "batch_size": a.batch_size, "n_epochs": a.n_epochs,
            "clip_range": scheduled(a.clip_range, a.clip_range_schedule),
            "clip_range_vf": a.clip_range_vf, "target_kl": a.target_kl}


def _a2c(a: A2CConfig) -> dict[str, Any]:
    return {**_on_policy(a), "use_rms_prop": a.use_rms_prop, "rms_prop_eps": a.rms_prop_eps}


def _actor_critic_policy(a: OnPolicyConfig) -> dict[str, Any]:
    p = a.policy
    kwargs: dict[str, Any] = {
        "net_arch": {"pi": list(p.pi), "vf": list(p.vf)},
        "activation_fn": ACTIVATIONS[p.activation],
        "log_std_init": p.log_std_init,
        "ortho_init": p.ortho_init,
        "share_features_extractor": p.share_features_extractor,
    }
    if a.use_sde:  # SB3 accepts these only with gSDE
        kwargs.update(full_std=p.full_std, squash_output=p.squash_output, use_expln=p.use_expln)
    return kwargs


def _off_policy(a: OffPolicyConfig) -> dict[str, Any]:
    return {"buffer_size": a.buffer_size, "learning_starts": a.learning_starts,
            "batch_size": a.batch_size, "train_freq": a.train_freq,
            "gradient_steps": a.gradient_steps}


def _coefficient(text: str) -> str | float:
    """SB3's ``ent_coef``/``target_entropy``: ``"auto..."`` as it is, a number as a float."""
    return text if text.startswith("auto") else float(text)


def _sac(a: SACConfig) -> dict[str, Any]:
    return {**_off_policy(a), "tau": a.tau, "ent_coef": _coefficient(a.ent_coef),
            "target_entropy": _coefficient(a.target_entropy),
            "target_update_interval": a.target_update_interval, "use_sde": a.use_sde,
            "sde_sample_freq": a.sde_sample_freq}


def _tqc(a: TQCConfig) -> dict[str, Any]:
    return {**_sac(a), "top_quantiles_to_drop_per_net": a.top_quantiles_to_drop_per_net}


def _td3(a: TD3Config) -> dict[str, Any]:
    return {**_off_policy(a), "tau": a.tau, "policy_delay": a.policy_delay,
            "target_policy_noise": a.target_policy_noise,
            "target_noise_clip": a.target_noise_clip}


def _crossq(a: CrossQConfig) -> dict[str, Any]:
    return {**_off_policy(a), "ent_coef": _coefficient(a.ent_coef),
            "target_entropy": _coefficient(a.target_entropy), "policy_delay": a.policy_delay,
            "use_sde": a.use_sde, "sde_sample_freq": a.sde_sample_freq}


def _q_policy(a: OffPolicyConfig) -> dict[str, Any]:
    p = a.policy  # type: ignore[attr-defined]
    kwargs: dict[str, Any] = {"net_arch": {"pi": list(p.pi), "qf": list(p.qf)},
                              "activation_fn": ACTIVATIONS[p.activation],
                              "n_critics": p.n_critics}
    for key in ("log_std_init", "use_expln", "n_quantiles", "batch_norm", "batch_norm_momentum",
                "batch_norm_eps", "renorm_warmup_steps"):
        if hasattr(p, key):
            kwargs[key] = getattr(p, key)
    return kwargs


_PPO_METRICS = ("train/entropy_loss", "train/policy_gradient_loss", "train/value_loss",
                "train/approx_kl", "train/clip_fraction", "train/explained_variance")
_A2C_METRICS = ("train/entropy_loss", "train/policy_loss", "train/value_loss",
                "train/explained_variance")
_ENTROPY_METRICS = ("train/actor_loss", "train/critic_loss", "train/ent_coef",
                    "train/ent_coef_loss")

_PPO_CURVES = (("train/entropy", "policy entropy"), ("train/clip_fraction", "clip fraction"),
               ("train/approx_kl", "approx KL"))
_A2C_CURVES = (("train/entropy", "policy entropy"), ("train/value_loss", "value loss"),
               ("train/explained_variance", "explained variance"))
_ENTROPY_CURVES = (("train/ent_coef", "entropy coefficient"), ("train/critic_loss", "critic loss"),
                   ("train/actor_loss", "actor loss"))
_TD3_CURVES = (("train/critic_loss", "critic loss"), ("train/actor_loss", "actor loss"),
               ("time/fps", "steps per second"))

REGISTRY: dict[str, Algorithm] = {
    a.name: a for a in (
        Algorithm("ppo", "PPO", PPO, _ppo, _actor_critic_policy, _PPO_METRICS, _PPO_CURVES),
        Algorithm("a2c", "A2C", A2C, _a2c, _actor_critic_policy, _A2C_METRICS, _A2C_CURVES),
        Algorithm("sac", "SAC", SAC, _sac, _q_policy, _ENTROPY_METRICS, _ENTROPY_CURVES),
        Algorithm("td3", "TD3", TD3, _td3, _q_policy, ("train/actor_loss", "train/critic_loss"),
                  _TD3_CURVES),
        Algorithm("tqc", "TQC", TQC, _tqc, _q_policy, _ENTROPY_METRICS, _ENTROPY_CURVES),
        Algorithm("crossq", "CrossQ", CrossQ, _crossq, _q_policy, _ENTROPY_METRICS,
                  _ENTROPY_CURVES),
    )
}


def algorithm(algo: AlgoConfig | str) -> Algorithm:
    """The registry entry of a config's algorithm (or of an ``algo.name``)."""
    return REGISTRY[algo if isinstance(algo, str) else algo.name]


def of_model(model: BaseAlgorithm) -> Algorithm:
    """The registry entry of a built model (its class)."""
    return next(a for a in REGISTRY.values() if type(model) is a.cls)


def build(cfg: WorkbenchConfig, train_env: VecEnv, device: str | None = None) -> BaseAlgorithm:
    """The configured algorithm on ``train_env``, on ``device`` when given (a torch device
    string), else on the configured one; every ``algo.*`` key is one of its constructor's or
    of its ``MlpPolicy``'s arguments."""
    a = cfg.algo
    spec = algorithm(a)
    extra: dict[str, Any] = {}
    if isinstance(a, OffPolicyConfig) and a.action_noise_std is not None:
        n = int(np.prod(train_env.action_space.shape or ()))
        extra["action_noise"] = NormalActionNoise(np.zeros(n), a.action_noise_std * np.ones(n))
    cls: Any = spec.cls  # each constructor takes these (BaseAlgorithm's own signature does not)
    return cls(  # type: ignore[no-any-return]
        "MlpPolicy",
        train_env,
        learning_rate=scheduled(a.learning_rate, a.lr_schedule),
        gamma=a.gamma,
        stats_window_size=a.stats_window_size,
        policy_kwargs=spec.policy_kwargs(a),
        seed=cfg.seed,
        device=device or str(cfg.device),
        verbose=0,
        **spec.arguments(a),
        **extra,
    )


def replay_buffer_bytes(a: OffPolicyConfig, observation_space: Any, action_space: Any) -> int:
    """Memory of SB3's replay buffer for ``buffer_size`` transitions: observations and next
    observations in the observation space's dtype (float64 for MuJoCo), actions in the action
    space's, and float32 rewards, dones and timeouts."""
    obs = int(np.prod(observation_space.shape)) * np.dtype(observation_space.dtype).itemsize
    act = int(np.prod(action_space.shape)) * np.dtype(action_space.dtype).itemsize
    return int(a.buffer_size) * (2 * obs + act + 3 * 4)
