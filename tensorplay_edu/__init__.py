"""tensorplay_edu: tensor parallelism you can read line by line and run on a laptop.

Reading order: placement -> mesh -> collectives -> transition (the heart) -> dtensor
-> distribute -> debug (the comm recorder); process_group starts the default group.
The TP API is in parallel/; every extra (launcher/, cluster/, gpu_rules/, lab/, async_tp/,
float8/, viz/) has its own folder.
"""

from .debug import CommDebugMode
from .distribute import distribute_tensor
from .dtensor import DTensor
from .launcher.spawn import RankError, launch, run_from_env
from .mesh import DeviceMesh, init_device_mesh
from .placement import Partial, Placement, Replicate, Shard

__all__ = [
    "CommDebugMode", "DTensor", "DeviceMesh", "Partial", "Placement", "RankError", "Replicate", "Shard",
    "distribute_tensor", "init_device_mesh", "launch", "run_from_env",
]
