"""What ``notebooks/train.ipynb`` calls: parameter checks, live learning curves, the summary.

The notebook stays thin: its first cell holds plain parameter
values that papermill can override, and every other cell is one call into this module or
into ``workbench.config`` / ``workbench.training.trainer``.

Papermill injects overriding values as a new cell right after the ``parameters`` cell and
only *warns* about names the notebook does not declare; it never checks types. The cell
after the parameters therefore calls :func:`check_parameters`, which reads the parameter
cells back from IPython's input history (``In``) and stops the notebook with one line naming
the parameter, the problem and the fix.
"""

from __future__ import annotations

import ast
import io
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import KVWriter

from workbench.config import ConfigError
from workbench.review.diagnostics import Thresholds
from workbench.sweeps.point import point_tags_from_env
from workbench.tracking.store import make_client
from workbench.tracking.writer import LATE_PREFIXES, late_prefixes, numeric_items
from workbench.training import algorithms
from workbench.training.callbacks import reward_component_names
from workbench.training.faults import TrainingInterrupted
from workbench.training.trainer import summary_rows
from workbench.tuning.trial import CHECK_ENV, TrialSession, open_check, open_trial

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from workbench.training.trainer import TrainResult

# The notebook's parameters and their types (the parameters cell must declare exactly these;
# tests/test_notebook.py checks the committed notebook against this table).
PARAMETERS: dict[str, type] = {
    "env": str,  # conf/env option, e.g. hopper
    "num_envs": int,  # env.num_envs
    "n_steps": int,  # algo.n_steps (rollout length per environment); 0: the algorithm's own
    "total_timesteps": int,
    "seed": int,
    "overrides": list,  # any other Hydra override, e.g. ["env.normalize=true"]
    "sweep_id": str,  # set by `workbench sweep`: the sweep this point belongs to
    "parent_run_id": str,  # set by `workbench sweep`: the sweep's parent MLflow run
    "point": str,  # set by `workbench sweep`: the point's name (= its run name)
    "study": str,  # set by `workbench tune`: the Optuna study this trial belongs to
    "trial": int,  # set by `workbench tune`: the trial's number in the study
}
# First line of the notebook's parameters cell, and of the cell papermill injects after it.
PARAMETERS_CELL_MARKER = "# Notebook parameters"
INJECTED_CELL_MARKER = "# Parameters"
DEFAULT_NOTEBOOK = "notebooks/train.ipynb"

# (logger key, panel title) of the live curves: the four signals to watch while PPO trains.
REWARD_CURVE = ("rollout/ep_rew_mean", "episode reward (mean)")
# PPO's panels; other algorithms show their own (training/algorithms.py, Algorithm.curves)
CURVES: tuple[tuple[str, str], ...] = (REWARD_CURVE, *algorithms.algorithm("ppo").curves)
EVAL_KEY = "eval/mean_reward"
COMMANDED_WITH = "|"  # a panel of two keys: achieved, then commanded (dashed)
# The report's diagnostic thresholds, drawn in: a clip fraction near or above 0.3, or an approx
# KL above 0.05, means each update moves the policy too far.
WARNING_LINES = {"train/clip_fraction": Thresholds().clip_fraction_max,
                 "train/approx_kl": Thresholds().approx_kl_max}
# The live figure: 820x460 px, so JupyterLab at 1280 px with its file browser open shows it
# unscaled (833 px of output width), and matplotlib's 10 pt tick labels are 14 px on screen.
CURVES_SIZE_IN = (8.2, 4.6)
CURVES_DPI = 100


class ParameterError(ConfigError):
    """A notebook parameter of the wrong type, an unknown one, or a missing one."""


