"""Configuration: the typed schema behind ``conf/``, Hydra composition and pure checks.

    schema.py   the dataclasses (one per config group) and their plain-dict forms
    algorithms.py  the ``algo`` group's schemas, one per algorithm (SB3's defaults)
    fields.py   declared ranges and layer sizes of fields, shared enums
    compose.py  conf/config.yaml + overrides -> validated config (``load_config``)
    checks.py   merging into the schema, range and cross-field checks
    derived.py  rollout size, minibatches, iterations, env seeds
    identity.py the seed-free configuration id (tag ``workbench.config_id``)
    errors.py   ``ConfigError``: one line naming the key, the problem and the fix (exit 2)

This layer imports nothing else of the workbench but :mod:`workbench.paths`.
"""

from workbench.config.algorithms import (
    ALGORITHMS,
    A2CConfig,
    AlgoConfig,
    CrossQConfig,
    OffPolicyConfig,
    OnPolicyConfig,
    PolicyConfig,
    PPOConfig,
    SACConfig,
    TD3Config,
    TQCConfig,
)
from workbench.config.checks import (
    MAX_NAME_LENGTH,
    MAX_TAG_VALUE_LENGTH,
    check_names,
    check_values,
    from_yaml,
    validate,
)
from workbench.config.compose import (
    CHOSEN_GROUPS,
    GROUPS,
    SCHEMA_NAME,
    check_overrides,
    compose,
    conf_dir,
    group_options,
    interpolation_sources,
    load_config,
    precheck,
)
from workbench.config.derived import DERIVED_FROM, Derived, derive
from workbench.config.errors import ConfigError
from workbench.config.identity import CONFIG_ID_TAG, config_id
from workbench.config.schema import (
    Activation,
    CheckpointConfig,
    ConsoleConfig,
    Device,
    EnvConfig,
    EvalConfig,
    InitConfig,
    RandomizationConfig,
    RayConfig,
    ReproConfig,
    Schedule,
    SearchConfig,
    SweepConfig,
    SweepExecutor,
    TrackingConfig,
    TuneAggregate,
    TuneConfig,
    TuneObjective,
    TunePruner,
    TuneSampler,
    VecEnvBackend,
    VerifyConfig,
    VideoConfig,
    WorkbenchConfig,
    flatten,
    schema_type,
    to_dict,
    to_yaml,
)

__all__ = [
    "ALGORITHMS", "A2CConfig", "CrossQConfig", "OffPolicyConfig", "OnPolicyConfig", "PPOConfig",
    "SACConfig", "TD3Config", "TQCConfig",
    "CHOSEN_GROUPS", "GROUPS", "SCHEMA_NAME", "Activation", "AlgoConfig", "Device", "Schedule",
    "SweepExecutor",
    "VecEnvBackend", "CheckpointConfig", "CONFIG_ID_TAG", "ConfigError", "ConsoleConfig",
    "DERIVED_FROM", "Derived", "EnvConfig", "EvalConfig", "InitConfig", "PolicyConfig",
    "RandomizationConfig",
    "RayConfig", "ReproConfig", "SearchConfig", "SweepConfig", "TrackingConfig",
    "TuneAggregate", "TuneConfig", "TuneObjective", "TunePruner", "TuneSampler", "VerifyConfig",
    "VideoConfig",
    "WorkbenchConfig",
    "MAX_NAME_LENGTH", "MAX_TAG_VALUE_LENGTH", "check_names",
    "check_overrides", "check_values", "compose", "conf_dir", "config_id", "derive", "flatten",
    "from_yaml",
    "group_options", "interpolation_sources", "load_config", "precheck", "schema_type",
    "to_dict", "to_yaml", "validate",
]
