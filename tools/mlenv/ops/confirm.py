"""Ask before ``clean --delete-data`` deletes volumes, listing exactly what would go. The answer is read from the
terminal itself (/dev/tty), never from stdin: ``echo y | mlenv clean --delete-data`` deletes nothing."""

from __future__ import annotations

import os
from collections.abc import Sequence

from mlenv.core.capabilities import Deploy, Handle
from mlenv.errors import UsageError
from mlenv.ui import info

TERMINAL = "/dev/tty"


def ask(question: str) -> bool:
    """``question [y/N]`` on the controlling terminal; UsageError when there is none."""
    try:
        terminal = os.open(TERMINAL, os.O_RDWR | os.O_NOCTTY)
    except OSError:
        raise UsageError("this asks for confirmation on a terminal and there is none: "
                         "add --yes (YES=1) to go ahead without asking") from None
    try:
        os.write(terminal, f"{question} [y/N]: ".encode())
        answer = b""
        while not answer.endswith(b"\n") and len(answer) < 64:
            chunk = os.read(terminal, 64)
            if not chunk:
                break
            answer += chunk
    finally:
        os.close(terminal)
    return answer.decode(errors="replace").strip().lower() in ("y", "yes")


def confirm_data_deletion(backend: Deploy, handles: Sequence[Handle]) -> bool:
    """List the volumes ``--delete-data`` deletes (of every handle of one deployment) and ask; True to go ahead
    (also when there are none)."""
    volumes = list(dict.fromkeys(volume for handle in handles for volume in backend.data_volumes(handle)))
    name = handles[0].name
    if not volumes:
        info(f"no data volumes of {name}")
        return True
    these = "this volume" if len(volumes) == 1 else f"these {len(volumes)} volumes"
    info(f"--delete-data deletes {these} of {name} and everything stored on {'it' if len(volumes) == 1 else 'them'}:")
    for name in volumes:
        info(f"  {name}")
    return ask("Delete them?")
