"""Telling an OOM kill from the cgroup's counters (v1 and v2) and from the kernel log."""

from __future__ import annotations

from pathlib import Path

from mlenv.runtime.node.oom import kernel_killed, oom_kills


def cgroup(tmp_path: Path, membership: str, counter: Path, text: str) -> tuple[Path, Path]:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(membership)
    (root / counter).parent.mkdir(parents=True)
    (root / counter).write_text(text)
    return proc, root


def test_cgroup_v2_memory_events(tmp_path: Path) -> None:
    proc, root = cgroup(tmp_path, "0::/kubepods/pod1/c1\n", Path("kubepods/pod1/c1/memory.events"),
                        "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert oom_kills(proc, root) == 2


def test_cgroup_v1_oom_control(tmp_path: Path) -> None:
    proc, root = cgroup(tmp_path, "5:cpu:/\n4:memory:/slurm/uid_0/job_7\n0::/\n",
                        Path("memory/slurm/uid_0/job_7/memory.oom_control"),
                        "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert oom_kills(proc, root) == 1


def test_no_memory_cgroup_is_unknown(tmp_path: Path) -> None:
    proc, root = cgroup(tmp_path, "0::/x\n", Path("elsewhere/memory.events"), "oom_kill 9\n")
    assert oom_kills(proc, root) is None


def test_the_kernel_log_names_the_killed_pid(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,2,-;eth0: link up\n"
                    "3,2,3,-;Out of memory: Killed process 4242 (python) total-vm:1kB, anon-rss:1kB\n")
    assert kernel_killed(4242, kmsg) is True
    assert kernel_killed(424, kmsg) is False
    assert kernel_killed(4242, tmp_path / "unreadable") is False
