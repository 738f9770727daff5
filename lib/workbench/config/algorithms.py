"""The ``algo`` group's schemas: one dataclass per algorithm, with stable-baselines3's defaults.

``conf/algo/<option>.yaml`` starts from the schema of its algorithm (``ppo_schema``,
``sac_schema``, ... stored by :mod:`workbench.config.compose`), so a key of one algorithm given
to another (``algo=sac algo.n_epochs=5``) fails at composition with the valid keys named, and
every default is the library's own: SB3's for PPO, A2C, SAC and TD3, sb3-contrib's for TQC and
CrossQ. Keys are named as the libraries' constructor and policy arguments are.

The training side of each algorithm (its SB3 class, metrics, exported actor) is
``workbench.training.algorithms``; this module is pure data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from workbench.config.fields import Activation, Schedule, ranged, sizes


@dataclass
class PolicyConfig:
    """Actor-critic network (SB3 ``policy_kwargs`` of ``MlpPolicy``); SB3's defaults."""

    pi: list[int] = sizes(64, 64, example="[64,64]")  # actor hidden layer sizes
    vf: list[int] = sizes(64, 64, example="[64,64]")  # critic hidden layer sizes
    activation: Activation = Activation.tanh
    # initial log std of the Gaussian action distribution
    log_std_init: float = ranged(0.0, example=-1.0)
    ortho_init: bool = True  # orthogonal weight initialization
    share_features_extractor: bool = True  # actor and critic share the features extractor
    # gSDE only (algo.use_sde): a state-dependent std for every action dimension (else one
    # per dimension), tanh-squashed actions, and exp-ln instead of exp for the std
    full_std: bool = True
    squash_output: bool = False
    use_expln: bool = False


@dataclass
class AlgoConfig:
    """What every algorithm has: its name, optimizer step size and discount."""

    name: str = "ppo"  # the algorithm: ppo, a2c, sac, td3, tqc or crossq
    # Adam's (A2C: RMSprop's) step size (the initial value with a schedule)
    learning_rate: float = ranged(3e-4, 0, above=True, example=3e-4)
    lr_schedule: Schedule = Schedule.constant
    gamma: float = ranged(0.99, 0, 1, example=0.99)  # discount factor
    # episodes averaged in rollout/ep_rew_mean and rollout/ep_len_mean
    stats_window_size: int = ranged(100, 1, example=100)

    @property
    def off_policy(self) -> bool:
        """True for the replay-buffer algorithms (SAC, TD3, TQC, CrossQ)."""
        return isinstance(self, OffPolicyConfig)

    def steps_per_update(self) -> int:
        """Environment steps per env between two updates (PPO/A2C's ``n_steps``, the
        off-policy algorithms' ``train_freq``)."""
        raise NotImplementedError

    def minibatches(self, rollout: int) -> int:
        """Minibatches an update splits ``rollout`` samples into (the default: one, the
        whole rollout, as A2C)."""
        return 1

    def update_steps(self, rollout: int) -> int:
        """Gradient steps one update takes (the default: one per minibatch)."""
        return self.minibatches(rollout)


@dataclass
class OnPolicyConfig(AlgoConfig):
    """Rollout-based actor-critic (PPO, A2C)."""

    # steps per environment per rollout; rollout = num_envs * n_steps
    n_steps: int = ranged(2048, 2, example=2048)
    gae_lambda: float = ranged(0.95, 0, 1, example=0.95)  # GAE's bias/variance trade-off
    ent_coef: float = ranged(0.0, 0, example=0.01)  # entropy bonus in the loss
    vf_coef: float = ranged(0.5, 0, example=0.5)  # value loss weight in the loss
    max_grad_norm: float = ranged(0.5, 0, above=True, example=0.5)  # gradient clipping
    normalize_advantage: bool = True  # standardize advantages per minibatch
    # generalized State-Dependent Exploration instead of unstructured Gaussian noise
    use_sde: bool = False
    # with use_sde: sample a new noise matrix every N steps (-1: only at the rollout's start)
    sde_sample_freq: int = ranged(-1, -1, example=4)
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def steps_per_update(self) -> int:
        return self.n_steps


