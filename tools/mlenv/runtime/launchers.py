"""The launchers a job can start with, and the default one, stated once for the runtime and the CLI.

The default is torchrun: it ships with PyTorch (nothing more to install, no ssh, no hostfile), three of the four
original toolkits' seeds launch with it (001, 003, 004), and a DeepSpeed script runs under it too (DeepSpeed reads
torchrun's RANK/LOCAL_RANK/WORLD_SIZE). ``--launcher deepspeed`` keeps seed 002's launcher.
"""

LAUNCHERS = ("torchrun", "deepspeed")
DEFAULT_LAUNCHER = "torchrun"