@dataclass(frozen=True)
class NotebookParameters:
    """The checked parameter values of one notebook execution."""

    env: str
    num_envs: int
    n_steps: int
    total_timesteps: int
    seed: int
    overrides: list[str] = field(default_factory=list)
    sweep_id: str = ""
    parent_run_id: str = ""
    point: str = ""
    study: str = ""
    trial: int = -1
    injected: tuple[str, ...] = field(default=(), compare=False)  # names papermill set

    @property
    def resumes(self) -> bool:
        """True when ``overrides`` continue a stopped run (``resume=<run id>``)."""
        return any(o.split("=", 1)[0].lstrip("+") == "resume" for o in self.overrides)

    def config_overrides(self) -> list[str]:
        """Hydra overrides for ``load_config``; ``overrides`` come last, so they win.

        The tqdm bar, the per-iteration lines and the console's summary table are off here:
        the live curves show the iterations (a bar would fill a papermill-executed notebook
        with carriage-return updates, and 40 lines would follow the figure), and the
        notebook's own summary table shows the same facts as the console's. A resumed run keeps
        its own environment, rollout and seed, so with ``resume=`` the notebook passes only
        its budget (``total_timesteps``) and ``overrides``. ``n_steps=0`` passes no
        ``algo.n_steps``: the off-policy algorithms (``algo=sac`` in ``overrides``) have none.
        """
        run_shape = [] if self.resumes else [
            f"env={self.env}",
            f"env.num_envs={self.num_envs}",
            *([f"algo.n_steps={self.n_steps}"] if self.n_steps > 0 else []),
        ]
        return [
            "console.progress_bar=false", "console.iteration_lines=false",
            "console.summary=false",
            *run_shape,
            f"total_timesteps={self.total_timesteps}",
            *([] if self.resumes else [f"seed={self.seed}"]),
            *self.overrides,
        ]

    def run_tags(self) -> dict[str, str]:
        """The sweep's child-run tags when executed by ``workbench sweep`` (else none), with
        what the executor knows only where the point runs (e.g. ``ray.node_id``)."""
        if not self.sweep_id:
            return {}
        return {**point_tags_from_env(), "sweep_id": self.sweep_id, "sweep.role": "child",
                "sweep.point": self.point}

    def run_info(self, notebook: str) -> dict[str, Any]:
        """The manifest's ``run`` section: notebook path, the parameters papermill injected
        (None when the notebook runs interactively), the Hydra overrides."""
        injected = {name: getattr(self, name) for name in self.injected} or None
        return {
            "notebook": notebook,
            "papermill_parameters": injected,
            "overrides": self.config_overrides(),
        }


def check_parameters(namespace: Mapping[str, Any], history: Sequence[str]) -> NotebookParameters:
    """Check the parameter values in ``namespace`` (the notebook's ``globals()``).

    ``history`` is IPython's ``In``: the parameters cell and the cell papermill injected after
    it are read back from it to find names the notebook does not declare.
    """
    declared, injected = parameter_cell_names(history)
    unknown = [name for name in [*declared, *injected] if name not in PARAMETERS]
    if unknown:
        raise ParameterError(
            f"unknown notebook parameter {unknown[0]!r}: valid parameters are "
            f"{', '.join(PARAMETERS)}; pass any other setting as a Hydra override, e.g. "
            f"-y \"overrides: ['{unknown[0]}=...']\""
        )
    values: dict[str, Any] = {}
    for name, expected in PARAMETERS.items():
        if name not in namespace:
            raise ParameterError(
                f"notebook parameter {name!r} is missing: define it in the parameters cell"
            )
        values[name] = check_type(name, namespace[name], expected)
    return NotebookParameters(**values, injected=tuple(injected))


def check_type(name: str, value: Any, expected: type) -> Any:
    """``value`` if it has the parameter's type; raises :class:`ParameterError` otherwise."""
    # bool is an int subclass, but num_envs=True is a mistake, not a number.
    ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    if ok and expected is list:
        bad = [item for item in value if not isinstance(item, str)]
        if bad:
            raise ParameterError(
                f"notebook parameter {name}={value!r}: every entry must be a string "
                f"(a Hydra override like 'env.normalize=true'), got {bad[0]!r}"
            )
        return list(value)
    if not ok:
        example = {int: "-p num_envs 4", str: "-p env hopper",
                   list: "-y \"overrides: ['env.normalize=true']\""}[expected]
        raise ParameterError(
            f"notebook parameter {name}={value!r}: expected {expected.__name__}, got "
            f"{type(value).__name__} (papermill example: {example})"
        )
    return value


