"""In-pod runtime: topology, NCCL configuration, job launch and NCCL log checks.

Standard library only: this package is copied into every pod/node and run as
``python3 -m mlenv.runtime <command>`` in whatever image the user brings.
"""
