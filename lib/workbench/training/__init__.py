"""Training: ``train(cfg)``, the one path from a validated config to a recorded run.

    trainer.py     train(): validate, prepare, open the run, build, learn, evaluate, save
    start.py       load_config: a training run's config (env checks, resume=)
    resume.py      continuing a run from its last checkpoint
    checkpoint.py  the complete training state, saved and restored exactly
    callbacks.py   timing split, entropy, periodic evaluation, reward components
    progress.py    the console's iteration lines and progress bar
    faults.py      interruption, non-finite updates, freeing the GPU

For notebooks and scripts::

    from workbench.training import load_config, train
    result = train(load_config(["env=hopper", "env.num_envs=4"]))
"""

from workbench.training.start import load_config
from workbench.training.trainer import TrainResult, train

__all__ = ["TrainResult", "load_config", "train"]