def parameter_cell_names(history: Sequence[str]) -> tuple[list[str], list[str]]:
    """Names assigned by the latest run of the parameters cell, and by the cell papermill
    injected right after it (empty when the notebook runs interactively)."""
    cells = list(history)
    starts = [i for i, source in enumerate(cells) if source.startswith(PARAMETERS_CELL_MARKER)]
    if not starts:
        return [], []  # the parameters cell was never run in this kernel: nothing to compare
    declared = top_level_names(cells[starts[-1]])
    injected: list[str] = []
    for source in cells[starts[-1] + 1:]:
        if not source.startswith(INJECTED_CELL_MARKER):
            break
        injected.extend(n for n in top_level_names(source) if n not in injected)
    return declared, injected


def top_level_names(source: str) -> list[str]:
    """Names bound by top-level assignments in a cell's source."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
        names.extend(t.id for t in targets if isinstance(t, ast.Name))
    return names


def tuning_trial(params: NotebookParameters) -> TrialSession:
    """The tuning trial this execution trains for (``workbench tune`` sets ``study`` and
    ``trial``): its run tags and the callback that reports to it; a run of a study's re-check
    (its kernel environment names the study): the study's clock and budget; empty outside a
    study."""
    if not params.study:
        check = os.environ.get(CHECK_ENV)
        return open_check(check) if check else TrialSession()
    if params.trial < 0:
        raise ParameterError(f"notebook parameter trial={params.trial}: a study's trial needs "
                             "its number (>= 0), e.g. -p trial 3")
    return open_trial(params.study, params.trial)


def notebook_path(namespace: Mapping[str, Any]) -> str:
    """Which notebook runs: set by ``workbench sweep`` (the executed copy), JupyterLab's
    ``__session__``, or the project's ``notebooks/train.ipynb``."""
    return (
        os.environ.get("WORKBENCH_NOTEBOOK")
        or str(namespace.get("__session__") or "")
        or DEFAULT_NOTEBOOK
    )


# --------------------------------------------------------------------------- live curves


class CurveHistory(KVWriter):
    """SB3 logger output that keeps ``(step, value)`` per curve key.

    SB3 records an update's ``train/*`` values one dump late; like ``MlflowWriter`` they are
    dated back to the iteration they belong to, so the notebook and MLflow show the same curve.
    """

    def __init__(self, keys: Sequence[str], on_dump: Callable[[], None] | None = None,
                 late: tuple[str, ...] = LATE_PREFIXES) -> None:
        self.points: dict[str, list[tuple[int, float]]] = {key: [] for key in keys}
        self.on_dump = on_dump
        self.previous_step: int | None = None
        self.late = late  # keys dated back one dump (none for the off-policy algorithms)

    def write(
        self,
        key_values: dict[str, Any],
        key_excluded: dict[str, tuple[str, ...]],
        step: int = 0,
    ) -> None:
        own_keys = False
        for key, value in numeric_items(key_values):
            late = bool(self.late) and key.startswith(self.late)
            own_keys = own_keys or not late
            if key in self.points:
                at = self.previous_step if late and self.previous_step is not None else step
                self.points[key].append((int(at), value))
        if own_keys:
            self.previous_step = step
        if self.on_dump is not None:
            self.on_dump()

    def close(self) -> None:
        """Nothing to release."""


