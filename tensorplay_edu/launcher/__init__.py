"""Starting ranks: ``launch`` forks them on this machine (notebooks, tests; spawn.py, and rank.py
inside each rank), ``run_from_env`` runs under torchrun (torchrun.py); a failing rank stops them all
with its traceback (faults.py).

    from tensorplay_edu import launch      # re-exported at the top
"""

from .spawn import RankError, current_device, init_from_env, launch, run_from_env

__all__ = ["launch", "RankError", "run_from_env", "init_from_env", "current_device"]
