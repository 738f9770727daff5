"""A study's part of a report (``workbench report --study NAME``): its top trials linked to
their MLflow runs, and Optuna's own matplotlib visualizations of the study: optimization
history, parameter importances, parallel coordinates, slices and the pruner's reports.

The study is read from its RDB storage (:mod:`workbench.tuning.storage`); its trials' runs
are the report's runs (tag ``sweep_id`` = the study), so the ranking, learning curves and
diagnostics of the rest of the report cover them too.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from workbench.config import ConfigError
from workbench.review.figures import plain_text
from workbench.review.records import FigureFile, Section
from workbench.tracking.redaction import redact_uri
from workbench.tuning.objectives import UNITS
from workbench.tuning.storage import PRUNED_AT, RUN_ID, list_studies, open_storage, sqlite_path
from workbench.tuning.trial import OBJECTIVE_ATTR, format_value

TOP = 10  # trials in the table
FIGURE_INCHES = (10.0, 6.0)


def load_study(name: str, url: str) -> Any:
    """The study ``name`` in the storage at ``url``; an unknown one is bad input (nothing
    created: a missing SQLite file is not opened)."""
    import optuna

    path = sqlite_path(url)
    if path is not None and not path.is_file():
        raise ConfigError(f"--study {name}: no study storage {redact_uri(url)}; run "
                          "`workbench tune` first, or set tune.storage=URL")
    names = list_studies(url)
    if name not in names:
        raise ConfigError(f"--study {name}: no such study in {redact_uri(url)}; studies: "
                          f"{', '.join(names) or 'none'}")
    return optuna.load_study(study_name=name, storage=open_storage(url, heartbeat=False))


def study_section(study: Any, run_urls: Mapping[str, str]) -> Section:
    """The study's section: what it optimized, the top trials, the figures."""
    objective = study.user_attrs.get(OBJECTIVE_ATTR, {})
    states = [t.state.name for t in study.trials]
    settings = "".join(f"; {label} {objective[key]:g}{unit}" for key, label, unit in (
        ("target", "target", ""), ("budget_s", "budget", " s")) if objective.get(key) is not None)
    text = (f"Study {study.study_name}: objective {objective.get('name', '?')} "
            f"({study.direction.name.lower()}{settings}), {len(states)} trials: "
            f"{states.count('COMPLETE')} complete, {states.count('PRUNED')} pruned, "
            f"{states.count('FAIL')} failed. The best trial's values train with "
            f"`workbench train experiment=tuned/{study.study_name}`; browse the study with "
            "`optuna-dashboard <storage URL>`.")
    headers, rows = top_trials(study, run_urls, UNITS.get(objective.get("name", ""), ""))
    return Section(f"Study {study.study_name}", text, headers, rows, study_figures(study))


def top_trials(study: Any, run_urls: Mapping[str, str], unit: str
               ) -> tuple[tuple[str, ...], tuple[tuple[str | tuple[str, str], ...], ...]]:
    """The best trials first (complete, then pruned by their last report), at most TOP."""
    from optuna.trial import TrialState

    sign = -1.0 if study.direction.name == "MAXIMIZE" else 1.0

    def key(trial: Any) -> tuple[int, float]:
        value = trial.value if trial.state == TrialState.COMPLETE else last_report(trial)
        ranked = {TrialState.COMPLETE: 0, TrialState.PRUNED: 1}.get(trial.state, 2)
        return ranked, sign * value if value is not None and math.isfinite(value) else math.inf

    rows = []
    for rank, trial in enumerate(sorted(study.trials, key=key)[:TOP], start=1):
        run_id = trial.user_attrs.get(RUN_ID)
        value = trial.value if trial.state == TrialState.COMPLETE else None
        pruned = trial.user_attrs.get(PRUNED_AT)
        rows.append((
            str(rank), str(trial.number), trial.state.name,
            "–" if value is None else f"{value:.4g} {unit}",
            f"report {pruned['report']}" if pruned else "",
            ", ".join(f"{k}={format_value(v)}" for k, v in trial.params.items()),
            (run_id, run_urls[run_id]) if run_id in run_urls else (run_id or "–"),
        ))
    headers = ("#", "trial", "state", "value", "pruned at", "sampled values", "MLflow run")
    return headers, tuple(rows)


def last_report(trial: Any) -> float | None:
    """A pruned trial's last intermediate value."""
    values = trial.intermediate_values
    return values[max(values)] if values else None


def study_figures(study: Any) -> tuple[FigureFile, ...]:
    """Optuna's matplotlib plots of the study; a plot the study cannot draw yet (e.g.
    importances before two complete trials) is left out."""
    from optuna.visualization import matplotlib as plots

    name = study.study_name
    drawn = []
    for slug, title, caption, plot in (
        ("history", "Optimization history", "Each trial's value and the best so far.",
         plots.plot_optimization_history),
        ("importances", "Parameter importances",
         "How much of the value's variance each sampled parameter explains (fANOVA).",
         plots.plot_param_importances),
        ("parallel", "Parallel coordinates", "Every trial's sampled values, coloured by value.",
         plots.plot_parallel_coordinate),
        ("slice", "Slices", "The value against each sampled parameter.", plots.plot_slice),
        ("reports", "Intermediate values", "What each trial reported to the pruner.",
         plots.plot_intermediate_values),
    ):
        png = draw(plot, study)
        if png is not None:
            drawn.append(FigureFile(f"study-{slug}.png", f"Study {name}: {title}", caption, png))
    return tuple(drawn)


def draw(plot: Callable[[Any], Any], study: Any) -> bytes | None:
    """One Optuna plot as PNG bytes (its pyplot figure closed), or None if it cannot draw."""
    import matplotlib.pyplot as plt  # Optuna's plots draw on pyplot figures

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        try:
            axes = plot(study)
        except (ValueError, RuntimeError, ZeroDivisionError):
            return None
    first = axes.ravel()[0] if hasattr(axes, "ravel") else axes
    figure = first.figure
    plain_text(figure)  # a study's choices and names are data: a "$" is no TeX
    if figure.get_size_inches()[0] < FIGURE_INCHES[0]:
        figure.set_size_inches(*FIGURE_INCHES)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def run_url(ui_url: str, experiment_id: str, run_id: str) -> str:
    """A run's page in the MLflow UI."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