class LiveCurves(BaseCallback):
    """Learning curves that redraw while training: the reward and the algorithm's own three
    (PPO: entropy, clip fraction, approx KL; SAC: entropy coefficient, critic and actor loss).

    In Jupyter the figure is one output updated in place through an IPython display handle
    (at most every ``every_s`` seconds, and once at the end); a papermill-executed notebook
    keeps the final figure. Outside IPython nothing is drawn, the history is still kept.
    """

    def __init__(self, every_s: float = 2.0) -> None:
        super().__init__()
        self.every_s = every_s
        self.curves = CURVES
        self.history = CurveHistory([key for key, _ in CURVES] + [EVAL_KEY], self._maybe_draw)
        self.handle: Any = None
        self.last_draw = 0.0
        self.total = 0

    def _on_training_start(self) -> None:
        algorithm = algorithms.of_model(self.model)
        self.curves = (REWARD_CURVE, *algorithm.curves, *commanded_curves(self.training_env))
        keys = [key for curve in self.curves for key in curve[0].split(COMMANDED_WITH)]
        self.history = CurveHistory([*keys, EVAL_KEY], self._maybe_draw,
                                    late_prefixes(algorithm.off_policy))
        # SB3's Logger keeps its writers in the public ``output_formats`` list.
        self.logger.output_formats.append(self.history)
        self.total = int(self.locals.get("total_timesteps", 0))
        self.handle = display_handle()

    def _on_step(self) -> bool:
        return True

    def _on_training_end(self) -> None:
        self.draw()
        if self.history in self.logger.output_formats:
            self.logger.output_formats.remove(self.history)

    def _maybe_draw(self) -> None:
        if time.monotonic() - self.last_draw >= self.every_s:
            self.draw()

    def final_evaluation(self, result: TrainResult) -> None:
        """Add ``train()``'s final deterministic evaluation (after ``model.learn``, outside
        SB3's logger) as the last point of the evaluation line, and redraw."""
        if result.eval_mean_reward is not None:
            self.history.points[EVAL_KEY].append((result.num_timesteps,
                                                  float(result.eval_mean_reward)))
        self.draw()

    def draw(self) -> None:
        """Render the curves and replace the displayed figure."""
        self.last_draw = time.monotonic()
        if self.handle is None:
            return
        from IPython.display import Image

        self.handle.update(Image(data=render_curves(self.history.points, self.total,
                                                    self.curves)))


def short_errors() -> None:
    """Show the workbench's expected stops as one line instead of a traceback.

    A kernel interrupt (:class:`TrainingInterrupted`, after the "KILLED ... resume with" line)
    and bad input (:class:`ConfigError`: a parameter, an override) are not bugs; a traceback
    through the workbench's internals only hides the line that says what to do. The cell
    still fails (Run All stops, papermill records the error); IPython's ``set_custom_exc`` is
    its own hook for this. Outside IPython nothing changes.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def one_line(shell: Any, etype: type, value: BaseException, tb: Any,
                 tb_offset: int | None = None) -> list[str]:
        prefix = "workbench: error" if isinstance(value, ConfigError) else etype.__name__
        stb = [f"{prefix}: {value}"]
        shell._showtraceback(etype, value, stb)  # as IPython's set_custom_exc example does
        return stb

    shell.set_custom_exc((TrainingInterrupted, ConfigError), one_line)


def display_handle() -> Any:
    """An IPython display handle for a placeholder output, or None outside IPython."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return None
    if get_ipython() is None:
        return None
    return display("learning curves appear after the first logged update", display_id=True)


def commanded_curves(venv: Any) -> list[tuple[str, str]]:
    """A panel per commanded quantity the env tracks (``tracked_quantities`` with
    ``command_<name>`` beside ``<name>``, e.g. the walking duck's speed): achieved and
    commanded, as ``"track/<name>|track/command_<name>"``."""
    tracked = reward_component_names(venv, "tracked_quantities")
    return [(f"track/{name}{COMMANDED_WITH}track/command_{name}", f"{name}: achieved, commanded")
            for name in tracked if f"command_{name}" in tracked]


def render_curves(points: Mapping[str, Sequence[tuple[int, float]]], total: int,
                  curves: Sequence[tuple[str, str]] = CURVES) -> bytes:
    """The four curves as a PNG (matplotlib's object API: no pyplot state, no double display)."""
    buffer = io.BytesIO()
    curves_figure(points, total, curves).savefig(buffer, format="png", dpi=CURVES_DPI)
    return buffer.getvalue()


