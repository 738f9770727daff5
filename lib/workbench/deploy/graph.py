"""The deployed graph: raw observation -> deterministic action, as TorchScript and ONNX.

A deployer feeds raw sensor values and wants actuator commands, so the exported graph holds
everything between the two: the run's ``VecNormalize`` observation statistics (the same
float64 formula SB3 uses), the actor network, and the deterministic action as SB3's
``predict(deterministic=True)`` computes it: PPO's and A2C's Gaussian mean clipped to the
action space; SAC's, TQC's and CrossQ's squashed mean (``tanh``) and TD3's actor output, both
in [-1, 1], scaled to the action space.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.distributions import DiagGaussianDistribution

from workbench.config import ConfigError
from workbench.training.model import PolicySource

INPUT_NAME, OUTPUT_NAME = "obs", "action"  # the graph's input and output names

class GaussianMean(torch.nn.Module):
    """PPO's and A2C's deterministic action: features extractor, ``mlp_extractor.policy_net``,
    ``action_net`` (the Gaussian's mean)."""

    squashed = False

    def __init__(self, policy: Any) -> None:
        super().__init__()
        if not isinstance(policy.action_dist, DiagGaussianDistribution) or policy.squash_output:
            raise ConfigError("export supports the Gaussian MlpPolicy of PPO and A2C (no gSDE, "
                              "no squashed outputs); retrain without them")
        self.features = policy.pi_features_extractor
        self.actor = policy.mlp_extractor.policy_net
        self.action_net = policy.action_net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.action_net(self.actor(self.features(x)))  # type: ignore[no-any-return]


class SquashedMean(torch.nn.Module):
    """SAC's, TQC's and CrossQ's deterministic action: the actor's mean through ``tanh``, in
    [-1, 1] (the actor's batch renormalization, CrossQ's, uses its running statistics)."""

    squashed = True

    def __init__(self, policy: Any) -> None:
        super().__init__()
        if policy.actor.use_sde:
            raise ConfigError("export supports SAC-style actors without gSDE; retrain with "
                              "algo.use_sde=false")
        self.actor = policy.actor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, _, _ = self.actor.get_action_dist_params(x)
        return torch.tanh(mean)


class DeterministicActor(torch.nn.Module):
    """TD3's actor: its output (through its final ``tanh``) is the action in [-1, 1]."""

    squashed = True

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.actor = policy.actor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.actor(x)  # type: ignore[no-any-return]


def actor_head(policy: Any) -> torch.nn.Module:
    """The module computing the deterministic action of ``policy``'s algorithm."""
    from stable_baselines3.td3.policies import TD3Policy

    if isinstance(policy, TD3Policy):
        return DeterministicActor(policy)
    if hasattr(policy, "actor") and hasattr(policy.actor, "get_action_dist_params"):
        return SquashedMean(policy)
    return GaussianMean(policy)


class DeployedPolicy(torch.nn.Module):
    """Raw observation -> deterministic action, as one graph.

    ``forward`` is VecNormalize's formula in float64 (``clip((obs - mean) / sqrt(var + eps))``,
    exactly what SB3 computes in numpy), cast to float32 as SB3 does, then the algorithm's
    actor path (:func:`actor_head`), a squashed action scaled from [-1, 1] to the action
    space (SB3's ``unscale_action``), and the clip to the action space that ``predict``
    applies.
    """

    obs_mean: torch.Tensor
    obs_std: torch.Tensor
    action_low: torch.Tensor
    action_high: torch.Tensor

    def __init__(self, source: PolicySource) -> None:
        super().__init__()
        try:
            self.head = actor_head(source.model.policy)
        except ConfigError as exc:
            raise ConfigError(f"{source.origin}: {exc}") from exc
        self.squashed = bool(getattr(self.head, "squashed", False))
        self.actor_dtype = torch.float32  # float16 for the GPU variant
        vecnorm = source.vecnormalize
        self.normalize = vecnorm is not None and bool(vecnorm.norm_obs)
        obs_dim = observation_dim(source)
        mean, std, clip = np.zeros(obs_dim), np.ones(obs_dim), math.inf
        if vecnorm is not None and self.normalize:
            rms: Any = vecnorm.obs_rms  # one RunningMeanStd: Box observations
            mean = np.asarray(rms.mean, dtype=np.float64)
            std = np.sqrt(np.asarray(rms.var, dtype=np.float64) + vecnorm.epsilon)
            clip = float(vecnorm.clip_obs)
        self.clip_obs = clip
        self.register_buffer("obs_mean", torch.as_tensor(mean, dtype=torch.float64))
        self.register_buffer("obs_std", torch.as_tensor(std, dtype=torch.float64))
        space: Any = source.model.action_space
        self.register_buffer("action_low", torch.as_tensor(space.low, dtype=torch.float32))
        self.register_buffer("action_high", torch.as_tensor(space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs
        if self.normalize:
            x = (obs.to(torch.float64) - self.obs_mean) / self.obs_std
            x = torch.clamp(x, -self.clip_obs, self.clip_obs)
        x = x.to(torch.float32).to(self.actor_dtype)
        action = self.head(x).to(torch.float32)
        if self.squashed:
            action = self.action_low + 0.5 * (action + 1.0) * (self.action_high - self.action_low)
        return torch.clamp(action, self.action_low, self.action_high)


def observation_dim(source: PolicySource) -> int:
    """Length of the flat observation vector the graph takes."""
    from gymnasium.spaces import flatdim

    return int(flatdim(source.model.observation_space))


def deployed_policy(source: PolicySource) -> DeployedPolicy:
    """The exportable module of ``source`` in eval mode on the CPU."""
    source.model.policy.set_training_mode(False)
    return DeployedPolicy(source).eval().cpu()


def example_input(obs_dim: int) -> torch.Tensor:
    # Batch 2, not 1: torch.export specializes size-1 dimensions, which would pin the batch.
    return torch.zeros(2, obs_dim, dtype=torch.float32)


def export_torchscript(module: torch.nn.Module, path: Path, obs_dim: int,
                       extra_files: Mapping[str, str] | None = None) -> None:
    """Trace ``module`` to TorchScript (for small MLPs: trace, not script), with
    ``extra_files`` (name -> text, e.g. the contract) stored in the archive.

    torch marks ``torch.jit`` deprecated in favour of ``torch.export``, but TorchScript is
    still what LibTorch C++ controllers load (they read extra files with ``torch::jit::load``'s
    ``ExtraFilesMap``).
    """
    with torch.no_grad():
        traced = torch.jit.trace(module, example_input(obs_dim))
    torch.jit.save(traced, str(path), _extra_files=dict(extra_files or {}))


def export_onnx(module: torch.nn.Module, path: Path, obs_dim: int) -> int:
    """Export ``module`` with torch's dynamo ONNX exporter (needs onnxscript); returns the opset.

    The batch axis is dynamic, the weights are stored inside the file (one self-contained
    ``policy.onnx``), and the opset is the exporter's default, i.e. current for this torch.
    """
    import onnx

    batch = torch.export.Dim("batch")
    with torch.no_grad(), quiet_onnx_exporter():
        torch.onnx.export(
            module,
            (example_input(obs_dim),),
            str(path),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes={"obs": {0: batch}},
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    return max(op.version for op in model.opset_import if op.domain in ("", "ai.onnx"))


@contextlib.contextmanager
def quiet_onnx_exporter() -> Iterator[None]:
    """Silence the exporter's noise that says nothing about this graph: warnings that
    torchvision's detection ops cannot be registered (no torchvision here) and torch-internal
    FutureWarnings. Real export errors still raise."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        registration.setLevel(level)


def onnx_session(path: Path, threads: int = 0) -> Any:
    """An ONNX Runtime CPU session (``threads=1`` for single-observation latency)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
