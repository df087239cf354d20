"""Where a supervisor finds its own cgroup (runtime/supervise/reaping.py), from mountinfo and /proc/self/cgroup as the
kernel writes them: hybrid (v1 controllers, v2 unified beside them), pure v2, v1 only, a container's bind mount."""

from __future__ import annotations

from pathlib import Path

from mlenv.runtime.supervise.reaping import Cgroup, hierarchies

HYBRID_MOUNTS = """\
30 23 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
38 30 0:34 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,freezer
"""
HYBRID_CGROUP = """\
6:freezer:/user/ssh
4:cpu,cpuacct:/user.slice
0::/user.slice/user-0.slice/session-3.scope
"""


def test_hybrid_v2_first_then_the_freezer() -> None:
    assert hierarchies(HYBRID_MOUNTS, HYBRID_CGROUP) == [
        Cgroup(Path("/sys/fs/cgroup/unified/user.slice/user-0.slice/session-3.scope"),
               "/user.slice/user-0.slice/session-3.scope", 2),
        Cgroup(Path("/sys/fs/cgroup/freezer/user/ssh"), "/user/ssh", 1)]


def test_pure_v2_at_the_root_of_a_cgroup_namespace() -> None:
    mounts = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw\n"
    assert hierarchies(mounts, "0::/\n") == [Cgroup(Path("/sys/fs/cgroup"), "", 2)]


def test_v1_without_a_freezer_has_none() -> None:
    mounts = "35 30 0:31 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    assert hierarchies(mounts, "8:pids:/\n") == []


def test_a_bind_mounted_subtree_shows_only_what_lies_below_its_root() -> None:
    """A container without its own cgroup namespace: the mount's root is its cgroup, and a mount point with a
    space is written escaped."""
    mounts = "40 30 0:27 /kubepods/pod1/c1 /sys/fs/cgroup\\040x rw - cgroup2 cgroup2 rw\n"
    assert hierarchies(mounts, "0::/kubepods/pod1/c1\n") == [
        Cgroup(Path("/sys/fs/cgroup x"), "/kubepods/pod1/c1", 2)]
    assert hierarchies(mounts, "0::/kubepods/pod2/c9\n") == []
