"""A pod's container root, set up inside fresh mount, PID and UTS namespaces: ``python3 -I sandbox.py SPEC.json``.

The kubelet starts this under ``unshare --pid --fork unshare --mount --uts`` (and ``ip netns exec POD`` for the
pod's network); ``exec`` sessions under ``nsenter`` into the pod's PID and network namespaces, then the same. It
builds the container's root from this machine's own top-level directories (the image is not pulled: the container
runs this machine's programs), mounts a fresh /proc for the PID namespace, binds the pod's volumes and /etc/hosts
at their mount paths, hides the kubelet's own directory (every pod's volumes) under an empty one, sets the
hostname, changes root, applies the security context (the host's directories read-only for
``readOnlyRootFilesystem``; the capability bounding set, groups, gid and uid; no_new_privs), changes to the
working directory as that user, and then *becomes* the command, so the container's command is PID 1.
Standard library only; it runs before anything else exists.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

NOT_FOUND, CANNOT_RUN = 127, 126
"""Exit statuses when the command is not found, or cannot be run (like ``sh`` and the kubelet's runtimes)."""
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
WRITABLE = ("proc", "dev")
"""Under the root, what stays writable with a read-only root (as in a container: /dev is its own)."""
OCTAL = re.compile(r"\\([0-7]{3})")
"""How /proc/self/mountinfo escapes a space (``\\040``) and the like in a path."""
SHM = "size=64m,mode=1777,nosuid,nodev"
"""The container's own /dev/shm (what CRI-O gives a pod without an emptyDir there)."""


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _mirror(host: Path, target_dir: Path) -> None:
    """Every entry of this machine's directory ``host`` (but /proc) bound, or linked, at the same place under
    ``target_dir``."""
    for entry in sorted(os.listdir(host)):
        source, target = host / entry, target_dir / entry
        if source == Path("/proc"):
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


def _expose_python(root: Path) -> None:
    """This Python (the "image's": PATH has it first) usable by any user, as an image's is: when a directory above
    its installation is closed to others (``/root`` for a pyenv Python), a tmpfs that others may pass through
    replaces that directory, with just the installation bound in."""
    prefix = Path(sys.base_prefix).resolve()
    closed = next((p for p in reversed(prefix.parents) if not os.stat(p).st_mode & stat.S_IXOTH), None)
    if closed is None:
        return
    _mount("-t", "tmpfs", "-o", "mode=0711,size=1m", "python", str(root / closed.relative_to("/")))
    inside = root / prefix.relative_to("/")
    inside.mkdir(parents=True)
    _mount("--rbind", str(prefix), str(inside))


def _inside(root: Path, path: str) -> Path:
    """Where the container path ``path`` is under ``root``, its symbolic links followed inside the container
    (``/var/run`` -> ``/run``)."""
    current, parts, links = root, list(Path(path).parts[1:]), 0
    while parts:
        candidate = current / parts.pop(0)
        if candidate.is_symlink():
            links += 1
            if links > 40:
                raise SystemExit(f"mount point {path}: too many symbolic links")
            link = Path(os.readlink(candidate))
            current, parts = (root if link.is_absolute() else current), [*link.parts[link.is_absolute():], *parts]
        elif candidate.name == "..":
            current = current.parent if current != root else root
        else:
            current = candidate
    return current


def _bind(root: Path, source: str, path: str, read_only: bool, private: set[Path]) -> None:
    """Bind ``source`` at the container path ``path`` (then make it read-only if asked). A missing mount point is
    made right under the root as is; deeper, the nearest directory above it that exists becomes the container's
    own (a tmpfs holding binds of this machine's entries there, as a container's own /run), so nothing is created
    in this machine's own directories; ``private`` holds those already made so."""
    target = _inside(root, path)
    if not target.exists():
        above = next(p for p in target.parents if p.exists())
        host = Path("/", above.relative_to(root))
        if above != root and above not in private:
            if not host.is_dir():
                raise SystemExit(f"mount point {path} does not exist and fakekube cannot make it")
            _mount("-t", "tmpfs", "-o", "mode=0755,size=1m", "private", str(above))
            _mirror(host, above)
            private.add(above)
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(source).is_dir():
            target.mkdir()
        else:
            target.touch()
    _mount("--bind", source, str(target))
    if read_only:
        _remount_read_only(*[m for m in _mount_points(target) if m[0] == str(target)][-1])  # the newest there


def _mount_points(root: Path) -> list[tuple[str, str]]:
    """(path, per-mount options) of every mount at or under ``root``, parents first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        path = OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
        if path == str(root) or path.startswith(f"{root}/"):
            found.append((path, fields[5]))
    return found


def _read_only(root: Path, writable: set[str]) -> None:
    """Every mount at or under ``root`` read-only but /proc, /dev and the ``writable`` container paths (the pod's
    volumes and /etc/hosts), each keeping its other flags."""
    kept = {str(root / name) for name in WRITABLE} | {str(root / path.lstrip("/")) for path in writable}
    for path, options in _mount_points(root):
        if any(path == k or path.startswith(f"{k}/") for k in kept):
            continue
        _remount_read_only(path, options)


def _remount_read_only(path: str, options: str) -> None:
    """Make the mount at ``path`` read-only, keeping its other flags (in a user namespace, flags such as nosuid
    are locked: a remount that dropped them would be refused)."""
    flags = ",".join("ro" if o == "rw" else o for o in options.split(","))
    _mount("-o", f"remount,bind,{flags}", path)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")


def _become(security: dict[str, Any]) -> None:
    """Drop the capabilities outside the pod's set from the bounding set (a root command gets just those when it
    is executed; a non-root one none), switch groups, gid and uid, and set no_new_privs if asked."""
    keep = set(security["capabilities"])
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for capability in range(last + 1):
        if capability not in keep:
            _prctl(PR_CAPBSET_DROP, capability)
    os.setgroups(security["groups"])
    os.setresgid(security["gid"], security["gid"], security["gid"])
    os.setresuid(security["uid"], security["uid"], security["uid"])
    if security["no_new_privs"]:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)


def _look_up(command: str, path: str) -> str:
    """``command`` found in ``path`` as the runtime finds it (directories the user may not search are passed
    over); FileNotFoundError when it is nowhere."""
    if "/" in command:
        return command
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(2, "executable file not found in $PATH")


def main(spec_path: str) -> None:
    """Build the root described in the spec file, then exec the container's command."""
    spec = json.loads(Path(spec_path).read_text())
    if spec["remove"]:
        Path(spec_path).unlink()
    root, security = Path(spec["root"]), spec["security"]
    root.mkdir(parents=True, exist_ok=True)
    _mount("--bind", str(root), str(root))  # a mount of its own, so that it can be made read-only
    _mirror(Path("/"), root)
    (root / "proc").mkdir(exist_ok=True)
    _mount("-t", "proc", "proc", str(root / "proc"))
    _mount("-t", "tmpfs", "-o", SHM, "shm", str(root / "dev" / "shm"))
    if security["uid"]:
        _expose_python(root)
    private: set[Path] = set()
    for source, path, read_only in spec["mounts"]:
        _bind(root, source, path, read_only, private)
    if security["read_only_root"]:
        _read_only(root, {path for _, path, read_only in spec["mounts"] if not read_only})
    hidden = root / Path(spec["hidden"]).relative_to("/")
    if hidden.is_dir():  # the kubelet's directory (every pod's volumes): an empty one here, after the remounts
        _mount("-t", "tmpfs", "-o", "ro,mode=0755,size=4k", "kubelet", str(hidden))
    socket.sethostname(spec["hostname"])
    os.chroot(root)
    _become(security)
    try:
        os.chdir(spec["workdir"] or "/")  # as the container's user, like runc
    except OSError as exc:
        workdir = spec["workdir"]
        raise SystemExit(f"fakekube: cannot change to the working directory {workdir}: {exc.strerror}") from None
    argv, env = spec["argv"], spec["env"]
    try:
        os.execve(_look_up(argv[0], env.get("PATH", "")), argv, env)  # noqa: S606 - becoming the command is the point
    except OSError as exc:
        print(f"fakekube: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        os._exit(NOT_FOUND if isinstance(exc, FileNotFoundError) else CANNOT_RUN)


if __name__ == "__main__":
    main(sys.argv[1])
