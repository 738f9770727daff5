"""Tracking: the MLflow store, the run's outbox, heartbeats, the environment manifest."""

from workbench.tracking.store import *  # noqa: F403  (the public API of the tracking layer)
