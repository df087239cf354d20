"""The launchers a job can start with, and the default one, stated once for the runtime and the CLI.

The default is torchrun: it ships with PyTorch (nothing more to install, no ssh, no hostfile), three of the four
original toolkits' seeds launch with it (001, 003, 004), and a DeepSpeed script runs under it too (DeepSpeed reads
torchrun's RANK/LOCAL_RANK/WORLD_SIZE). ``--launcher deepspeed`` keeps seed 002's launcher.
"""

import re
from importlib.util import find_spec

LAUNCHERS = ("torchrun", "deepspeed")
DEFAULT_LAUNCHER = "torchrun"
LAUNCHABLE = "mlenv-launchable"
"""Marks the JSON line of ``python3 -m mlenv.runtime launchable`` among whatever else a remote shell prints."""
MODULES = {"torchrun": ("torch",), "deepspeed": ("torch", "deepspeed")}
"""What each launcher needs in the Python that starts it (torchrun is torch's; DeepSpeed's runner starts torch)."""
STOPPING = "mlenv: stopping the launcher"
"""Begins the line a node's supervisor writes on its stdout as it begins to stop its launcher (``... with SIGTERM``):
what the launcher says after it is its teardown."""
TEARDOWN = re.compile(r"torch\.distributed\.elastic\.multiprocessing\.api\.SignalException: ")
"""The last line of the traceback torchrun prints when a signal stops it."""


def missing_modules(launcher: str) -> list[str]:
    """The modules ``launcher`` needs that this Python does not have (found, not imported: torch takes seconds)."""
    return [module for module in MODULES[launcher] if find_spec(module) is None]
