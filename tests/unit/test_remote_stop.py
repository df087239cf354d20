"""The remote-side wrapper of cluster and ssh exec: the job stops when the exec session's stdin closes, which is
what happens to `oc exec -i` on the pod when the local side is stopped (fail-fast, Ctrl-C); forwarded secrets
arrive on stdin and reach the job's environment, never its command line."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from mlenv.core.remote import script, secrets_input
from mlenv.errors import UsageError

INPLACE = script()
STOP_ON_STDIN_EOF = script(stop_on_stdin_eof=True)


def _wrapped(directory: Path, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sh", "-c", STOP_ON_STDIN_EOF, "sh", str(directory), *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    return state != "Z"


def test_closing_stdin_stops_the_job(tmp_path: Path) -> None:
    wrapper = _wrapped(tmp_path, "sh", "-c", "echo $$ > job.pid; exec sleep 60")
    pid_file = tmp_path / "job.pid"
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    job = int(pid_file.read_text())
    assert _alive(job)
    assert wrapper.stdin is not None
    wrapper.stdin.close()
    assert wrapper.wait(timeout=10) == 143  # the job's SIGTERM, passed through
    assert not _alive(job)


def test_a_finished_job_returns_its_exit_code_from_its_workspace(tmp_path: Path) -> None:
    wrapper = _wrapped(tmp_path, "sh", "-c", "pwd; exit 3")
    assert wrapper.stdout is not None and wrapper.stdin is not None
    out = wrapper.stdout.read()  # stdin stays open while the job runs, as with `oc exec -i`
    assert wrapper.wait(timeout=10) == 3
    wrapper.stdin.close()
    assert out.decode().strip() == str(tmp_path)


@pytest.mark.parametrize("script", [INPLACE, STOP_ON_STDIN_EOF], ids=["inplace", "stop-on-eof"])
def test_the_shipped_runtime_is_importable(tmp_path: Path, script: str) -> None:
    runtime = tmp_path / ".mlenv" / "mlenv" / "runtime"
    runtime.mkdir(parents=True)
    (runtime.parent / "__init__.py").write_text("")
    (runtime / "__init__.py").write_text("SHIPPED = True\n")
    with subprocess.Popen(["sh", "-c", script, "sh", str(tmp_path), "python3", "-c",
                           "import os, mlenv.runtime as r; print(r.SHIPPED, os.environ['PYTHONPATH'])"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": "/image/site"}) as wrapper:
        assert wrapper.stdout is not None and wrapper.stdin is not None
        out = wrapper.stdout.read()  # the session's stdin stays open while the job runs, as with `oc exec -i`
        assert wrapper.wait(timeout=30) == 0
        wrapper.stdin.close()
    assert out.split() == ["True", f"{tmp_path}/.mlenv:/image/site"]


def test_secrets_arrive_on_stdin_and_reach_only_the_environment(tmp_path: Path) -> None:
    wrapper = script(stop_on_stdin_eof=True, secrets=["HF_TOKEN", "WANDB_API_KEY"])
    job = 'printf "%s\\n%s\\n%s\\n" "$HF_TOKEN" "$WANDB_API_KEY" "$(tr "\\0" " " < /proc/$$/cmdline)"'
    with subprocess.Popen(["sh", "-c", wrapper, "sh", str(tmp_path), "sh", "-c", job], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as process:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(secrets_input(["HF_TOKEN", "WANDB_API_KEY"],
                                          {"HF_TOKEN": "hf_s3cr3t $HOME", "WANDB_API_KEY": "w'a\\n"}).decode())
        process.stdin.flush()
        lines = [process.stdout.readline().rstrip("\n") for _ in range(3)]
        assert process.wait(timeout=10) == 0
        process.stdin.close()
    token, key, cmdline = lines
    assert (token, key) == ("hf_s3cr3t $HOME", "w'a\\n")
    assert "s3cr3t" not in cmdline


def test_a_secret_with_a_line_break_is_refused() -> None:
    with pytest.raises(UsageError, match="line break"):
        secrets_input(["HF_TOKEN"], {"HF_TOKEN": "two\nlines"})
