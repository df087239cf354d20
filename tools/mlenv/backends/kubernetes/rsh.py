"""rsync's remote shell for pods: ``python -m mlenv.backends.kubernetes.rsh CLI NAMESPACE POD COMMAND...``.

rsync runs ``RSH HOST rsync --server ...``; this turns that into ``CLI exec -i -n NAMESPACE POD -c ml-dev --
rsync --server ...`` (newer kubectl needs the ``--``). Standard library only: it starts once per transfer.
"""

from __future__ import annotations

import os
import sys

from mlenv.backends.kubernetes import CONTAINER


def command(argv: list[str]) -> list[str]:
    """The exec command line for ``[CLI, NAMESPACE, POD, COMMAND...]``."""
    if len(argv) < 4:
        raise SystemExit("usage: python -m mlenv.backends.kubernetes.rsh CLI NAMESPACE POD COMMAND...")
    cli, namespace, pod, *remote = argv
    return [cli, "exec", "-i", "-n", namespace, pod, "-c", CONTAINER, "--", *remote]


if __name__ == "__main__":
    argv = command(sys.argv[1:])
    os.execvp(argv[0], argv)  # noqa: S606 - replacing this process with the CLI is the point; no shell