def curves_figure(points: Mapping[str, Sequence[tuple[int, float]]], total: int,
                  curves: Sequence[tuple[str, str]] = CURVES) -> Figure:
    """The live figure: reward (with the evaluations) and three curves of the algorithm (PPO:
    entropy, clip fraction with its warning line, KL).

    The x-axis spans the budget (``total``) or the last logged step, whichever is further:
    SB3 trains whole rollouts, so the last rollout and the final evaluation can end past
    ``total_timesteps`` (40,960 for 40,000 at 2,048 steps a rollout).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = -(-len(curves) // 2)
    figure = Figure(figsize=(CURVES_SIZE_IN[0], CURVES_SIZE_IN[1] * rows / 2), dpi=CURVES_DPI,
                    layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, 2, sharex=True).ravel()
    last_step = max((step for series in points.values() for step, _ in series), default=0)
    for ax, (panel, title) in zip(axes, curves, strict=False):
        for key, style in zip(panel.split(COMMANDED_WITH), (".-", "--"), strict=False):
            found = points.get(key)
            steps, values = zip(*found, strict=True) if found else ((), ())
            ax.plot(steps, values, style, label=key)
        if COMMANDED_WITH in panel:
            ax.legend(loc="upper left")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if total:
            ax.set_xlim(0, max(total, last_step))
    evals = points.get(EVAL_KEY) or []
    if evals:
        steps, values = zip(*evals, strict=True)
        axes[0].plot(steps, values, "o--", label="eval (deterministic)")
        axes[0].legend(loc="upper left")  # a rising curve ends at the right: keep it clear
    for ax, (key, _) in zip(axes, curves, strict=False):  # more axes than curves: hidden
        if key in WARNING_LINES:
            ax.axhline(WARNING_LINES[key], color="tab:red", linestyle=":", linewidth=1)
    for ax in axes[len(curves):]:
        ax.set_visible(False)
    for ax in axes[-2:]:
        ax.set_xlabel("environment steps")
    return figure


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class SummaryTable:
    """The run's summary as Jupyter shows it: every value in full, left-aligned.

    pandas' HTML table cut each value at ``display.max_colwidth`` (50 characters), which hid
    the artifact location and the export and resume commands of the model and checkpoint
    rows; right-aligned, a value that wraps was hard to read. Plain text (``repr``) where a
    front-end shows no HTML.
    """

    rows: Sequence[tuple[str, object]]

    def _repr_html_(self) -> str:
        cells = "".join(
            f'<tr><th style="text-align: left; white-space: nowrap">{html_text(name)}</th>'
            f'<td style="text-align: left">{html_text(str(value))}</td></tr>'
            for name, value in self.rows)
        return f'<table class="workbench-summary"><tbody>{cells}</tbody></table>'

    def __repr__(self) -> str:
        width = max((len(name) for name, _ in self.rows), default=0)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in self.rows)


def summary_table(result: TrainResult) -> SummaryTable:
    """The run's summary, as the console prints it, for the notebook's last output."""
    return SummaryTable(summary_rows(result))


# --------------------------------------------------------------------------- video


def show_video(result: TrainResult) -> Any:
    """The run's final video (``video/replay.mp4``), embedded so it plays inline and stays in
    the executed notebook (papermill's outputs too); a line saying why when there is none."""
    import base64
    import tempfile
    from pathlib import Path

    from IPython.display import HTML

    if result.video is None:
        return HTML(f"<p>No video: {html_text(result.video_line or 'not recorded')}</p>")
    client = make_client(result.tracking_uri)
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"  # no progress bar in the cell's output
    chosen = key in os.environ
    os.environ.setdefault(key, "false")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(client.download_artifacts(result.run_id, result.video, tmp)).read_bytes()
    finally:
        if not chosen:
            os.environ.pop(key, None)
    encoded = base64.b64encode(data).decode("ascii")
    return HTML(f'<video controls loop muted autoplay playsinline '
                f'src="data:video/mp4;base64,{encoded}"></video>'
                f"<p>{html_text(result.video_line)}</p>")


def html_text(text: str) -> str:
    import html

    return html.escape(text)
