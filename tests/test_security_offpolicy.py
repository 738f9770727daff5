"""An off-policy checkpoint is data too: its replay buffer, variables and RNG states.

A SAC checkpoint carries more than PPO's: the replay buffer (arrays, ``pos``, ``full``), the
torch variables SB3 saves by attribute name (the entropy coefficient) and the action space's
RNG. Each case below is what someone who can write the store could plant, with the
checkpoint's hashes recomputed; each is refused before the run is reopened, in one line
(exit 2), with nothing written and the run still FINISHED (SECURITY.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from workbench import config
from workbench.training.checkpoint import misfit, read_files

from .conftest import TINY, embedded_store
from .support.files import assert_refused_untouched, put_back, rehash
from .trained_run import FinishedRun, store_under

CHECKPOINT = "checkpoints/step-000000000384"  # the SAC run's last checkpoint: pos 192 of 1000


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """A tiny SAC run (2 envs, buffer_size 2000: 1000 rows per env) with its checkpoints."""
    from workbench.training import load_config, train

    experiments, uri = store_under(tmp_path_factory, "sac")
    with embedded_store(experiments):
        result = train(load_config([*TINY, "algo=sac", "tracking.system_metrics=false",
                                    "console.iteration_lines=false",
                                    "checkpoint.every_steps=128", "checkpoint.keep_last=1"]))
    return FinishedRun(experiments, uri, result.run_id)


@pytest.fixture()
def sac_checkpoint(sac_run: FinishedRun, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The SAC run's last checkpoint folder, put back as it was after the test."""
    sac_run.use(monkeypatch)
    with put_back(sac_run.artifacts() / CHECKPOINT) as folder:
        yield folder


def edit_state(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change ``state.json``'s state tree (the arrays stay in arrays.safetensors)."""
    meta = json.loads((folder / "state.json").read_text())
    change(meta["state"])
    (folder / "state.json").write_text(json.dumps(meta))


def edit_array(folder: Path, name: str, value: np.ndarray) -> None:
    """Replace one array of ``arrays.safetensors``."""
    from safetensors.numpy import load_file, save_file

    arrays = load_file(str(folder / "arrays.safetensors"))
    arrays[name] = value
    save_file(arrays, str(folder / "arrays.safetensors"))


def buffer(state: dict[str, Any]) -> dict[str, Any]:
    return state["replay_buffer"]  # type: ignore[no-any-return]


GARBAGE_RNG = {"bit_generator": "PCG64", "state": {"state": -1, "inc": "x"}, "has_uint32": 0,
               "uinteger": 0}
# (what is planted, how, the line's problem)
FORGED: dict[str, tuple[Callable[[Path], None], str]] = {
    "more rows than buffer_size": (
        lambda f: edit_array(f, "/replay_buffer/observations", np.zeros((5000, 2, 17))),
        "replay_buffer/observations is float64 of shape [5000, 2, 17], a buffer filled to pos "
        "192 needs float64 of shape [192, 2, 17]"),
    "observations of the wrong width": (
        lambda f: edit_array(f, "/replay_buffer/next_observations", np.zeros((192, 2, 5))),
        "replay_buffer/next_observations is float64 of shape [192, 2, 5]"),
    "actions of another dtype": (
        lambda f: edit_array(f, "/replay_buffer/actions", np.zeros((192, 2, 6), np.float64)),
        "replay_buffer/actions is float64 of shape [192, 2, 6], a buffer filled to pos 192 "
        "needs float32 of shape [192, 2, 6]"),
    "pos past the buffer": (
        lambda f: edit_state(f, lambda s: buffer(s).update(pos=999999999)),
        "replay_buffer/pos is 999999999, outside 0..999 (the buffer's rows)"),
    "pos negative": (
        lambda f: edit_state(f, lambda s: buffer(s).update(pos=-5)),
        "replay_buffer/pos is -5, outside 0..999"),
    "full as text": (
        lambda f: edit_state(f, lambda s: buffer(s).update(full="yes")),
        "replay_buffer/full is 'yes', not true or false"),
    "full without the rows": (  # SAC would learn from 808 all-zero rows per env
        lambda f: edit_state(f, lambda s: buffer(s).update(full=True)),
        "replay_buffer/observations is float64 of shape [192, 2, 17], a buffer full needs "
        "float64 of shape [1000, 2, 17]"),
    "a variable named by attribute path": (
        lambda f: edit_state(f, lambda s: s["variables"].update(
            {"__class__": {"__array__": "/variables/log_ent_coef", "torch": True}})),
        "variables names '__class__', which the run's model does not save (it saves "
        "log_ent_coef)"),
    "a garbage action-space RNG": (
        lambda f: edit_state(f, lambda s: s.update(action_space_rng=GARBAGE_RNG)),
        "action_space_rng is malformed ("),
    "a garbage global RNG": (
        lambda f: edit_state(f, lambda s: s["rng"].update(python=[3, [1, 2], None])),
        "rng/python is malformed (state vector is the wrong size)"),
}


@pytest.mark.parametrize("case", FORGED)
def test_a_forged_off_policy_checkpoint_is_refused_before_the_run_reopens(
    case: str, sac_run: FinishedRun, sac_checkpoint: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    plant, problem = FORGED[case]
    plant(sac_checkpoint)
    rehash(sac_checkpoint)
    assert_refused_untouched(
        ["train", f"resume={sac_run.run_id}", "total_timesteps=768"], sac_run, capsys,
        f"resume={sac_run.run_id}: checkpoint {CHECKPOINT} does not fit the run's model: "
        f"{problem}")


def test_the_checkpoint_as_training_wrote_it_fits(sac_run: FinishedRun) -> None:
    state, config_yaml = read_files(sac_run.artifacts() / CHECKPOINT)
    assert (state["replay_buffer"]["pos"], state["replay_buffer"]["full"]) == (192, False)
    assert misfit(state, config.from_yaml(config_yaml)) is None
