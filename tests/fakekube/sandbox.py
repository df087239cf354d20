"""A pod's container root, set up inside fresh mount, PID and UTS namespaces: ``python3 -I sandbox.py SPEC.json``.

The kubelet starts this under ``unshare --pid --fork unshare --mount --uts`` (and ``ip netns exec POD`` for the
pod's network); ``exec`` sessions under ``nsenter`` into the pod's PID and network namespaces, then the same. It
builds the container's root from this machine's own top-level directories (the image is not pulled: the container
runs this machine's programs), mounts a fresh /proc for the PID namespace, binds the pod's volumes and /etc/hosts
at their mount paths, sets the hostname, changes root and working directory, and then *becomes* the command, so
the container's command is PID 1. Standard library only; it runs before anything else exists.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

NOT_FOUND, CANNOT_RUN = 127, 126
"""Exit statuses when the command is not found, or cannot be run (like ``sh`` and the kubelet's runtimes)."""


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _mirror_host(root: Path) -> None:
    """Every top-level entry of ``/`` (but /proc) bound, or linked, at the same place under ``root``."""
    for entry in sorted(os.listdir("/")):
        source, target = Path("/", entry), root / entry
        if entry == "proc":
            continue
        if source.is_symlink():
            if not target.is_symlink():
                target.symlink_to(os.readlink(source))
        elif source.is_dir():
            target.mkdir(exist_ok=True)
            _mount("--rbind", str(source), str(target))
        elif source.is_file():
            target.touch()
            _mount("--bind", str(source), str(target))


def _bind(root: Path, source: str, path: str) -> None:
    """Bind ``source`` at the container path ``path``; a missing mount point is made only right under the root
    (so nothing is created in this machine's own directories)."""
    target = root / path.lstrip("/")
    if not target.exists():
        if target.parent != root:
            raise SystemExit(f"mount point {path} does not exist on this machine (fakekube makes them only at /)")
        if Path(source).is_dir():
            target.mkdir()
        else:
            target.touch()
    _mount("--bind", source, str(target))


def main(spec_path: str) -> None:
    """Build the root described in the spec file, then exec the container's command."""
    spec = json.loads(Path(spec_path).read_text())
    if spec["remove"]:
        Path(spec_path).unlink()
    root = Path(spec["root"])
    root.mkdir(parents=True, exist_ok=True)
    _mirror_host(root)
    (root / "proc").mkdir(exist_ok=True)
    _mount("-t", "proc", "proc", str(root / "proc"))
    for source, path in spec["mounts"]:
        _bind(root, source, path)
    socket.sethostname(spec["hostname"])
    os.chroot(root)
    os.chdir(spec["workdir"] or "/")
    argv, env = spec["argv"], spec["env"]
    try:
        os.execvpe(argv[0], argv, env)  # noqa: S606 - becoming the container's command is the point
    except OSError as exc:
        print(f"fakekube: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        os._exit(NOT_FOUND if isinstance(exc, FileNotFoundError) else CANNOT_RUN)


if __name__ == "__main__":
    main(sys.argv[1])