@dataclass
class PPOConfig(OnPolicyConfig):
    """PPO hyperparameters, named as in stable-baselines3; the defaults are SB3's own."""

    name: str = "ppo"
    batch_size: int = ranged(64, 2, example=64)  # minibatch size
    n_epochs: int = ranged(10, 1, example=10)  # passes over each rollout
    # PPO's clipping of the probability ratio (the initial value with a schedule)
    clip_range: float = ranged(0.2, 0, above=True, example=0.2)
    clip_range_schedule: Schedule = Schedule.constant
    # clipping of the value function's change; None: not clipped
    clip_range_vf: float | None = ranged(None, 0, above=True, example=0.2)
    # stop an update's epochs early above this approximate KL; None: never
    target_kl: float | None = ranged(None, 0, above=True, example=0.02)

    def minibatches(self, rollout: int) -> int:
        return -(-rollout // self.batch_size)

    def update_steps(self, rollout: int) -> int:
        return self.minibatches(rollout) * self.n_epochs


@dataclass
class A2CConfig(OnPolicyConfig):
    """A2C (SB3): one gradient step per rollout of ``n_steps``; SB3's defaults."""

    name: str = "a2c"
    learning_rate: float = ranged(7e-4, 0, above=True, example=7e-4)
    n_steps: int = ranged(5, 1, example=5)
    gae_lambda: float = ranged(1.0, 0, 1, example=1.0)
    normalize_advantage: bool = False
    use_rms_prop: bool = True  # RMSprop (as the A2C paper), else Adam
    rms_prop_eps: float = ranged(1e-5, 0, above=True, example=1e-5)


@dataclass
class QPolicyConfig:
    """Actor and Q-critic networks of an off-policy algorithm (SB3 ``net_arch`` pi/qf)."""

    pi: list[int] = sizes(256, 256, example="[256,256]")  # actor hidden layer sizes
    qf: list[int] = sizes(256, 256, example="[256,256]")  # each critic's hidden layer sizes
    activation: Activation = Activation.relu
    n_critics: int = ranged(2, 1, example=2)  # Q-networks (the minimum is the target)


@dataclass
class SquashedPolicyConfig(QPolicyConfig):
    """A tanh-squashed Gaussian actor (SAC, TQC, CrossQ)."""

    log_std_init: float = ranged(-3.0, example=-3.0)  # initial log std (with use_sde)
    use_expln: bool = False  # with use_sde: expln() instead of exp() keeps the std positive


@dataclass
class TD3PolicyConfig(QPolicyConfig):
    """TD3's deterministic actor and twin critics; SB3's default layers."""

    pi: list[int] = sizes(400, 300, example="[400,300]")
    qf: list[int] = sizes(400, 300, example="[400,300]")


@dataclass
class TQCPolicyConfig(SquashedPolicyConfig):
    """TQC: each critic predicts ``n_quantiles`` quantiles of the return."""

    n_quantiles: int = ranged(25, 1, example=25)


@dataclass
class CrossQPolicyConfig(SquashedPolicyConfig):
    """CrossQ: batch-normalized wide critics and no target network (sb3-contrib's defaults)."""

    qf: list[int] = sizes(1024, 1024, example="[1024,1024]")
    batch_norm: bool = True
    batch_norm_momentum: float = ranged(0.01, 0, 1, example=0.01)
    batch_norm_eps: float = ranged(0.001, 0, above=True, example=0.001)
    # steps before batch renormalization's corrections are fully on
    renorm_warmup_steps: int = ranged(100_000, 0, example=100000)


@dataclass
class OffPolicyConfig(AlgoConfig):
    """Replay-buffer algorithms (SAC, TD3, TQC, CrossQ); SB3's defaults."""

    # transitions the replay buffer holds (all envs together); its memory is checked at start
    buffer_size: int = ranged(1_000_000, 1, example=1000000)
    # env steps of random actions before the first update
    learning_starts: int = ranged(100, 0, example=10000)
    batch_size: int = ranged(256, 1, example=256)  # transitions per gradient step
    # collect train_freq steps per env between updates; with several envs an update follows
    # num_envs * train_freq transitions (SB3's convention)
    train_freq: int = ranged(1, 1, example=1)
    # gradient steps per update (SB3: -1 means as many as transitions collected; write that
    # count instead, e.g. the number of envs)
    gradient_steps: int = ranged(1, 1, example=1)
    # std of Gaussian exploration noise added to actions, a fraction of half the action
    # range; None: none (SAC-style algorithms explore through their entropy)
    action_noise_std: float | None = ranged(None, 0, above=True, example=0.1)

    def steps_per_update(self) -> int:
        return self.train_freq

    def update_steps(self, rollout: int) -> int:
        return self.gradient_steps  # one batch from the buffer each


@dataclass
class SACConfig(OffPolicyConfig):
    """Soft Actor-Critic (SB3)."""

    name: str = "sac"
    tau: float = ranged(0.005, 0, 1, above=True, example=0.005)  # target network update rate
    # entropy coefficient: "auto" (learned, from 1.0), "auto_<init>" (learned from <init>)
    # or a fixed number, e.g. "0.1"
    ent_coef: str = "auto"
    # target entropy of the learned coefficient: "auto" (-action dimensions) or a number
    target_entropy: str = "auto"
    target_update_interval: int = ranged(1, 1, example=1)  # gradient steps per target update
    use_sde: bool = False  # generalized State-Dependent Exploration
    sde_sample_freq: int = ranged(-1, -1, example=4)
    policy: SquashedPolicyConfig = field(default_factory=SquashedPolicyConfig)


@dataclass
class TQCConfig(SACConfig):
    """Truncated Quantile Critics (sb3-contrib): SAC with distributional critics."""

    name: str = "tqc"
    top_quantiles_to_drop_per_net: int = ranged(2, 0, example=2)
    policy: TQCPolicyConfig = field(default_factory=TQCPolicyConfig)  # type: ignore[assignment]


@dataclass
class TD3Config(OffPolicyConfig):
    """Twin Delayed DDPG (SB3): a deterministic actor with exploration noise."""

    name: str = "td3"
    learning_rate: float = ranged(1e-3, 0, above=True, example=1e-3)
    tau: float = ranged(0.005, 0, 1, above=True, example=0.005)
    policy_delay: int = ranged(2, 1, example=2)  # critic updates per actor update
    target_policy_noise: float = ranged(0.2, 0, example=0.2)  # smoothing noise on targets
    target_noise_clip: float = ranged(0.5, 0, example=0.5)
    policy: TD3PolicyConfig = field(default_factory=TD3PolicyConfig)


@dataclass
class CrossQConfig(OffPolicyConfig):
    """CrossQ (sb3-contrib): SAC without target networks, batch-normalized critics."""

    name: str = "crossq"
    learning_rate: float = ranged(1e-3, 0, above=True, example=1e-3)
    ent_coef: str = "auto"  # as SAC's
    target_entropy: str = "auto"  # as SAC's
    policy_delay: int = ranged(3, 1, example=3)  # critic updates per actor update
    use_sde: bool = False  # generalized State-Dependent Exploration, as SAC's
    sde_sample_freq: int = ranged(-1, -1, example=4)
    policy: CrossQPolicyConfig = field(default_factory=CrossQPolicyConfig)


# algo.name -> its schema; conf/algo/<option>.yaml starts from "<name>_schema".
ALGORITHMS: dict[str, type[AlgoConfig]] = {
    "ppo": PPOConfig, "a2c": A2CConfig, "sac": SACConfig, "td3": TD3Config,
    "tqc": TQCConfig, "crossq": CrossQConfig,
}

def algo_schema(name: str) -> type[AlgoConfig]:
    """The schema of ``algo.name``; a :class:`KeyError` names the known algorithms."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise KeyError(f"algo.name={name!r}: unknown algorithm; one of "
                       f"{', '.join(ALGORITHMS)}") from None


def coefficient_problem(value: str, *, auto_init: bool) -> str | None:
    """Why an ``ent_coef`` (``auto_init``: "auto", "auto_<init>" or a positive number) or
    ``target_entropy`` ("auto" or a number) string is not valid, or None when it is."""
    if value == "auto":
        return None
    try:
        number = float(value.removeprefix("auto_") if auto_init else value)
    except ValueError:
        number = math.nan
    if auto_init and not (math.isfinite(number) and number > 0):
        return 'write "auto", "auto_<initial value>" or a positive number, e.g. 0.1'
    if not math.isfinite(number):
        return 'write "auto" or a number, e.g. -3'
    return None
