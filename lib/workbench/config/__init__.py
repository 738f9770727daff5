"""Configuration: the typed schema behind ``conf/``, Hydra composition and validation."""

from workbench.config.schema import *  # noqa: F403  (the public API of the config layer)
