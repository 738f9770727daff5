"""Environments: gymnasium MuJoCo tasks and the workbench's robots behind SB3's VecEnv.

    vector.py         make_envs / make_eval_env: the training and evaluation VecEnvs
    calibration.py    env.vec_env=auto's rule; workbench calibrate measures the backends
    envpool_vec.py    EnvPool's C++ MuJoCo tasks as an SB3 VecEnv (extra ``fast``)
    guards.py         named worker crashes and NaN/inf checks around every VecEnv
    randomization.py  domain randomization wrappers (noise, delay, physics ranges)
    simstate.py       exact capture/restore of a MuJoCo env copy (for checkpoints)
    cores.py          the cores a run may use and the learner's threads
    mujoco_log.py     MuJoCo's warnings through Python (no MUJOCO_LOG.TXT)
    checks.py         env id, kwargs, randomization and EnvPool checks (exit code 2)
    video.py          rollout videos: off-screen frames of one env copy, MP4 and GIF
    opengl.py         the OpenGL backend MuJoCo may load (MUJOCO_GL), checked on import
    robots/           the workbench's own robots (the mini duck), registered on import

This layer imports only :mod:`workbench.config` and the base modules.
"""

from workbench.envs import opengl

# Before any module of this package imports mujoco: an unloadable MUJOCO_GL backend would make
# that import fail; it becomes "no video" instead (envs/opengl.py).
opengl.check_backend()
