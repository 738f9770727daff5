"""Tuning: Optuna studies whose trials are executions of notebooks/train.ipynb (``workbench tune``).

    request.py     a tuning request's config checked, no simulator or store (space, objective)
    plan.py        the request checked into a plan (env checks, tracking store, study storage)
    space.py       search.params as dimensions, and a trial's values as overrides
    objectives.py  final return, seconds to a target, area under return vs time; pruner reports
    storage.py     the study's RDB storage (SQLite beside MLflow's, the team PostgreSQL), locks
    methods.py     samplers and pruners by name
    trial.py       the kernel's side: the Optuna trial a training reports to
    executors.py   trials on this machine or on Ray, one submitted at a time
    study.py       the study loop: claim, run, tell; the parent run; the result table
    best.py        the best trial as experiment=tuned/<study>
"""
