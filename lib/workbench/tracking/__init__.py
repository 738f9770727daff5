"""Tracking: where runs are recorded, and what makes the record complete and truthful.

    store.py           the MLflow store: URI resolution, client, experiments, params, tags
    writer.py          SB3 logger writer: one MLflow ``log_batch`` per PPO iteration
    outbox.py          the run's journal of writes, delivered in the background
    runs.py            heartbeats, reaping dead runs, syncing outboxes
    manifest.py        the environment manifest of every run
    manifest_diff.py   ``manifest diff``: what differs between two runs; the command's parser
    manifest_lock.py   ``manifest lock``: the requirements that recreate a run's environment
    redaction.py       URIs without passwords, secret values masked
    system_metrics.py  MLflow's CPU/memory/GPU sampler for a run, plus GPU temperature/clocks

This layer imports only :mod:`workbench.config` and the base modules.
"""
